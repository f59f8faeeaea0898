"""Recipe configuration: one YAML + CLI flags -> (RecipeArguments, GRPOConfig, ModelConfig), TRL-style.

The YAML is flat, as in TRL: every key is a field of one of the three dataclasses. `rewards:` is a list of
{name, weight, params}. CLI flags override the YAML (`--learning_rate 1e-6`); list/dict fields take JSON on the
command line (`--rewards '[{"name": "math_correctness"}]'`).
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .registry import RewardSpec

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PATH_FIELDS = {"dataset_path", "eval_path"}


@dataclass
class RecipeArguments:
    """What a recipe trains on and how it is scored. GRPO/optimiser settings live in GRPOConfig."""

    # Data
    dataset_source: str = field(
        default="reasoning_gym",
        metadata={"help": "Where prompts come from: `reasoning_gym` (procedural), `hub` (a Hub dataset) or `file`."},
    )
    gym_task: str = field(default="basic_arithmetic", metadata={"help": "reasoning-gym task name (dataset_source=reasoning_gym)."})
    gym_params: dict | str | None = field(
        default=None, metadata={"help": "reasoning-gym task parameters, e.g. {min_terms: 2, max_terms: 2}."}
    )
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset id (dataset_source=hub)."})
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset config name."})
    dataset_split: str = field(default="train", metadata={"help": "Split that training rows come from."})
    eval_split: str | None = field(
        default=None,
        metadata={"help": "Split for held-out rows (hub). Unset: held-out rows are carved out of dataset_split."},
    )
    dataset_path: str | None = field(
        default=None, metadata={"help": "Local .jsonl/.json/.parquet/.csv file (dataset_source=file)."}
    )
    eval_path: str | None = field(
        default=None, metadata={"help": "Separate local file of held-out rows (dataset_source=file)."}
    )
    question_field: str = field(default="question", metadata={"help": "Column holding the question text."})
    answer_field: str | None = field(
        default="answer", metadata={"help": "Column holding the gold answer; copied to the `answer` column."}
    )
    answer_regex: str | None = field(
        default=None, metadata={"help": "Regex whose group 1 extracts the gold answer (GSM8K: '#### (.*)$')."}
    )
    train_size: int = field(default=1000, metadata={"help": "At most this many training rows."})
    eval_size: int = field(default=100, metadata={"help": "Held-out rows, disjoint from training by question text."})
    split_seed: int = field(default=0, metadata={"help": "Seed for procedural generation and the train/eval split."})
    system_prompt: str | None = field(default=None, metadata={"help": "Optional system message."})
    prompt_template: str = field(
        default="{question}", metadata={"help": "User message; `{column}` placeholders are filled from the row."}
    )
    # Rewards
    rewards: list | str | None = field(
        default=None, metadata={"help": "Rewards: list of {name, weight, params}; see `grpo-recipes rewards list`."}
    )
    reward_dirs: list[str] | None = field(
        default=None, metadata={"help": "Extra folders of reward files, searched before ./rewards and the shipped ones."}
    )
    # Model
    model_cache_dir: str | None = field(
        default=None,
        metadata={"help": "Where the offline default model is converted to (default $GRPO_RECIPES_CACHE or ~/.cache)."},
    )
    # Tracking
    trackio_dir: str | None = field(
        default=None, metadata={"help": "Local Trackio storage folder (default $TRACKIO_DIR or ~/.cache/huggingface/trackio)."}
    )

    def __post_init__(self) -> None:
        self.gym_params = _json_field("gym_params", self.gym_params, dict) or {}
        raw = _json_field("rewards", self.rewards, list)
        self.reward_specs = [RewardSpec.parse(e, i) for i, e in enumerate(raw or [])]
        if isinstance(self.reward_dirs, str):
            self.reward_dirs = [self.reward_dirs]


def _json_field(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: could not read {value!r} as JSON ({exc}); on the command line pass JSON") from exc
    if value is not None and not isinstance(value, kind):
        raise ValueError(f"{name}: expected a {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def bf16_supported() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def _split_config_arg(argv: list[str], default_config: Path | None) -> tuple[Path | None, list[str]]:
    argv = list(argv)
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ValueError("--config: missing the path to a YAML file")
        path = Path(argv[i + 1])
        del argv[i : i + 2]
        return path, argv
    return default_config, argv


def read_yaml(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise ValueError(f"--config: no such file {path}")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping of field: value, got {type(data).__name__}")
    return data


def parse_recipe_args(argv: list[str] | None = None, default_config: Path | None = None, training_cls=None):
    """argv + YAML -> (RecipeArguments, training config, ModelConfig, config path). Unknown keys are errors.

    The training config is GRPOConfig unless `training_cls` names another TRL config (SFTConfig for warm-up).
    """
    from trl import GRPOConfig, ModelConfig, TrlParser

    training_cls = training_cls or GRPOConfig

    argv = list(sys.argv[1:] if argv is None else argv)
    config_path, argv = _split_config_arg(argv, default_config)
    config = read_yaml(config_path) if config_path else {}
    for key, value in (config.pop("env", None) or {}).items():
        os.environ.setdefault(str(key), str(value))  # the caller's environment wins over the file
    for key in PATH_FIELDS & config.keys():  # a config file's paths are relative to the file, not to the cwd
        if config[key] and not Path(config[key]).expanduser().is_absolute():
            config[key] = str((config_path.parent / config[key]).resolve())
    known = {f.name for dc in (RecipeArguments, training_cls, ModelConfig) for f in fields(dc)}
    problems = [unknown_key_message(k, known, "config file") for k in config if k not in known]
    if problems:
        raise ConfigError(problems)
    # bf16 only where the hardware has it; an explicit setting in the file or on the CLI still wins.
    config.setdefault("bf16", bf16_supported())
    parser = TrlParser((RecipeArguments, training_cls, ModelConfig), allow_abbrev=False)  # --max_step is a typo
    parser.set_defaults_with_config(**config)
    recipe, training, model, rest = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    flags = [a[2:].split("=")[0] for a in rest if a.startswith("--")]
    if flags or rest:
        problems = [unknown_key_message(f, known, "command line") for f in flags] or [f"unexpected arguments {rest}"]
        raise ConfigError(problems)
    return recipe, training, model, config_path


def unknown_key_message(key: str, known: set[str], where: str) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    hint = f"did you mean `{close[0]}`?" if close else "see `--help` for the accepted fields"
    return f"{key}: unknown field in the {where}; {hint}"


class ConfigError(ValueError):
    """Every problem found at start-up, reported together."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


def default_run_name(recipe_name: str, model_name: str, grpo) -> str:
    model = Path(model_name.rstrip("/")).name
    eps = f"{grpo.epsilon:g}" + (f"-{grpo.epsilon_high:g}" if grpo.epsilon_high else "")
    return f"{recipe_name}-{model}-lr{grpo.learning_rate:g}-eps{eps}-beta{grpo.beta:g}-seed{grpo.seed}"
