"""Recipe config files: which one `--config X` / `--config=X` names, reading it (YAML), and its relative input paths.

The one reader of recipe and Accelerate YAML files, for the recipes (parsing.py) and the launcher alike, so both
accept the same forms. Light on purpose (PyYAML only): the launcher imports it and must start in a blink.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError

# Config-file fields that name input files or folders: a relative path there is relative to the config file.
# (output_dir, trackio_dir and model_cache_dir are where a run writes: relative to where it is started.)
PATH_FIELDS = ("dataset_path", "eval_path", "reward_dirs", "tool_dirs", "task_dirs", "sft_traces_path")


def split_config_arg(argv: Sequence[str], default_config: Path | None = None) -> tuple[Path | None, list[str]]:
    """-> (the config file named by `--config X` or `--config=X`, else `default_config`; argv without it)."""
    rest, found = [], []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--config":
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ConfigError(["--config: missing the path to a YAML file"])
            found.append(args[i + 1])
            i += 2
            continue
        if arg.startswith("--config="):
            found.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    if len(found) > 1:
        raise ConfigError([f"--config: given {len(found)} times ({', '.join(found)}); pass one config file"])
    return (Path(found[0]) if found else default_config), rest


def read_yaml(path: str | os.PathLike, what: str = "--config") -> dict[str, Any]:
    """A YAML file that must hold a mapping (a recipe config, an Accelerate config), or ConfigError naming `what`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"{what}: no such file {path}"])
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError([f"{what}: {path} is not valid YAML ({exc})"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{what}: {path} must hold a YAML mapping of field: value, got {type(data).__name__}"])
    return data


def resolve_paths(config: dict[str, Any], config_path: Path) -> dict[str, Any]:
    """The config's input paths (PATH_FIELDS), made absolute relative to the config file's folder."""
    def resolve(value: Any) -> Any:
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            return str((config_path.parent / value).resolve())
        return value

    for key in set(PATH_FIELDS) & config.keys():
        value = config[key]
        config[key] = [resolve(v) for v in value] if isinstance(value, list) else resolve(value)
    for entry in config.get("stages") or ():  # a stage's own settings: {name: sft, sft_traces_path: traces.jsonl}
        if isinstance(entry, dict):
            resolve_paths(entry, config_path)
    return config
