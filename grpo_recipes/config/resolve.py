"""A run's configuration, resolved once: `resolve(argv)` -> `Config`.

It reads `--config X.yaml` (files.py) and sets the environment the file's `env:` asks for, then settles every value,
in this order of precedence: the command line, the file, the task's defaults (tasks/*.py), the device defaults (bf16
where the hardware has it; several processes without CUDA train as CPU ranks), the fields' own defaults. What follows
from the settled values is decided here too, before anything is built: the format reward (the one configured reward
with role "format"), the learning rate under LoRA (peft_learning_rate), GRPO's reward weights, how the model loads
(ModelConfig's dtype and attention in model_init_kwargs), the Trackio project, run name and group (the run is named for
what its config and flags changed from the recipe's default config, then its seed; a resumed run keeps the name it
started under), and every earlier stage's config (stages.py). Each dataclass is then built once; nothing rewrites them
afterwards. Every problem found on the way is reported together (ConfigError), before anything loads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trl import GRPOConfig, ModelConfig

from ..errors import ConfigError
from ..rewards import registry as rewards
from ..state import checkpoint
from ..tasks import registry as tasks
from ..tasks.registry import Task
from ..values import init_fields
from .files import read_yaml, resolve_paths, split_config_arg
from .parsing import Parser, build, check_values, device_defaults, namespace, unknown_keys
from .schema import RecipeArguments, reward_specs
from .stages import StageSpec, final_config, plan_stages

logger = logging.getLogger("grpo_recipes")

TRAINING_ARGUMENTS_PROJECT = "huggingface"  # TrainingArguments' placeholder: each recipe gets a Trackio project


@dataclass(frozen=True)
class Config:
    """What a run trains, as resolved: the flat keys' three dataclasses and every stage's config."""

    name: str  # the recipe's name: `math`, or a config's task (recipes/train.py); its Trackio project's
    recipe: RecipeArguments
    training: Any  # the last stage's TRL config (GRPOConfig, SFTStageConfig, a distill config)
    model: ModelConfig
    stages: tuple[StageSpec, ...]  # the last one's training config is `training`
    task: Task | None  # the configured task (`task:`), which the data and the task's rows come from
    path: Path | None  # the config file
    explicit: frozenset[str]  # the keys the file and the flags set (the rest came from defaults)
    problems: tuple[str, ...] = ()  # what planning the earlier stages found: reported with the start-up checks'


def resolve(argv: list[str] | None = None, default_config: Path | str | None = None, *, name: str | None = None,
            stage: str | None = None) -> Config:
    """argv (sys.argv[1:] when None) and the config file it names (`default_config` when it names none) -> Config.
    `name` None: the config's task names the run (recipes/train.py). `stage` runs that one kind of stage alone
    (tests)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    default_config = None if default_config is None else Path(default_config)  # callers pass str too
    path, flags = split_config_arg(argv, default_config)
    file = resolve_paths(read_yaml(path), path) if path else {}
    for key, value in (file.pop("env", None) or {}).items():
        os.environ.setdefault(str(key), str(value))  # the caller's environment wins over the file
    if stage is not None:
        flags = [*flags, "--stages", json.dumps([{"name": stage}])]
    parser = Parser((RecipeArguments, final_config(file, flags), ModelConfig))
    given = {**device_defaults(), **file}
    problems = unknown_keys(file, parser) + check_values(parser, given, flags)
    if problems:
        raise ConfigError(problems)
    values = namespace(parser, given, flags)
    flagged = [a[2:].split("=")[0].replace("-", "_") for a in flags if a.startswith("--")]  # keys, in order
    explicit = frozenset(file) | set(flagged)
    labels = changes(values, namespace(parser, given, []), flagged, path, default_config)
    task, problems = tasks.resolve(values["task"], _listed(values["task_dirs"]), set(init_fields(RecipeArguments)),
                                   parser.known())
    if problems:
        raise ConfigError(problems)
    if name is None:  # recipes/train.py: any config, named after its task
        if path is None:
            raise ConfigError(["--config: recipes/train.py runs the config you name; pass --config my_task.yaml"])
        name = values["task"] or path.stem
    values |= tasks.defaults(task, explicit)
    values |= derived(values, name, parser.types[1], labels)
    recipe, training, model = build(parser, values)
    specs, problems = plan_stages(recipe, training, teacher_loading(model.dtype))
    return Config(name, recipe, training, model, tuple(specs), task, path, explicit, tuple(problems))


def derived(values: dict[str, Any], name: str, training_cls: type, labels: list[str]) -> dict[str, Any]:
    """The values that follow from the settled ones, for the fields the config left to them. A value too broken to
    derive from is left alone: building the dataclasses reports it. `labels`: what the run changed from the recipe's
    default config (`changes`), which the run name and group start with."""
    out: dict[str, Any] = {}
    try:
        specs = reward_specs(values["rewards"])
    except ValueError:
        specs = None
    if specs is not None and values["format_reward"] is None:
        correctness = values["correctness_reward"] or (specs[0].metric_name if specs else None)
        known = rewards.available(_listed(values["reward_dirs"]))
        if fmt := rewards.default_format_reward(specs, known, correctness):
            logger.info("format_reward: %s (the configured reward with role 'format')", fmt)
            out["format_reward"] = fmt
    if specs is not None and issubclass(training_cls, GRPOConfig):
        out["reward_weights"] = [s.weight for s in specs]
    if values["use_peft"] and values["peft_learning_rate"]:
        logger.info("use_peft: learning rate %g (peft_learning_rate) instead of %g", values["peft_learning_rate"],
                    values["learning_rate"])
        out["learning_rate"] = values["peft_learning_rate"]
    fields = init_fields(training_cls)
    loading = {k: values[k] for k in ("dtype", "attn_implementation") if values.get(k)}  # ModelConfig's
    if loading and "model_init_kwargs" in fields and not isinstance(values["model_init_kwargs"], str):
        out["model_init_kwargs"] = {**loading, **(values["model_init_kwargs"] or {})}  # how every stage loads it
    if "teacher_model_init_kwargs" in fields and values["teacher_model_init_kwargs"] is None:
        out["teacher_model_init_kwargs"] = teacher_loading(values["dtype"])
    if values["project"] == TRAINING_ARGUMENTS_PROJECT:
        out["project"] = f"grpo-recipes-{name}"
    prefix = name_prefix(labels)
    if not values["run_name"]:
        resumed = values["resume"] or values["resume_from_checkpoint"]
        stored = checkpoint.stored_run_name(values["output_dir"]) if resumed and values["output_dir"] else None
        # A resumed run continues the same curve even when a setting the derived name shows (the learning rate, say)
        # changed since.
        out["run_name"] = stored or (f"{prefix}-seed{values['seed']}" if prefix else f"seed{values['seed']}")
    if values["trackio_group"] is None and "trackio" in _listed(values["report_to"]):
        out["trackio_group"] = prefix or DEFAULT_GROUP  # runs that differ only by seed: one group
    return out


def teacher_loading(dtype: str | None) -> dict[str, str]:
    """A logits distill stage's teacher loads in the student's dtype (ModelConfig's), not in TRL's unset one."""
    return {"dtype": dtype or "float32"}


# ------------------------------------------------------------------------------------- the run's default name
#
# A run is named for what distinguishes it from its siblings in the recipe's Trackio project: what its config file
# and flags changed from the recipe's default config, then its seed (`seed42`, `lr2e-5-seed1`, `my_config-seed3`),
# short enough for the dashboard's sidebar. Its group is the same name without the seed.

NAME_CAP = 18  # characters before `-seed<N>`: the seed stays within the first 24, the whole name in the sidebar
DEFAULT_GROUP = "defaults"  # the group of runs that change nothing but the seed
# What changes where a run is written, logged or resumed, not what it trains (the seed ends every name).
BOOKKEEPING = {"output_dir", "overwrite_output_dir", "run_name", "resume", "resume_from_checkpoint", "report_to",
               "project", "seed", "num_completions_to_print", "push_to_hub", "model_cache_dir", "disable_tqdm"}
BOOKKEEPING_PREFIXES = ("logging_", "log_", "save_", "hub_", "trackio_")
SHORT = {"learning_rate": "lr", "max_steps": "steps", "num_generations": "gens", "per_device_train_batch_size": "bs",
         "gradient_accumulation_steps": "accum", "max_completion_length": "maxlen", "temperature": "temp",
         "epsilon": "eps", "epsilon_high": "eps_high", "num_train_epochs": "epochs"}


def changes(values: dict[str, Any], base: dict[str, Any], flagged: list[str], path: Path | None,
            default_config: Path | None) -> list[str]:
    """What this run changed from the recipe's default config, in the order given, as name labels: the config
    file's stem when it is not the recipe's default, then each flag (`flagged`: their keys) that moved a value away
    from the file's (`base`: the values without the flags). Bookkeeping keys do not count."""
    recipes_own = path is None or default_config is not None and path.resolve() == default_config.resolve()
    labels = [] if recipes_own else [path.stem]
    for key in dict.fromkeys(k[3:] if k not in values and k.startswith("no_") else k for k in flagged):
        if key in values and values[key] != base.get(key) and not _bookkeeping(key):
            labels.append(_label(key, values[key]))
    return labels


def name_prefix(labels: list[str]) -> str:
    """The labels joined, at most NAME_CAP characters: the labels cut off leave `+` and a digest of them, so that
    runs that differ only in those keep different names."""
    if len(joined := "-".join(labels)) <= NAME_CAP:
        return joined
    kept: list[str] = []
    for label in labels:
        if len("-".join([*kept, label])) > NAME_CAP - 5:
            break
        kept.append(label)
    digest = hashlib.sha1("\0".join(labels[len(kept):]).encode()).hexdigest()[:4]
    return "-".join(kept or [labels[0][:NAME_CAP - 5]]) + "+" + digest


def _bookkeeping(key: str) -> bool:
    return key in BOOKKEEPING or key.startswith(BOOKKEEPING_PREFIXES)


def _label(key: str, value: Any) -> str:
    short = SHORT.get(key, key)
    if isinstance(value, bool):
        return short if value else f"no_{short}"
    if isinstance(value, (int, float)):
        return short + re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{value:g}").replace("e+", "e")  # 2e-05 -> 2e-5
    if isinstance(value, str):
        value = Path(value.rstrip("/")).name if "/" in value else value  # a path: its last part
        if key == "model_name_or_path":
            return value
        if len(value) <= 12:
            return f"{short}={value}"
    text = json.dumps(value, sort_keys=True, default=str)  # a long text, a list, a mapping: a digest of it
    return f"{short}~{hashlib.sha1(text.encode()).hexdigest()[:4]}"


def _listed(value: Any) -> list:
    return [] if not value else [value] if isinstance(value, str) else list(value)
