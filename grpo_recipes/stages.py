"""A run's stages: `stages: [{name: sft, ...}, {name: grpo}]` runs each stage with TRL's own trainer (SFTTrainer,
GRPOTrainer; a distill stage SFTTrainer or DistillationTrainer, by its mode) one after the other, in one process, one
output folder and one Trackio run.

- Config. The flat keys configure the last stage (its trainer's config). An earlier stage takes every flat training
  setting that its own config also has and that the config sets away from its default (seed, report_to, logging,
  saving, precision, ...), except the ones that size and pace a stage (INHERITED_NOT); its entry sets the rest.
- Layout. The last stage trains into output_dir, as a one-stage run always did; an earlier one into
  output_dir/stages/<n>-<name>, whose final model the next stage starts from. A finished stage leaves DONE in its
  folder (its last global step and the held-out evaluations so far), so a resumed run skips it and continues the
  first unfinished stage from its latest complete checkpoint.
- Steps. A stage's steps are counted after the previous stage's last one (its offset): Trackio's step axis and the
  held-out evaluations continue across stages.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, TrainingArguments
from trl import GRPOConfig

from .checkpoint import STAGES_DIR
from .config import DISTILL_MODES, DistillLogitsConfig, DistillTracesConfig, SFTStageConfig
from .errors import ConfigError
from .registry import choice_hint
from .tool_templates import ToolTemplateError, prepare_tokenizer

CONFIGS: dict[str, type] = {"sft": SFTStageConfig, "distill": DistillTracesConfig, "grpo": GRPOConfig}
# A distill stage's config is its mode's: TRL's SFTConfig for traces, DistillationConfig for logits.
DISTILL_CONFIGS: dict[str, type] = {"traces": DistillTracesConfig, "logits": DistillLogitsConfig}
DONE = "stage_complete.json"
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
    return name if name in CONFIGS else "grpo"


def config_class(name: str, mode: Any = None) -> type | None:
    """A stage's training config class; a distill stage's by its `mode` (None: an unknown mode)."""
    if name == "distill":
        return DISTILL_CONFIGS.get("traces" if mode is None else mode)
    return CONFIGS[name]


def final_config(config: dict[str, Any], argv: list[str]) -> type:
    """The flat keys' training config class: the last stage's (a distill stage's by the flat `mode`)."""
    name = final_stage(config, argv)
    return config_class(name, _raw(config, argv, "mode")) or CONFIGS[name]


@dataclass
class StagePlan:
    """One stage of a run: its name, position, training config and the folder it trains into."""

    name: str
    index: int  # 0-based
    training: Any
    last: bool

    @property
    def label(self) -> str:
        return f"{self.index + 1}-{self.name}"


def stage_dir(output_dir: str | os.PathLike, index: int, name: str) -> Path:
    return Path(output_dir) / STAGES_DIR / f"{index + 1}-{name}"


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


def _annotations(cls: type) -> dict[str, str]:
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            out[name] = annotation if isinstance(annotation, str) else str(annotation)
    return out


def _default(f) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def inherited(top: Any, cls: type) -> dict[str, Any]:
    """The flat training settings an earlier stage of config class `cls` takes over (see the module docstring)."""
    shared = {f.name for f in fields(TrainingArguments) if f.init} & {f.name for f in fields(cls) if f.init}
    out = {}
    for f in fields(type(top)):
        if f.name in shared and f.name not in INHERITED_NOT:
            value = getattr(top, f.name)
            if value != _default(f):
                out[f.name] = value
    return out


def plan_stages(recipe, training) -> tuple[list[StagePlan], list[str]]:
    """(the run's stages with their training configs, problems). `training` is the flat keys' config, the last
    stage's; an earlier stage's config is built from its entry over what it inherits. Loads nothing."""
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
                problems.append(f"mode: '{mode}' is not one of {', '.join(DISTILL_MODES)}"
                                f"{choice_hint(mode, DISTILL_MODES)}")
            elif type(training) is not cls:
                problems.append(f"stages[{i}]: the flat keys were read as {type(training).__name__}, not the "
                                f"{name} stage's {cls.__name__}")
            plans.append(StagePlan(name, i, training, True))
            continue
        cls = config_class(name, settings.get("mode"))
        if cls is None:
            mode = settings["mode"]
            problems.append(f"stages[{i}].mode: '{mode}' is not one of {', '.join(DISTILL_MODES)}"
                            f"{choice_hint(str(mode), DISTILL_MODES)}")
            continue
        known = {f.name for f in fields(cls) if f.init}
        unknown = [k for k in settings if k not in known]
        kind = f"{name} stage (mode {settings.get('mode', 'traces')})" if name == "distill" else f"{name} stage"
        for k in unknown:
            close = difflib.get_close_matches(k, known, n=1, cutoff=0.75)
            hint = f"did you mean `{close[0]}`?" if close else f"not a field of {cls.__name__}"
            problems.append(f"stages[{i}].{k}: unknown setting of the {kind}; {hint}")
        if unknown:
            continue
        types_ = _annotations(cls)
        values = {**inherited(training, cls), **{k: _coerce(v, types_.get(k, "")) for k, v in settings.items()}}
        values["output_dir"] = str(stage_dir(training.output_dir, i, name))
        try:
            cfg = cls(**values)
        except (ValueError, TypeError) as exc:
            problems.append(f"stages[{i}] ({name}): {exc}")
            continue
        if cfg.max_steps is None or cfg.max_steps < 1:
            problems.append(f"stages[{i}].max_steps: an earlier stage needs a number of steps >= 1, got "
                            f"{cfg.max_steps}; set it in the stage's entry")
            continue
        plans.append(StagePlan(name, i, cfg, False))
    names = [e["name"] for e in entries]
    if names.count("grpo") > 1:
        problems.append("stages: one grpo stage per run; run a second as its own recipe from this one's output")
    return plans, problems


def name_stages(plans: list[StagePlan], training) -> None:
    """The Trackio project and run name the last stage was given, for every stage: one run."""
    for p in plans:
        p.training.project, p.training.run_name = training.project, training.run_name


# ---------------------------------------------------------------------------------------------- done markers


def mark_done(plan: StagePlan, global_step: int, evaluation: dict | None) -> None:
    path = Path(plan.training.output_dir) / DONE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"stage": plan.name, "index": plan.index, "global_step": global_step,
                               "evaluation": evaluation}))
    os.replace(tmp, path)


def done(plan: StagePlan) -> dict | None:
    """What a finished stage recorded, or None when it has not finished."""
    path = Path(plan.training.output_dir) / DONE
    if plan.last or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def discard(output_dir: str | os.PathLike) -> None:
    """--overwrite_output_dir: the earlier run's stage folders go (its last stage's checkpoints: checkpoint.start)."""
    shutil.rmtree(Path(output_dir) / STAGES_DIR, ignore_errors=True)


# -------------------------------------------------------------------------------------------- the stage kinds


class Stage:
    """What one kind of stage does (grpo_stage.GRPOStage, sft.SFTStage, distill.py's): its dataset, its TRL trainer and
    what it does around training. One instance serves one stage of one run (`plan`), so it may keep state between its
    hooks."""

    name = ""

    def __init__(self, plan: StagePlan | None = None):
        self.plan = plan
        self.offset = 0  # the run's steps before this stage (set by the runner when the stage starts)

    def dataset(self, run):
        """The stage's training dataset, built from the run's training rows."""
        return run.train

    def run_label(self, training) -> list[str]:
        """The settings a derived run name shows, after the recipe and model names."""
        return [f"lr{training.learning_rate:g}", f"seed{training.seed}"]

    def describe(self, run) -> str:
        return f"{self.name}: {len(run.train)} train rows"

    def problems(self, recipe, model_args=None) -> list[str]:
        """The start-up problems of what this kind of stage adds (its features' settings); loads no weights
        (`model_args`: the run's model, for a check that reads its tokenizer)."""
        return []

    def data_problems(self, recipe, train) -> list[str]:
        """Those that only the loaded training rows show."""
        return []

    def configure(self, run) -> None:
        """Last settings on the stage's training config once the rewards are compiled."""

    def make_trainer(self, run, model_path: str):
        raise NotImplementedError(f"{type(self).__name__}.make_trainer")

    def callbacks(self, trainer, run) -> list:
        return []

    def before_save(self, trainer, run) -> None:
        """Right before the stage's model is saved."""


def tool_tokenizer(recipe, model_path: str):
    """The tokenizer with the configured tool template and parser: on every start (also from an SFT'd folder or a
    checkpoint), because the parser is an instance attribute that a saved tokenizer does not keep."""
    try:
        return prepare_tokenizer(AutoTokenizer.from_pretrained(model_path), recipe.tool_template)
    except ToolTemplateError as exc:
        raise ConfigError([str(exc)]) from None
