"""The recipe runner: the composition root every recipe shares.

    resolve the config (config/resolve.py) -> check it (config/checks.py, each stage kind's problems) -> where the run
    starts (state/checkpoint.py) -> data -> check the data -> rewards -> for each stage: model (state/models.py) ->
    the stage's TRL trainer -> train, with complete checkpoints and SIGTERM/SIGINT handled -> save

Everything that can be checked without loading a model is checked first, and all problems are reported together.
What a kind of stage does (its dataset, its TRL trainer, what it does around training) is a stages.base.Stage:
stages/grpo.py, sft.py and distill.py's (by mode). The stages share one output folder, one Trackio run and one step
axis: a stage's steps are counted after the previous stage's last one.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate import PartialState

from ..config import checks
from ..config.resolve import Config, resolve
from ..config.stages import StageSpec
from ..errors import ConfigError, RewardFailureRateExceeded
from ..evaluation.heldout import HeldOutEvalCallback
from ..rewards import registry
from ..stages.base import Stage
from ..stages.distill import DistillStage, distill_stage
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

# The kind of each stage, by the name config/schema.STAGE_CONFIGS gives it (a distill stage's by its mode).
KINDS: dict[str, Callable[[StageSpec], Stage]] = {SFTStage.name: SFTStage, DistillStage.name: distill_stage,
                                                   GRPOStage.name: GRPOStage}


@dataclass
class Run:
    """What `prepare` produced from the resolved config: the data, the compiled rewards and the stages, checked."""

    config: Config
    train: Any  # datasets.Dataset
    held_out: Any  # datasets.Dataset or None
    funcs: list[registry.CompiledReward]
    start: checkpoint.StartPoint | None  # where the last stage starts; None when prepared for evaluation only
    stages: list[Stage]

    @property
    def recipe(self):
        return self.config.recipe

    @property
    def training(self):
        """The last stage's training config (the flat keys)."""
        return self.config.training

    @property
    def model_args(self):
        return self.config.model

    @property
    def stage(self) -> Stage:
        """The last stage: the one the flat keys configure."""
        return self.stages[-1]


def prepare(recipe_name: str | None, argv: list[str] | None = None, default_config: Path | None = None,
            stage: type[Stage] | None = None, *, for_training: bool = True) -> Run:
    """Resolve and check the config, plan where the run starts, load the data, compile the rewards. Loads no model.

    `stage` forces a one-stage run of that kind (tests). `for_training=False` (`grpo-recipes eval`): nothing will be
    trained into output_dir, so its checks (checkpoints of an earlier run, resume, Trackio history) are skipped and no
    start is planned (`Run.start` is None)."""
    config = resolve(argv, default_config, name=recipe_name, stage=stage.name if stage is not None else None)
    stages = [(stage or KINDS[spec.name])(spec) for spec in config.stages]
    problems = [*config.problems, *(m for s in stages for m in s.problems(config)),
                *checks.problems(config, training_output=for_training)]
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))  # a stage may find what the flat keys' checks found
    start = checkpoint.start_point(config.recipe, config.training) if for_training else None
    if config.recipe.trackio_dir:
        tracking.use_dir(config.recipe.trackio_dir)
    try:
        train, held_out = load_splits(config.recipe, config.task)
    except (KeyError, ValueError) as exc:
        raise ConfigError([str(exc).strip("'\"")]) from None
    problems = [*(m for s in stages for m in s.data_problems(config, train)),
                *checks.data_problems(config, train, held_out, start)]
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
    recipe = config.recipe
    funcs, _ = registry.compile_rewards(
        recipe.reward_specs, registry.available(recipe.reward_dirs or ()),
        fault_log=registry.FaultLog(Path(config.training.output_dir) / "reward_faults.jsonl"),
        max_failure_rate=recipe.max_reward_failure_rate, failure_window=recipe.reward_failure_window,
    )
    return Run(config, train, held_out, funcs, start, stages)


def build_trainer(run: Run, stage: Stage | None = None, model: str | None = None):
    """The model (resolved once per machine, or an earlier stage's output), the stage's trainer and its callbacks."""
    stage = stage or run.stage
    training = stage.spec.training
    model_path = model or prepare_model(run.model_args, run.recipe.model_cache_dir)
    trainer = stage.make_trainer(run, model_path)
    if tracking.enabled(training):  # before the stage's callbacks: the run starts before they log at train start
        tracking.attach(trainer, run.recipe.trackio_group, offset=getattr(stage, "offset", 0),
                        correctness=run.recipe.correctness_reward, format_reward=run.recipe.format_reward)
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
    logger.info("stages: %s", " -> ".join(f"{s.name} ({s.spec.training.max_steps} steps)" for s in run.stages))
    budget = CpuBudget(run.recipe.max_cpu_minutes) if run.recipe.max_cpu_minutes else None
    if run.recipe.overwrite_output_dir and state.is_main_process:
        checkpoint.discard_stages(run.training.output_dir)
    offset, carry, model, code, trainer = 0, None, None, 0, None
    for s in run.stages:
        finished = checkpoint.done(s.spec.training.output_dir) if run.recipe.resume and not s.spec.last else None
        if finished:
            logger.info("stage %s: finished at step %d; resuming after it", s.spec.label, finished["global_step"])
            offset, carry, model = finished["global_step"], finished["evaluation"], s.spec.training.output_dir
            continue
        s.offset = offset
        logger.info(s.describe(run))
        try:
            trainer = build_trainer(run, s, model)
        except ConfigError as exc:  # the checks that need the tokenizer (tool template)
            print(f"error: {exc}", file=sys.stderr)
            return 2
        start = start_point(run, s)
        evaluation = attach_evaluation(trainer, run, s, carry, start)
        code = train_and_save(trainer, run, s, budget, start)
        if code != 0 or s.spec.last or budget_spent(budget):
            break
        offset = offset + trainer.state.global_step
        carry = evaluation.carried() if evaluation is not None else None
        if trainer.accelerator.is_main_process:
            checkpoint.mark_done(s.spec.training.output_dir, s.spec.name, s.spec.index, offset, carry)
        trainer.accelerator.wait_for_everyone()
        model = s.spec.training.output_dir
        del trainer, evaluation  # the next stage loads its model from the folder just saved
        gc.collect()
        trainer = None
    if trainer is not None and trainer.accelerator.num_processes > 1:
        exit_without_teardown(code)  # while `trainer` still holds the DDP wrapper: see there
    return code


def budget_spent(budget: CpuBudget | None) -> bool:
    return budget is not None and budget.used_s >= budget.limit_s


def start_point(run: Run, stage: Stage) -> checkpoint.StartPoint:
    """Where a stage starts: the run's start for the last stage (planned at start-up), its own folder's for another."""
    return run.start if stage.spec.last else checkpoint.start_point(run.recipe, stage.spec.training)


def attach_evaluation(trainer, run: Run, stage: Stage, carry: dict | None,
                      start: checkpoint.StartPoint) -> HeldOutEvalCallback | None:
    """The run's held-out evaluation on this stage's trainer: at the run's start, every eval_every_steps and at the
    stage's end, with the last stage's sampling settings."""
    recipe = run.recipe
    if not (recipe.eval_heldout and run.held_out is not None and len(run.held_out)):
        return None
    guarded = tools.recipe_tools(recipe) or None
    callback = HeldOutEvalCallback.from_recipe(trainer, recipe, run.held_out, run.funcs, start.resume_from,
                                               training=run.training, tools=guarded, offset=stage.offset,
                                               carry=carry, stage=stage.name, last=stage.spec.last)
    trainer.add_callback(callback)
    return callback


def _reward_failure(trainer, exc: RewardFailureRateExceeded) -> int:
    print(f"error: {exc}", file=sys.stderr)
    trainer.end()  # finish the trackers now: a distributed run then exits without interpreter teardown
    return 3


def train_and_save(trainer, run: Run, stage: Stage | None = None, budget: CpuBudget | None = None,
                   start: checkpoint.StartPoint | None = None) -> int:
    """Train one stage, save it and finish the trackers (trainer.end()); -> the process exit code."""
    stage = stage or run.stage
    training = stage.spec.training
    if budget is None and run.recipe.max_cpu_minutes:
        budget = CpuBudget(run.recipe.max_cpu_minutes)
    if budget is not None:
        # First in line: its clock must stop before other callbacks' step-end work (held-out eval) starts.
        trainer.callback_handler.callbacks.insert(0, budget)
    start = start or start_point(run, stage)
    start.step_offset = getattr(stage, "offset", 0)
    session = checkpoint.start(trainer, start, training)  # checkpoint markers, retention, SIGTERM/SIGINT
    try:
        with fused_head_on_labels():
            trainer.train(resume_from_checkpoint=str(session.point.resume_from) if session.point.resume_from else None)
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
    if not stage.spec.last and budget_spent(budget):
        trainer.save_model(run.training.output_dir)  # the stages after this one will not run: the run's model
        trainer.accelerator.print(f"max_cpu_minutes spent in stage {stage.spec.label}: the run ends here; model "
                                  f"saved to {run.training.output_dir}")
    elif not stage.spec.last:
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
