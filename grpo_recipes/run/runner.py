"""The recipe runner: the composition root every recipe shares.

    parse (parsing) -> check the config (checks) -> plan the stages (stages) -> plan and name the run (checkpoint,
    tracking) -> data -> check the data -> rewards (registry) -> for each stage: model (models) -> the stage's TRL
    trainer -> train, with complete checkpoints and SIGTERM/SIGINT handled (checkpoint, signals) -> save

Everything that can be checked without loading a model is checked first, and all problems are reported together.
What a kind of stage does (its dataset, its TRL trainer, what it does around training) is a stages.Stage:
grpo_stage.GRPOStage, sft.SFTStage and distill.py's (by mode). stages.py says how the stages share one output folder,
one Trackio run and one step axis.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate import PartialState

from ..config import checks
from ..config import stages as stage_configs
from ..config.parsing import parse_recipe_args
from ..config.schema import RecipeArguments
from ..config.stages import StagePlan
from ..errors import ConfigError, RewardFailureRateExceeded
from ..evaluation.heldout import HeldOutEvalCallback
from ..rewards import registry
from ..stages.base import Stage
from ..stages.distill import distill_stage
from ..stages.grpo import GRPOStage
from ..stages.sft import SFTStage
from ..state import checkpoint, tracking
from ..state.budget import CpuBudget
from ..state.models import prepare_model
from ..state.signals import exit_code
from ..tasks.data import load_splits
from ..tools import registry as tools
from ..trl_internals import fused_head_on_labels

logger = logging.getLogger("grpo_recipes")


@dataclass
class Run:
    """What `prepare` produced: everything the stages' trainers are built from, checked."""

    recipe_name: str
    recipe: RecipeArguments
    training: Any  # the last stage's training config (the flat keys)
    model_args: Any  # trl.ModelConfig
    train: Any  # datasets.Dataset
    held_out: Any  # datasets.Dataset or None
    funcs: list[registry.CompiledReward]
    plan: checkpoint.RunPlan | None  # where the last stage starts; None when prepared for evaluation only
    stages: list[Stage]

    @property
    def stage(self) -> Stage:
        """The last stage: the one the flat keys configure."""
        return self.stages[-1]


class FaultLog:
    """Appends each reward fault (the completion and inputs that made a reward raise) to a JSONL file."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, record: dict) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


STAGE_KINDS: dict[str, Callable[[StagePlan], Stage]] = {"sft": SFTStage, "distill": distill_stage, "grpo": GRPOStage}


def default_run_name(recipe_name: str, model_name: str, training, stage: Stage | None = None) -> str:
    model = Path(model_name.rstrip("/")).name
    return "-".join([recipe_name, model, *(stage or GRPOStage()).run_label(training)])


def name_run(recipe_name: str, recipe: RecipeArguments, training, model_args, stage: Stage) -> None:
    """Trackio project, run name and storage folder, unless the config sets them."""
    if training.project == "huggingface":  # TrainingArguments' placeholder: give each recipe its own Trackio project
        training.project = f"grpo-recipes-{recipe_name}"
    if not training.run_name:
        training.run_name = default_run_name(recipe_name, model_args.model_name_or_path, training, stage)
    if recipe.trackio_dir:
        tracking.use_dir(recipe.trackio_dir)


def prepare(recipe_name: str | None, argv: list[str] | None = None, default_config: Path | None = None,
            stage: type[Stage] | None = None, *, for_training: bool = True) -> Run:
    """Parse and check the config, plan the stages and the run, load the data, compile the rewards. Loads no model.

    `stage` forces a one-stage run of that kind (tests). `for_training=False` (`grpo-recipes eval`): nothing will be
    trained into output_dir, so its checks (checkpoints of an earlier run, resume, Trackio history) are skipped and no
    run is planned (`Run.plan` is None)."""
    training_cls = stage_configs.CONFIGS[stage.name] if stage is not None else None
    recipe, training, model_args, config_path = parse_recipe_args(argv, default_config, training_cls=training_cls)
    if recipe_name is None:  # recipes/train.py: any config, named after its task
        if config_path is None:
            raise ConfigError(["--config: recipes/train.py runs the config you name; pass --config my_task.yaml"])
        recipe_name = recipe.task or config_path.stem
    if stage is not None:
        recipe.stages = [{"name": stage.name}]
    known = registry.available(recipe.reward_dirs or ())
    if recipe.format_reward is None:
        correctness = recipe.correctness_reward or (recipe.reward_specs[0].metric_name if recipe.reward_specs else None)
        recipe.format_reward = registry.default_format_reward(recipe.reward_specs, known, correctness)
        if recipe.format_reward:
            logger.info("format_reward: %s (the configured reward with role 'format')", recipe.format_reward)
    plans, problems = stage_configs.plan_stages(recipe, training)
    run_stages = [(stage or STAGE_KINDS[p.name])(p) for p in plans]
    problems += [m for s in run_stages for m in s.problems(recipe, model_args)]
    problems += checks.collect(recipe, training, model_args, known, training_output=for_training)
    for p in plans[:-1]:
        if p.name == "sft":
            problems += [f"stages[{p.index}] ({p.name}): {m}" for m in checks.stage_problems(recipe, p.training)]
    if problems:
        raise ConfigError(problems)
    if model_args.use_peft and recipe.peft_learning_rate:
        logger.info("use_peft: learning rate %g (peft_learning_rate) instead of %g", recipe.peft_learning_rate,
                    training.learning_rate)
        training.learning_rate = recipe.peft_learning_rate
    # Where the run starts (checkpoint, run name to continue); applied by checkpoint.start right before training.
    plan = checkpoint.plan_run(recipe, training) if for_training else None
    name_run(recipe_name, recipe, training, model_args, run_stages[-1])
    stage_configs.name_stages(plans, training)
    try:
        train, held_out = load_splits(recipe)
    except (KeyError, ValueError) as exc:
        raise ConfigError([str(exc).strip("'\"")]) from None
    problems = checks.collect(recipe, training, model_args, known, data=(train, held_out), plan=plan)
    problems += [m for s in run_stages for m in s.data_problems(recipe, train)]
    for p in plans[:-1]:
        if p.name == "sft":
            problems += [f"stages[{p.index}] ({p.name}): {m}" for m in checks.stage_problems(recipe, p.training, train)]
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))  # a stage may find what the flat keys' checks found
    funcs, _ = registry.compile_rewards(
        recipe.reward_specs, known, fault_log=FaultLog(Path(training.output_dir) / "reward_faults.jsonl"),
        max_failure_rate=recipe.max_reward_failure_rate, failure_window=recipe.reward_failure_window,
    )
    run = Run(recipe_name, recipe, training, model_args, train, held_out, funcs, plan, run_stages)
    for s in run_stages:
        s.configure(run)
    return run


def build_trainer(run: Run, stage: Stage | None = None, model: str | None = None):
    """The model (resolved once per machine, or an earlier stage's output), the stage's trainer and its callbacks."""
    stage = stage or run.stage
    training = stage.plan.training
    model_path = model or prepare_model(run.model_args, training, run.recipe.model_cache_dir)
    trainer = stage.make_trainer(run, model_path)
    if tracking.enabled(training):  # before the stage's callbacks: the run starts before they log at train start
        tracking.attach(trainer, run.recipe.trackio_group, offset=getattr(stage, "offset", 0))
    for callback in stage.callbacks(trainer, run):
        trainer.add_callback(callback)
    return trainer


def main(recipe_name: str | None, default_config: Path | None = None, argv: list[str] | None = None,
         stage: type[Stage] | None = None) -> int:
    """A recipe's entry point: -> the process exit code (2: bad config, 3: reward failures, 128+N: signal N).
    `recipe_name` None: the config's task names the run (recipes/train.py)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run = prepare(recipe_name, argv, default_config, stage)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    state = PartialState()  # Accelerate's process state, shared with the trainers' accelerators
    logger.info("processes: %d (%s, %s)", state.num_processes, state.distributed_type.value, state.device)
    logger.info("stages: %s", " -> ".join(f"{s.name} ({s.plan.training.max_steps} steps)" for s in run.stages))
    budget = CpuBudget(run.recipe.max_cpu_minutes) if run.recipe.max_cpu_minutes else None
    if run.recipe.overwrite_output_dir and state.is_main_process:
        checkpoint.discard_stages(run.training.output_dir)
    offset, carry, model, code, trainer = 0, None, None, 0, None
    for s in run.stages:
        finished = checkpoint.done(s.plan.training.output_dir) if run.recipe.resume and not s.plan.last else None
        if finished:
            logger.info("stage %s: finished at step %d; resuming after it", s.plan.label, finished["global_step"])
            offset, carry, model = finished["global_step"], finished["evaluation"], s.plan.training.output_dir
            continue
        s.offset = offset
        logger.info(s.describe(run))
        try:
            trainer = build_trainer(run, s, model)
        except ConfigError as exc:  # the checks that need the tokenizer (tool template)
            print(f"error: {exc}", file=sys.stderr)
            return 2
        plan = stage_plan(run, s)
        evaluation = attach_evaluation(trainer, run, s, carry, plan)
        code = train_and_save(trainer, run, s, budget, plan)
        if code != 0 or s.plan.last or budget_spent(budget):
            break
        offset = offset + trainer.state.global_step
        carry = evaluation.carried() if evaluation is not None else None
        if trainer.accelerator.is_main_process:
            checkpoint.mark_done(s.plan.training.output_dir, s.plan.name, s.plan.index, offset, carry)
        trainer.accelerator.wait_for_everyone()
        model = s.plan.training.output_dir
        del trainer, evaluation  # the next stage loads its model from the folder just saved
        gc.collect()
        trainer = None
    if trainer is not None and trainer.accelerator.num_processes > 1:
        exit_without_teardown(code)  # while `trainer` still holds the DDP wrapper: see there
    return code


def budget_spent(budget: CpuBudget | None) -> bool:
    return budget is not None and budget.used_s >= budget.limit_s


def stage_plan(run: Run, stage: Stage) -> checkpoint.RunPlan:
    """Where a stage starts: the run's plan for the last stage (made at start-up), its own folder's for another."""
    return run.plan if stage.plan.last else checkpoint.plan_run(run.recipe, stage.plan.training)


def attach_evaluation(trainer, run: Run, stage: Stage, carry: dict | None,
                      plan: checkpoint.RunPlan) -> HeldOutEvalCallback | None:
    """The run's held-out evaluation on this stage's trainer: at the run's start, every eval_every_steps and at the
    stage's end, with the last stage's sampling settings."""
    recipe = run.recipe
    if not (recipe.eval_heldout and run.held_out is not None and len(run.held_out)):
        return None
    guarded = tools.build_tools(recipe.tools, tools.available(recipe.tool_dirs or ())) if recipe.tools else None
    callback = HeldOutEvalCallback.from_recipe(trainer, recipe, run.held_out, run.funcs, plan.resume_from,
                                               training=run.training, tools=guarded, offset=stage.offset,
                                               carry=carry, stage=stage.name, last=stage.plan.last)
    trainer.add_callback(callback)
    return callback


def _reward_failure(trainer, exc: RewardFailureRateExceeded) -> int:
    print(f"error: {exc}", file=sys.stderr)
    trainer.end()  # finish the trackers now: a distributed run then exits without interpreter teardown
    return 3


def train_and_save(trainer, run: Run, stage: Stage | None = None, budget: CpuBudget | None = None,
                   plan: checkpoint.RunPlan | None = None) -> int:
    """Train one stage, save it and finish the trackers (trainer.end()); -> the process exit code."""
    stage = stage or run.stage
    training = stage.plan.training
    if budget is None and run.recipe.max_cpu_minutes:
        budget = CpuBudget(run.recipe.max_cpu_minutes)
    if budget is not None:
        # First in line: its clock must stop before other callbacks' step-end work (held-out eval) starts.
        trainer.callback_handler.callbacks.insert(0, budget)
    plan = plan or stage_plan(run, stage)
    plan.step_offset = getattr(stage, "offset", 0)
    session = checkpoint.start(trainer, plan, training)  # checkpoint markers, retention, SIGTERM/SIGINT
    try:
        with fused_head_on_labels():
            trainer.train(resume_from_checkpoint=str(session.plan.resume_from) if session.plan.resume_from else None)
    except RewardFailureRateExceeded as exc:
        return _reward_failure(trainer, exc)
    finally:
        session.close()
    if session.interrupted:  # a checkpoint was saved; the final model is not (the run is not finished)
        trainer.accelerator.print(session.message())
        trainer.end()
        return exit_code(session.interrupted)
    stage.before_save(trainer, run)
    trainer.save_model(training.output_dir)
    trainer.accelerator.print(f"{stage.name} stage: model saved to {training.output_dir}")
    if not stage.plan.last and budget_spent(budget):
        trainer.save_model(run.training.output_dir)  # the stages after this one will not run: the run's model
        trainer.accelerator.print(f"max_cpu_minutes spent in stage {stage.plan.label}: the run ends here; model "
                                  f"saved to {run.training.output_dir}")
    elif not stage.plan.last:
        return 0  # the run goes on: its trackers and process group stay (trainer.end() would destroy the group)
    trainer.end()
    return 0


def exit_without_teardown(code: int) -> None:
    """End a distributed run with `code` without running torch.distributed's destructors.

    trainer.end() has already saved everything and finished the trackers, and removed the process group from
    torch's registry, so DDP's Reducer now holds the group's last reference. Freeing it (when the trainer goes out of
    scope, or at interpreter exit) joins gloo's worker threads while holding the GIL, and a worker that is still
    freeing a finished collective's tensors waits for that GIL: a deadlock (py-spy: ~Reducer -> ~ProcessGroupGloo ->
    thread::join vs ~AsyncAllgatherWork -> gil_scoped_acquire) that hung one two-process CPU run in a few after
    training had finished. Nothing is left to write, so the OS frees the rest."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
