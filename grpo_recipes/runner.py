"""The recipe runner: the composition root that GRPO recipes and the SFT warm-up share.

    parse (parsing) -> check the config (checks) -> plan and name the run (checkpoint, tracking) -> data -> check
    the data -> rewards (registry) -> model (models) -> trainer -> train, with complete checkpoints and SIGTERM/SIGINT
    handled (checkpoint, signals) -> save

Everything that can be checked without loading a model is checked first, and all problems are reported together.
What differs between GRPO and the warm-up (its training config, data, trainer and what it does around training)
is a Stage: `Stage` itself is GRPO; sft.py's `WarmupStage` is the warm-up.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate import PartialState
from transformers import AutoTokenizer
from trl import GRPOConfig, get_peft_config

from . import checkpoint, checks, registry, tools, tracking
from .alerts import AlertCallback, AlertConfig, default_detectors, tool_detectors
from .budget import CpuBudget
from .config import RecipeArguments
from .data import load_splits
from .diagnostics import correctness_index
from .errors import ConfigError, RewardFailureRateExceeded
from .evaluate import HeldOutEvalCallback
from .models import prepare_model
from .parsing import parse_recipe_args
from .signals import exit_code
from .tool_templates import ToolTemplateError, prepare_tokenizer
from .trainer import RecipeTrainer, diagnostics_spec

logger = logging.getLogger("grpo_recipes")


class Stage:
    """GRPO. A subclass overrides what another training stage does differently (sft.WarmupStage); one instance
    serves one run, so it may keep state between its hooks."""

    training_cls: type = GRPOConfig

    def load_data(self, recipe: RecipeArguments, training) -> tuple[Any, Any]:
        """-> (training dataset, held-out dataset or None)."""
        return load_splits(recipe)

    def run_label(self, training) -> list[str]:
        """The settings a derived run name shows, after the recipe and model names."""
        eps = f"{training.epsilon:g}" + (f"-{training.epsilon_high:g}" if training.epsilon_high else "")
        return [f"lr{training.learning_rate:g}", f"eps{eps}", f"beta{training.beta:g}", f"seed{training.seed}"]

    def describe(self, run: Run) -> str:
        held_out = len(run.held_out) if run.held_out is not None else 0
        return f"data: {len(run.train)} train rows, {held_out} held-out rows"

    def configure(self, run: Run) -> None:
        """Last settings on the training config once the rewards are compiled."""
        run.training.reward_weights = [s.weight for s in run.recipe.reward_specs]

    def make_trainer(self, run: Run, model_path: str):
        return RecipeTrainer(
            model=model_path,
            reward_funcs=run.funcs,
            args=run.training,
            train_dataset=run.train,
            peft_config=get_peft_config(run.model_args),
            diagnostics=diagnostics_spec(run.recipe, run.training, run.funcs),
            skip_zero_advantage=run.recipe.skip_zero_advantage_batches,
            share_prompt=run.recipe.share_prompt_forward,
            demonstration_field=run.recipe.demonstration_field,
            demonstrate_unsolved=run.recipe.demonstrate_unsolved_groups,
            warmup_steps=run.recipe.demonstration_warmup_steps,
            warmup_lr=run.recipe.demonstration_warmup_learning_rate,
            correctness=(correctness_index([f.__name__ for f in run.funcs], run.recipe.correctness_reward),
                         run.recipe.correctness_threshold),
            **tool_kwargs(run.recipe, model_path),
        )

    def callbacks(self, trainer, run: Run) -> list:
        """The held-out evaluation and the alerts, as configured."""
        recipe, out = run.recipe, []
        if recipe.eval_heldout and run.held_out is not None and len(run.held_out):
            out.append(HeldOutEvalCallback.from_recipe(trainer, recipe, run.held_out, run.funcs,
                                                       run.plan.resume_from))
        if recipe.alerts:
            names = [f.__name__ for f in run.funcs]
            correctness = names[correctness_index(names, recipe.correctness_reward)]
            cfg = AlertConfig.from_recipe(recipe)
            detectors = default_detectors(cfg, names, correctness, recipe.format_reward)
            out.append(AlertCallback(detectors + (tool_detectors(cfg) if recipe.uses_tools else [])))
        return out

    def before_train(self, trainer, run: Run) -> None:
        pass

    def before_save(self, trainer, run: Run) -> None:
        pass

    def after_save(self, trainer, run: Run) -> None:
        pass


@dataclass
class Run:
    """What `prepare` produced: everything a trainer is built from, checked."""

    recipe_name: str
    recipe: RecipeArguments
    training: Any  # GRPOConfig, or the stage's training config
    model_args: Any  # trl.ModelConfig
    train: Any  # datasets.Dataset
    held_out: Any  # datasets.Dataset or None
    funcs: list[registry.CompiledReward]
    plan: checkpoint.RunPlan | None  # None when prepared for evaluation only
    stage: Stage


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


def tool_tokenizer(recipe: RecipeArguments, model_path: str):
    """The tokenizer with the configured tool template and parser: on every start (also from an SFT'd folder or a
    checkpoint), because the parser is an instance attribute that a saved tokenizer does not keep."""
    try:
        return prepare_tokenizer(AutoTokenizer.from_pretrained(model_path), recipe.tool_template)
    except ToolTemplateError as exc:
        raise ConfigError([str(exc)]) from None


def tool_kwargs(recipe: RecipeArguments, model_path: str) -> dict:
    """GRPOTrainer's tool arguments for a run with tools (none otherwise). The template is checked here, right after
    the model is resolved and before its weights load; names and params were checked at start-up (checks.py)."""
    if not recipe.uses_tools:
        return {}
    known = tools.available(recipe.tool_dirs or ())
    return {"processing_class": tool_tokenizer(recipe, model_path),
            "tools": tools.build_tools(recipe.tools, known),
            "environment_factory": tools.build_environment(recipe.environment, tools.environments())}


def default_run_name(recipe_name: str, model_name: str, training, stage: Stage | None = None) -> str:
    model = Path(model_name.rstrip("/")).name
    return "-".join([recipe_name, model, *(stage or Stage()).run_label(training)])


def name_run(recipe_name: str, recipe: RecipeArguments, training, model_args, stage: Stage) -> None:
    """Trackio project, run name and storage folder, unless the config sets them."""
    if training.project == "huggingface":  # TrainingArguments' placeholder: give each recipe its own Trackio project
        training.project = f"grpo-recipes-{recipe_name}"
    if not training.run_name:
        training.run_name = default_run_name(recipe_name, model_args.model_name_or_path, training, stage)
    if recipe.trackio_dir:
        tracking.use_dir(recipe.trackio_dir)


def prepare(recipe_name: str, argv: list[str] | None = None, default_config: Path | None = None,
            stage: type[Stage] = Stage, *, for_training: bool = True) -> Run:
    """Parse and check the config, plan and name the run, load the data, compile the rewards. Loads no model.

    `for_training=False` (`grpo-recipes eval`): nothing will be trained into output_dir, so its checks (checkpoints of
    an earlier run, resume, Trackio history) are skipped and no run is planned (`Run.plan` is None)."""
    stage = stage()
    recipe, training, model_args, _ = parse_recipe_args(argv, default_config, training_cls=stage.training_cls)
    known = registry.available(recipe.reward_dirs or ())
    if recipe.format_reward is None:
        correctness = recipe.correctness_reward or (recipe.reward_specs[0].metric_name if recipe.reward_specs else None)
        recipe.format_reward = registry.default_format_reward(recipe.reward_specs, known, correctness)
        if recipe.format_reward:
            logger.info("format_reward: %s (the configured reward with role 'format')", recipe.format_reward)
    problems = checks.collect(recipe, training, model_args, known, training_output=for_training)
    if problems:
        raise ConfigError(problems)
    if model_args.use_peft and recipe.peft_learning_rate:
        logger.info("use_peft: learning rate %g (peft_learning_rate) instead of %g", recipe.peft_learning_rate,
                    training.learning_rate)
        training.learning_rate = recipe.peft_learning_rate
    # Where training starts (checkpoint, run name to continue); applied by checkpoint.start right before training.
    plan = checkpoint.plan_run(recipe, training) if for_training else None
    name_run(recipe_name, recipe, training, model_args, stage)
    try:
        train, held_out = stage.load_data(recipe, training)
    except (KeyError, ValueError) as exc:
        raise ConfigError([str(exc).strip("'\"")]) from None
    problems = checks.collect(recipe, training, model_args, known, data=(train, held_out), plan=plan)
    if problems:
        raise ConfigError(problems)
    funcs, _ = registry.compile_rewards(
        recipe.reward_specs, known, fault_log=FaultLog(Path(training.output_dir) / "reward_faults.jsonl"),
        max_failure_rate=recipe.max_reward_failure_rate, failure_window=recipe.reward_failure_window,
    )
    run = Run(recipe_name, recipe, training, model_args, train, held_out, funcs, plan, stage)
    stage.configure(run)
    return run


def build_trainer(run: Run):
    """The model (resolved once per machine), the stage's trainer and its callbacks."""
    model_path = prepare_model(run.model_args, run.training, run.recipe.model_cache_dir)
    trainer = run.stage.make_trainer(run, model_path)
    if tracking.enabled(run.training):  # before the stage's callbacks: the run starts before they log at train start
        tracking.attach(trainer, run.recipe.trackio_group)
    for callback in run.stage.callbacks(trainer, run):
        trainer.add_callback(callback)
    return trainer


def main(recipe_name: str, default_config: Path | None = None, argv: list[str] | None = None,
         stage: type[Stage] = Stage) -> int:
    """A recipe's entry point: -> the process exit code (2: bad config, 3: reward failures, 128+N: signal N)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run = prepare(recipe_name, argv, default_config, stage)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logger.info(run.stage.describe(run))
    try:
        trainer = build_trainer(run)
    except ConfigError as exc:  # the checks that need the tokenizer (tool template)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    state = PartialState()  # Accelerate's process state, shared with the trainer's accelerator
    logger.info("processes: %d (%s, %s)", state.num_processes, state.distributed_type.value, state.device)
    code = train_and_save(trainer, run)
    if trainer.accelerator.num_processes > 1:
        exit_without_teardown(code)  # while `trainer` still holds the DDP wrapper: see there
    return code


def _reward_failure(trainer, exc: RewardFailureRateExceeded) -> int:
    print(f"error: {exc}", file=sys.stderr)
    trainer.end()  # finish the trackers now: a distributed run then exits without interpreter teardown
    return 3


def train_and_save(trainer, run: Run) -> int:
    """Train, save and finish the trackers (trainer.end()); -> the process exit code."""
    recipe, training, stage = run.recipe, run.training, run.stage
    if recipe.max_cpu_minutes:
        # First in line: its clock must stop before other callbacks' step-end work (held-out eval) starts.
        trainer.callback_handler.callbacks.insert(0, CpuBudget(recipe.max_cpu_minutes))
    session = checkpoint.start(trainer, run.plan, training)  # checkpoint markers, retention, SIGTERM/SIGINT
    try:
        stage.before_train(trainer, run)
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
    trainer.accelerator.print(f"model saved to {training.output_dir}")
    try:
        stage.after_save(trainer, run)
    except RewardFailureRateExceeded as exc:
        return _reward_failure(trainer, exc)
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
