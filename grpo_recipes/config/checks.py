"""Start-up checks: everything that can be checked before a model is loaded, reported together.

Checks of the resolved config's own values live here, one function a concern; what a kind of stage needs of the recipe
and the data is that stage's (stages/*.py, Stage.problems and data_problems); a GRPO feature checks its own settings
(grpo/features/). The runner collects them all twice:
1. `problems(config)`, before anything loads: the data settings, the rewards list and their params' values, reward
   roles and evaluation settings, every stage's training values (ranges, and the string choices TRL only checks deep
   inside a training step), tools, Trackio grouping, failure-rate settings, the output directory versus
   resume/overwrite (not when nothing is trained: `grpo-recipes eval`), vLLM;
2. `data_problems(config, ...)`, once the data is loaded and the start planned: the reward columns against the
   dataset, and a fresh start into a Trackio run that already has metrics.
Out-of-the-ordinary but legal values are warnings (logged), not errors. Bad values and unknown keys are found earlier,
while parsing (parsing.py), which also runs the batch geometry rule (batching.py) and, when a dataclass cannot be
built, `raw_problems` on the raw values; the launcher runs the batch rule for its process count.

Every message starts with the field name and ends with the fix.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ..rewards import registry
from ..state import checkpoint, tracking
from ..tasks import registry as tasks
from ..tasks.data import check_data_args
from ..tools import registry as tools
from ..tools.templates import TOOL_TEMPLATE_CHOICES
from ..values import choice_hint
from ..vllm import support as vllm_support
from .schema import SFT_FORMATS

logger = logging.getLogger("grpo_recipes")

# Values TRL 1.16 accepts but only checks at run time, after the model is loaded and the first batch is generated
# (trl/trainer/grpo_trainer.py: "Unknown loss type", "Invalid value for scale_rewards", "Unknown importance sampling
# level"). `scale_rewards` true/false are mapped to group/none by GRPOConfig.__post_init__ before this check runs.
RUNTIME_CHOICES = {
    "loss_type": ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo"),
    "scale_rewards": ("group", "batch", "none"),
    "importance_sampling_level": ("token", "sequence"),
}

# Thresholds for warnings: legal, but far outside what GRPO recipes use, so most likely a typo or a unit slip.
WARN_LEARNING_RATE = 1e-4
WARN_BETA = 0.5
WARN_EPSILON = 0.5



def problems(config, training_output: bool = True) -> list[str]:
    """Every problem the resolved config shows before anything loads, as messages; warnings are logged.
    `training_output=False` (`grpo-recipes eval`, which trains nothing) skips the output directory's."""
    recipe, training = config.recipe, config.training
    out = reward_setting_problems(recipe)
    for spec in config.stages[:-1]:
        errors, warnings = training_problems(spec.training)
        out += [f"stages[{spec.index}] ({spec.name}): {m}" for m in errors]
        report_warnings(warnings)
    errors, warnings = recipe_problems(recipe, training, config.model, training_output)
    report_warnings(warnings)
    out += errors + tasks.read_problems(recipe, config.task) + check_data_args(recipe)
    if not _is_warmup(training) or recipe.eval_heldout or recipe.reward_specs:  # sft-only: its held-out scoring
        known = registry.available(recipe.reward_dirs or ())
        out += registry.check_specs(recipe.reward_specs, known, columns=None)
    return out


def data_problems(config, train, held_out, start: checkpoint.StartPoint | None) -> list[str]:
    """The problems only the loaded rows and the planned start show: the Trackio history, the reward columns (the
    training rows' for a GRPO run, the held-out rows' for an sft-only one that scores them)."""
    recipe, training = config.recipe, config.training
    out = metric_history_problems(start, training) if start is not None else []
    rows = train if _is_grpo(training) else held_out if _is_warmup(training) and recipe.eval_heldout else None
    if rows is not None:
        known = registry.available(recipe.reward_dirs or ())
        out += registry.check_specs(recipe.reward_specs, known, columns=rows.column_names)
    return out


def _is_grpo(training) -> bool:
    # Duck-typed, not isinstance: raw_problems runs on the raw values of a config whose dataclasses failed.
    return hasattr(training, "num_generations")


def _is_warmup(training) -> bool:
    return hasattr(training, "sft_format")


def report_warnings(warnings: Sequence[str]) -> None:
    for w in warnings:
        logger.warning("config: %s", w)


# ------------------------------------------------------------------------------------------------------ rewards


def reward_setting_problems(recipe) -> list[str]:
    """Problems with a RecipeArguments' reward roles, evaluation and alert settings, found before anything loads."""
    names = [s.metric_name for s in recipe.reward_specs]
    problems = []
    for name in ("correctness_reward", "format_reward"):
        value = getattr(recipe, name)
        if value is not None and value not in names:
            problems.append(f"{name}: '{value}' is not one of the configured rewards ({', '.join(names) or 'none'})")
    correctness = recipe.correctness_reward or (names[0] if names else None)
    if recipe.format_reward is not None and recipe.format_reward == correctness:
        problems.append("format_reward: must differ from the correctness reward")
    if recipe.eval_k < 0:
        problems.append(f"eval_k: must be >= 0 (0: greedy held-out evaluation only), got {recipe.eval_k}")
    for name in ("eval_generation_batch_size", "alert_patience", "alert_baseline_steps"):
        if getattr(recipe, name) < 1:
            problems.append(f"{name}: must be >= 1, got {getattr(recipe, name)}")
    if recipe.eval_every_steps < 0:
        problems.append(f"eval_every_steps: must be >= 0 (0: only at start and end), got {recipe.eval_every_steps}")
    if recipe.eval_max_new_tokens is not None and recipe.eval_max_new_tokens < 1:
        problems.append(f"eval_max_new_tokens: must be >= 1 or unset, got {recipe.eval_max_new_tokens}")
    return problems


# ------------------------------------------------------------------------------------------------------- values


def recipe_problems(recipe, training, model_args=None, training_output: bool = True) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the flat keys, visible from the config alone: the last stage's training values, Trackio,
    the failure-rate settings, tools, the output directory (unless `training_output` is False) and vLLM. Loads
    nothing. Runs on raw values too (raw_problems)."""
    errors, warnings = training_problems(training)
    if _is_warmup(training) and recipe.eval_heldout and recipe.eval_max_new_tokens is None:
        errors.append("eval_max_new_tokens: an sft-only run has no max_completion_length to evaluate with; set "
                      "it (the GRPO recipe's max_completion_length), or eval_heldout: false")
    if recipe.trackio_group and not tracking.enabled(training):
        errors.append(f"trackio_group: '{recipe.trackio_group}' groups Trackio runs, but report_to is "
                      f"{training.report_to or 'none'}; add trackio to report_to, or drop trackio_group")
    rate, window = recipe.max_reward_failure_rate, recipe.reward_failure_window
    if not 0 <= rate <= 1:
        errors.append(f"max_reward_failure_rate: {rate:g}; it is a fraction between 0 and 1 (1 never stops the run)")
    if window < 1:
        errors.append(f"reward_failure_window: {window}; it is a number of completions, at least 1")
    errors += tool_problems(recipe, training)
    if training_output:
        errors += checkpoint.output_dir_problems(recipe, training)
    if _is_grpo(training):
        errors += vllm_support.check_vllm(
            training.use_vllm, training.vllm_mode, training.vllm_server_host, training.vllm_server_port,
            training.vllm_server_timeout, base_url=training.vllm_server_base_url,
            model=getattr(model_args, "model_name_or_path", None),
            cuda_available=torch.cuda.is_available() and not training.use_cpu,
            tensor_parallel_size=training.vllm_tensor_parallel_size,
        )
    return errors, warnings


def raw_problems(values: dict[str, Any], already: list[str]) -> list[str]:
    """recipe_problems on the raw values of a config whose dataclasses cannot be built (parsing.build), so a batch
    problem does not hide a bad learning rate or an output-dir conflict until the next attempt."""
    raw = SimpleNamespace(**values)
    if "scale_rewards" in values:  # as GRPOConfig.__post_init__ maps it
        raw.scale_rewards = {True: "group", False: "none"}.get(raw.scale_rewards, raw.scale_rewards)
    try:
        errors, warnings = recipe_problems(raw, raw)
    except (AttributeError, TypeError, ValueError) as exc:  # a raw value too broken to check: its error is reported
        logger.debug("config checks skipped on unparsed values: %s", exc)
        return []
    report_warnings(warnings)
    return [e for e in errors if e not in already]


def training_problems(cfg) -> tuple[list[str], list[str]]:
    """(errors, warnings) of one stage's training values: GRPO's ranges and run-time choices, an sft stage's format
    and traces, every stage's learning rate."""
    errors: list[str] = []
    warnings: list[str] = []
    if _is_grpo(cfg):
        grpo_checks(cfg, errors, warnings)
    elif _is_warmup(cfg):
        if not cfg.learning_rate > 0:
            errors.append(f"learning_rate: {cfg.learning_rate:g}; it must be > 0 (the math default's sft stage uses "
                          "3e-5)")
        if cfg.sft_format not in SFT_FORMATS:
            errors.append(f"sft_format: '{cfg.sft_format}' is not one of {', '.join(SFT_FORMATS)}"
                          f"{choice_hint(cfg.sft_format, SFT_FORMATS)}")
        if cfg.sft_traces_path and not Path(cfg.sft_traces_path).is_file():
            errors.append(f"sft_traces_path: no such file {cfg.sft_traces_path}")
    elif not cfg.learning_rate > 0:
        errors.append(f"learning_rate: {cfg.learning_rate:g}; it must be > 0")
    return errors, warnings


def tool_problems(recipe, training) -> list[str]:
    """tools / environment / tool_template / gold_check_tool: names, params, clashes, found before anything loads."""
    # Plain attributes, not RecipeArguments.uses_tools: this also runs on the raw values of a config whose dataclasses
    # could not be built (parsing._static_on_raw_values), where `tools` may still be unparsed text.
    tool_list, uses_tools = recipe.tools or [], bool(recipe.tools or recipe.environment)
    if not isinstance(tool_list, list):
        return []
    trajectories = _is_warmup(training) and training.sft_format == "tool_trajectory" and not training.sft_traces_path
    if not (uses_tools or recipe.gold_check_tool or trajectories):
        return []
    try:
        known = tools.available(recipe.tool_dirs or ())
    except ImportError as exc:  # a tool file that does not import (or a tool with a bad schema) names itself
        return [f"tool_dirs: {exc}"]
    problems = tools.check_tool_specs(tool_list, recipe.environment, known, tools.environments())
    if uses_tools and recipe.tool_template not in TOOL_TEMPLATE_CHOICES:
        problems.append(f"tool_template: '{recipe.tool_template}' is not one of {', '.join(TOOL_TEMPLATE_CHOICES)}"
                        f"{choice_hint(recipe.tool_template, TOOL_TEMPLATE_CHOICES)}")
    if recipe.gold_check_tool and recipe.gold_check_tool not in known:
        problems.append(f"gold_check_tool: unknown tool '{recipe.gold_check_tool}'. Known tools: {', '.join(known)}")
    if recipe.environment is not None and recipe.eval_heldout and _is_grpo(training):
        problems.append("environment: the held-out evaluation runs standalone tools only (rollout.py builds no "
                        "environment instances); set eval_heldout: false and evaluate with the environment's reward")
    return problems


def grpo_checks(grpo, errors: list[str], warnings: list[str]) -> None:
    """GRPOConfig's ranges and run-time choices, appended to `errors` and `warnings`."""
    lr = grpo.learning_rate
    if not lr > 0:
        errors.append(f"learning_rate: {lr:g}; it must be > 0 (GRPO recipes use 1e-6 to 1e-5)")
    elif lr > WARN_LEARNING_RATE:
        warnings.append(f"learning_rate: {lr:g} is above {WARN_LEARNING_RATE:g}; GRPO usually diverges there "
                        "(typical: 1e-6 to 1e-5)")
    if grpo.beta < 0:
        errors.append(f"beta: {grpo.beta:g}; the KL coefficient must be >= 0 (0 disables the reference model)")
    elif grpo.beta > WARN_BETA:
        warnings.append(f"beta: {grpo.beta:g} is above {WARN_BETA:g}; the KL term will dominate the reward "
                        "(typical: 0 to 0.04)")
    eps, eps_high = grpo.epsilon, grpo.epsilon_high
    if not 0 < eps < 1:
        errors.append(f"epsilon: {eps:g}; the clip range (1-ε, 1+ε) needs 0 < epsilon < 1 (typical: 0.2)")
    elif eps > WARN_EPSILON:
        warnings.append(f"epsilon: {eps:g} is above {WARN_EPSILON:g}; clipping barely limits the update "
                        "(typical: 0.2)")
    if eps_high is not None:
        if eps_high <= 0:
            errors.append(f"epsilon_high: {eps_high:g}; it must be > 0 (DAPO uses 0.28), or unset it")
        elif 0 < eps < 1 and eps_high < eps:
            warnings.append(f"epsilon_high: {eps_high:g} is below epsilon {eps:g}; the upper clip is meant to be the "
                            "wider one (DAPO: epsilon 0.2, epsilon_high 0.28)")
    if grpo.temperature is not None and not grpo.temperature > 0:
        errors.append(f"temperature: {grpo.temperature:g}; sampling needs a temperature > 0 (typical: 0.7 to 1.0)")
    if grpo.max_completion_length is not None and grpo.max_completion_length < 1:
        errors.append(f"max_completion_length: {grpo.max_completion_length}; it must be at least 1 token")
    if grpo.max_steps == 0:
        errors.append("max_steps: 0 trains nothing; set a positive number, or -1 to train for num_train_epochs")
    for name, choices in RUNTIME_CHOICES.items():
        value = getattr(grpo, name, None)
        if value is not None and str(value) not in choices:
            errors.append(f"{name}: '{value}' is not one of {', '.join(choices)}{choice_hint(value, choices)}")


# --------------------------------------------------------------------------------------------- data and history


def demonstration_column(field_: str, train) -> list[str]:
    values = train[field_] if field_ in train.column_names else [None] * len(train)
    missing = sum(not (isinstance(v, str) and v.strip()) for v in values)
    if missing:
        return [f"demonstration_field: {missing} of {len(train)} training rows have no '{field_}' text. Fix: a "
                "dataset column with a correct completion for every row, or a task whose rows have one (task: "
                "arithmetic builds worked_solution from each row's expression)"]
    return []


def metric_history_problems(start: checkpoint.StartPoint, training) -> list[str]:
    """A fresh start must not append to a Trackio run that already has metrics: the curves would interleave."""
    if start.replace_metrics or not tracking.enabled(training):
        return []
    steps = tracking.logged_steps(tracking.project_db(training.project), training.run_name)
    if not steps:
        return []
    return [
        f"run_name: Trackio project '{training.project}' already has a run '{training.run_name}' with metrics up to "
        f"step {max(steps)}; a fresh start would log steps from 1 again into the same run. Fix: --resume to continue "
        "it, --overwrite_output_dir to replace it, or a new --run_name"
    ]
