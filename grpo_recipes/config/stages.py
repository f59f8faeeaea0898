"""A run's stages as configured: `stages: [{name: sft, ...}, {name: grpo}]`, each stage's TRL config, read before
anything loads.

The flat keys configure the last stage (its trainer's config). An earlier stage takes every flat training setting that
its own config also has and that the config sets away from its default (seed, report_to, logging, saving, precision,
...), except the ones that size and pace a stage (INHERITED_NOT); its entry sets the rest. The last stage trains into
output_dir, an earlier one into output_dir/stages/<n>-<name> (state/checkpoint.py: the folders and done markers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from transformers import TrainingArguments

from ..state.checkpoint import stage_dir
from ..values import annotations, choice_hint, default, did_you_mean, init_fields
from .schema import DISTILL_CONFIGS, STAGE_CONFIGS

# What sizes and paces a stage is its own: GRPO's learning rate or batch would be wrong for supervised steps.
INHERITED_NOT = frozenset({
    "output_dir", "logging_dir", "resume_from_checkpoint", "run_name", "max_steps", "num_train_epochs",
    "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio",
    "per_device_train_batch_size", "gradient_accumulation_steps",
})


def _raw(config: dict[str, Any], argv: list[str], key: str) -> Any:
    """A key's value before the full parse: `--key X` or `--key=X` on the command line, else the config file's."""
    raw: Any = config.get(key)
    for i, arg in enumerate(argv):
        if arg == f"--{key}" and i + 1 < len(argv):
            raw = argv[i + 1]
        elif arg.startswith(f"--{key}="):
            raw = arg.split("=", 1)[1]
    return raw


def final_stage(config: dict[str, Any], argv: list[str]) -> str:
    """The last stage's name, read before the full parse (it picks the flat keys' training config): `--stages X`
    or `--stages=X` on the command line, else the config file's `stages`. Malformed values are left to the parse."""
    raw = _raw(config, argv, "stages")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return "grpo"
    last = raw[-1] if isinstance(raw, list) and raw else None
    name = last.get("name") if isinstance(last, dict) else last
    return name if name in STAGE_CONFIGS else "grpo"


def config_class(name: str, mode: Any = None) -> type | None:
    """A stage's training config class; a distill stage's by its `mode` (None: an unknown mode)."""
    if name == "distill":
        return DISTILL_CONFIGS.get("traces" if mode is None else mode)
    return STAGE_CONFIGS[name]


def final_config(config: dict[str, Any], argv: list[str]) -> type:
    """The flat keys' training config class: the last stage's (a distill stage's by the flat `mode`)."""
    name = final_stage(config, argv)
    return config_class(name, _raw(config, argv, "mode")) or STAGE_CONFIGS[name]


@dataclass(frozen=True)
class StageSpec:
    """One stage of a run as configured: its name, position and training config (which names its folder)."""

    name: str
    index: int  # 0-based
    training: Any
    last: bool

    @property
    def label(self) -> str:
        return f"{self.index + 1}-{self.name}"


def _coerce(value: Any, annotation: str) -> Any:
    # YAML reads 3e-5 (no dot) as text; the flat keys go through argparse's conversion, stage entries through this.
    if isinstance(value, str):
        for kind in (int, float) if "int" in annotation else (float,) if "float" in annotation else ():
            try:
                return kind(value)
            except ValueError:
                continue
        if "bool" in annotation and value.lower() in ("true", "false"):
            return value.lower() == "true"
    return value


def inherited(top: Any, cls: type) -> dict[str, Any]:
    """The flat training settings an earlier stage of config class `cls` takes over (see the module docstring)."""
    shared = set(init_fields(TrainingArguments)) & set(init_fields(cls))
    out = {}
    for f in fields(type(top)):
        if f.name in shared and f.name not in INHERITED_NOT:
            value = getattr(top, f.name)
            if value != default(f):
                out[f.name] = value
    return out


def plan_stages(recipe, training, teacher_loading: dict | None = None) -> tuple[list[StageSpec], list[str]]:
    """(the run's stages with their training configs, problems). `training` is the flat keys' config, the last
    stage's; an earlier stage's config is built from its entry over what it inherits, in its own folder, under the run's
    Trackio project and run name (one run); a logits distill stage's teacher loads as `teacher_loading` says unless
    its entry says otherwise. Loads nothing."""
    entries, problems, plans = recipe.stages, [], []
    for i, entry in enumerate(entries):
        name, settings = entry["name"], {k: v for k, v in entry.items() if k != "name"}
        last = i == len(entries) - 1
        if last:
            if settings:
                problems.append(f"stages[{i}]: the last stage ({name}) is configured by the flat keys; move "
                                f"{', '.join(sorted(settings))} out of its entry to the top level")
            mode = getattr(training, "mode", None)
            cls = config_class(name, mode)
            if cls is None:
                problems.append(f"mode: '{mode}' is not one of {', '.join(DISTILL_CONFIGS)}"
                                f"{choice_hint(mode, DISTILL_CONFIGS)}")
            elif type(training) is not cls:
                problems.append(f"stages[{i}]: the flat keys were read as {type(training).__name__}, not the "
                                f"{name} stage's {cls.__name__}")
            plans.append(StageSpec(name, i, training, True))
            continue
        cls = config_class(name, settings.get("mode"))
        if cls is None:
            mode = settings["mode"]
            problems.append(f"stages[{i}].mode: '{mode}' is not one of {', '.join(DISTILL_CONFIGS)}"
                            f"{choice_hint(str(mode), DISTILL_CONFIGS)}")
            continue
        known = set(init_fields(cls))
        unknown = [k for k in settings if k not in known]
        kind = f"{name} stage (mode {settings.get('mode', 'traces')})" if name == "distill" else f"{name} stage"
        for k in unknown:
            close = did_you_mean(k, known)
            hint = f"did you mean `{close}`?" if close else f"not a field of {cls.__name__}"
            problems.append(f"stages[{i}].{k}: unknown setting of the {kind}; {hint}")
        if unknown:
            continue
        types_ = annotations(cls)
        values = {**inherited(training, cls), **{k: _coerce(v, types_.get(k, "")) for k, v in settings.items()},
                  "output_dir": str(stage_dir(training.output_dir, i, name)), "project": training.project,
                  "run_name": training.run_name}
        if "model_init_kwargs" in known and hasattr(training, "model_init_kwargs"):  # TRL's, not TrainingArguments'
            values.setdefault("model_init_kwargs", training.model_init_kwargs)  # the model loads alike in every stage
        if "teacher_model_init_kwargs" in known and teacher_loading is not None:
            values.setdefault("teacher_model_init_kwargs", teacher_loading)
        try:
            cfg = cls(**values)
        except (ValueError, TypeError) as exc:
            problems.append(f"stages[{i}] ({name}): {exc}")
            continue
        if cfg.max_steps is None or cfg.max_steps < 1:
            problems.append(f"stages[{i}].max_steps: an earlier stage needs a number of steps >= 1, got "
                            f"{cfg.max_steps}; set it in the stage's entry")
            continue
        plans.append(StageSpec(name, i, cfg, False))
    names = [e["name"] for e in entries]
    if names.count("grpo") > 1:
        problems.append("stages: one grpo stage per run; run a second as its own recipe from this one's output")
    return plans, problems
