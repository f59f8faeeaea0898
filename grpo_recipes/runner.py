"""The recipe runner: config -> checks -> data -> rewards -> model -> GRPOTrainer -> train -> save.

Everything that can be checked without loading a model is checked first, and all problems are reported together.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path

from . import checkpoint, registry
from .budget import CpuBudget
from .config import ConfigError, RecipeArguments, default_run_name, parse_recipe_args
from .data import check_data_args, load_splits
from .validate import data_problems, report_warnings, static_checks

logger = logging.getLogger("grpo_recipes")


def static_problems(recipe: RecipeArguments, grpo, known: dict) -> list[str]:
    """Problems visible from the config alone: no data, no model."""
    from .diagnostics import config_problems

    problems = check_data_args(recipe)
    problems += registry.check_specs(recipe.reward_specs, known, columns=None)
    problems += config_problems(recipe)
    errors, warnings = static_checks(recipe, grpo)  # ranges, output dir vs resume, vLLM (grpo_recipes/validate.py)
    report_warnings(warnings)
    problems += errors
    return problems


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


def prepare(recipe_name: str, argv: list[str] | None = None, default_config: Path | None = None):
    """Parse and check the config, load data, compile rewards. Loads no model."""
    recipe, grpo, model_args, config_path = parse_recipe_args(argv, default_config)
    known = registry.available(recipe.reward_dirs or ())
    if recipe.format_reward is None:
        correctness = recipe.correctness_reward or (recipe.reward_specs[0].metric_name if recipe.reward_specs else None)
        recipe.format_reward = registry.default_format_reward(recipe.reward_specs, known, correctness)
        if recipe.format_reward:
            logger.info("format_reward: %s (the configured reward with role 'format')", recipe.format_reward)
    problems = static_problems(recipe, grpo, known)
    if problems:
        raise ConfigError(problems)
    try:
        train, held_out = load_splits(recipe)
    except (KeyError, ValueError) as exc:
        raise ConfigError([str(exc).strip("'\"")]) from None
    problems = registry.check_specs(recipe.reward_specs, known, columns=train.column_names)
    problems += data_problems(grpo, train)
    if problems:
        raise ConfigError(problems)
    funcs, weights = registry.compile_rewards(
        recipe.reward_specs, known, fault_log=FaultLog(Path(grpo.output_dir) / "reward_faults.jsonl"),
        max_failure_rate=recipe.max_reward_failure_rate, failure_window=recipe.reward_failure_window,
    )
    grpo.reward_weights = weights
    if model_args.use_peft and recipe.peft_learning_rate:
        logger.info("use_peft: learning rate %g (peft_learning_rate) instead of %g", recipe.peft_learning_rate,
                    grpo.learning_rate)
        grpo.learning_rate = recipe.peft_learning_rate
    # Where training starts (checkpoint, run name to continue); applied by checkpoint.start right before training.
    recipe.run_plan = checkpoint.plan_run(recipe, grpo)
    if grpo.project == "huggingface":  # TrainingArguments' placeholder: give each recipe its own Trackio project
        grpo.project = f"grpo-recipes-{recipe_name}"
    if not grpo.run_name:
        grpo.run_name = default_run_name(recipe_name, model_args.model_name_or_path, grpo)
    if recipe.trackio_dir:
        os.environ["TRACKIO_DIR"] = str(Path(recipe.trackio_dir).expanduser().resolve())
    problems = checkpoint.metric_history_problems(recipe.run_plan, grpo)
    if problems:
        raise ConfigError(problems)
    return recipe, grpo, model_args, train, held_out, funcs


def build_trainer(recipe, grpo, model_args, train, held_out, funcs):
    from trl import get_peft_config

    from .models import prepare_model
    from .trainer import RecipeTrainer, attach_callbacks, diagnostics_spec

    model_path = prepare_model(model_args, grpo, recipe.model_cache_dir)
    trainer = RecipeTrainer(
        model=model_path,
        reward_funcs=funcs,
        args=grpo,
        train_dataset=train,
        peft_config=get_peft_config(model_args),
        diagnostics=diagnostics_spec(recipe, grpo, funcs),
    )
    attach_callbacks(trainer, recipe, held_out, funcs)  # held-out evaluation and alerts, as configured
    return trainer


def main(recipe_name: str, default_config: Path | None = None, argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        recipe, grpo, model_args, train, held_out, funcs = prepare(recipe_name, argv, default_config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logger.info("data: %d train rows, %d held-out rows", len(train), len(held_out) if held_out is not None else 0)
    trainer = build_trainer(recipe, grpo, model_args, train, held_out, funcs)
    code = train_and_save(trainer, recipe, grpo)
    if trainer.accelerator.num_processes > 1:
        exit_without_teardown(code)  # while `trainer` still holds the DDP wrapper: see there
    return code


def train_and_save(trainer, recipe, grpo) -> int:
    """Train, save and finish the trackers (trainer.end()); -> the process exit code."""
    if recipe.max_cpu_minutes:
        # First in line: its clock must stop before other callbacks' step-end work (held-out eval) starts.
        trainer.callback_handler.callbacks.insert(0, CpuBudget(recipe.max_cpu_minutes))
    session = checkpoint.start(trainer, recipe.run_plan, grpo)  # checkpoint markers, retention, SIGTERM/SIGINT
    try:
        trainer.train(resume_from_checkpoint=str(session.plan.resume_from) if session.plan.resume_from else None)
    except registry.RewardFailureRateExceeded as exc:
        print(f"error: {exc}", file=sys.stderr)
        trainer.end()  # finish the trackers now: a distributed run then exits without interpreter teardown
        return 3
    finally:
        session.close()
    if session.interrupted:  # a checkpoint was saved; the final model is not (the run is not finished)
        trainer.accelerator.print(session.message())
        trainer.end()
        return checkpoint.exit_code(session.interrupted)
    trainer.save_model(grpo.output_dir)
    trainer.accelerator.print(f"model saved to {grpo.output_dir}")
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
