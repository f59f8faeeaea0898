"""Recipe arguments: `--config X.yaml` + YAML + command-line flags -> (RecipeArguments, training config, ModelConfig).

The config file is read by config_files.py (the launcher's reader too). This is the one module that touches argparse
internals (`parser._actions`, `_option_string_actions`: to convert and report each value the way argparse would).

1. values, before argparse sees them: every YAML value and every command-line value is converted the way argparse
   would convert it. argparse stops at the first bad value with `SystemExit` and a usage dump; here each bad value
   becomes one `ConfigError` entry that names the field, what was given and what is expected.
2. dataclasses: RecipeArguments, the training config and ModelConfig are built one by one, so the `__post_init__`
   ValueError of one does not hide the problems of another. The batch geometry is checked on the raw values first
   (batching.batch_problems), with the fix spelled out, because GRPOConfig's own message says what is wrong but not what
   to change; when a dataclass cannot be built, the config-alone checks still run on the raw values.

Relative input paths in a config file (config_files.PATH_FIELDS) are relative to that file; on the command line they
are the user's own, relative to where they stand.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from trl import ModelConfig, TrlParser

from ..errors import ConfigError
from ..tasks import registry as task
from ..values import choice_hint, did_you_mean
from . import checks
from .batching import batch_problems, num_processes
from .files import read_yaml, resolve_paths, split_config_arg
from .schema import RecipeArguments
from .stages import final_config

logger = logging.getLogger("grpo_recipes")

# Words in a GRPOConfig.__post_init__ ValueError that mean "the batch geometry is wrong": when `batch_problems` has
# already explained that problem with its fix, TRL's shorter message about the same thing is dropped.
_BATCH_WORDS = ("generation_batch_size", "num_generations", "global batch size", "steps_per_generation",
                "generations per prompt")

# Text fields that TRL also documents as taking true/false (GRPOConfig.__post_init__ maps them to group/none).
_BOOL_OK = {"scale_rewards"}


class _ArgparseError(Exception):
    pass


def bf16_supported() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def device_defaults() -> dict[str, bool]:
    """Settings that depend on the hardware; an explicit setting in the file or on the CLI wins over them."""
    defaults = {"bf16": bf16_supported()}  # bf16 only where the hardware has it
    # Launched as several processes (torchrun sets WORLD_SIZE) on a machine without CUDA: Accelerate makes the workers
    # gloo ranks only when told to use the CPU; otherwise each trains alone on the whole batch, at N times the memory.
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        defaults["use_cpu"] = True
    return defaults


def parse_recipe_args(argv: list[str] | None = None, default_config: Path | None = None, training_cls=None):
    """argv + YAML -> (RecipeArguments, training config, ModelConfig, config path). Unknown keys are errors. The
    configured task's defaults (task.py) fill the RecipeArguments fields that neither the file nor the flags set.

    The training config is the last stage's (stages.final_config: GRPOConfig for grpo, SFTStageConfig for sft, a
    distill stage's by its mode) unless `training_cls` names one.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    config_path, argv = split_config_arg(argv, default_config)
    config = resolve_paths(read_yaml(config_path), config_path) if config_path else {}
    training_cls = training_cls or final_config(config, argv)
    for key, value in (config.pop("env", None) or {}).items():
        os.environ.setdefault(str(key), str(value))  # the caller's environment wins over the file
    known = {f.name for dc in (RecipeArguments, training_cls, ModelConfig) for f in fields(dc)}
    problems = [unknown_key_message(k, known, "config file") for k in config if k not in known]
    config = {**device_defaults(), **config}
    parser = TrlParser((RecipeArguments, training_cls, ModelConfig), allow_abbrev=False)  # --max_step is a typo
    # Every bad value, in the file or on the command line, is reported here: argparse would SystemExit on the first.
    problems += check_values(parser, (RecipeArguments, training_cls, ModelConfig), config, argv)
    if problems:
        raise ConfigError(problems)
    parser.set_defaults_with_config(**config)
    (recipe, training, model), rest = build_dataclasses(parser, argv)  # every __post_init__ refusal, together
    flags = [a[2:].split("=")[0] for a in rest if a.startswith("--")]
    if flags or rest:
        problems = [unknown_key_message(f, known, "command line") for f in flags] or [f"unexpected arguments {rest}"]
        raise ConfigError(problems)
    # What the config file and the command line set: the task's defaults fill only the rest.
    recipe.set_fields = frozenset(config) | {a[2:].split("=")[0].replace("-", "_") for a in argv if a.startswith("--")}
    problems = task.problems(recipe)
    if problems:
        raise ConfigError(problems)
    task.apply_defaults(recipe, task.load(recipe))
    return recipe, training, model, config_path


def unknown_key_message(key: str, known: set[str], where: str) -> str:
    close = did_you_mean(key, known)
    hint = f"did you mean `{close}`?" if close else "see `--help` for the accepted fields"
    return f"{key}: unknown field in the {where}; {hint}"


# ------------------------------------------------------------------------------------------------------- 1. values


def _field_types(dataclass_types: Sequence[type]) -> dict[str, str]:
    """Field name -> its annotation as written. Not `Field.type`: HfArgumentParser rewrites that in place (a
    `dict | str | None` field becomes `str`), which would hide that a mapping is a legal YAML value."""
    out: dict[str, str] = {}
    for dc in dataclass_types:
        for cls in reversed(dc.__mro__):
            for name, annotation in vars(cls).get("__annotations__", {}).items():
                out[name] = annotation if isinstance(annotation, str) else str(annotation)
    return out


def _actions_by_dest(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """dest -> the action of its `--dest` flag (bool fields also have a `--no_dest` store-false action)."""
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if f"--{action.dest}" in action.option_strings:
            out.setdefault(action.dest, action)
    return out


def _type_name(action: argparse.Action) -> str:
    name = getattr(action.type, "__name__", "value")
    if action.choices:
        return "one of " + ", ".join(map(str, action.choices))
    return {"string_to_bool": "true or false", "str": "text", "<lambda>": "value"}.get(name, name)


def _convert(action: argparse.Action, text: str) -> tuple[bool, Any, str]:
    """Convert one string as argparse would (type, then choices): (ok, value, why-not)."""
    try:
        value = action.type(text) if callable(action.type) else text
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return False, None, f"'{text}' is not {_article(_type_name(action))}"
    if action.choices and value not in action.choices:
        return False, None, f"'{text}' is not {_type_name(action)}{choice_hint(text, action.choices)}"
    return True, value, ""


def _article(name: str) -> str:
    if name.startswith(("one of", "true or")):
        return name
    return ("an " if name[:1] in "aeiou" else "a ") + name


def _check_yaml_value(key: str, value: Any, action: argparse.Action, type_text: str) -> str | None:
    """The problem with one YAML value, or None. Strings go through argparse's converter (argparse converts string
    defaults); other values reach the dataclass untouched, so they are checked against the field's type here."""
    where = "in the config file"
    if value is None:
        if "None" in type_text or "Optional" in type_text:
            return None
        return (f"{key}: null {where}, but the field needs {_article(_type_name(action))}; "
                "remove the line to use the default")
    items = value if (action.nargs in ("+", "*") and isinstance(value, list)) else [value]
    for item in items:
        if isinstance(item, str):
            ok, _, why = _convert(action, item)
            if not ok:
                return f"{key}: {why} ({where})"
            continue
        kind = getattr(action.type, "__name__", "")
        if isinstance(item, bool) and kind != "string_to_bool" and "bool" not in type_text and key not in _BOOL_OK:
            # YAML 1.1 reads bare no/yes/off/on as booleans: `save_strategy: no` arrives as False.
            return (f"{key}: YAML read the value as the boolean {str(item).lower()} ({where}); write it in quotes "
                    f"(YAML reads bare no/yes/on/off as true/false), expected {_type_name(action)}")
        if action.choices:
            if item not in action.choices and str(item) not in [str(c) for c in action.choices]:
                return f"{key}: {item!r} is not {_type_name(action)} ({where})"
        elif kind == "int":
            if isinstance(item, bool) or not isinstance(item, int):
                return f"{key}: {item!r} is not an integer ({where}); write a whole number"
        elif kind == "float":
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                return f"{key}: {item!r} is not a number ({where}); e.g. {key}: 1.0e-5"
        elif kind == "string_to_bool":
            if not isinstance(item, bool):
                return f"{key}: {item!r} is not true or false ({where})"
        elif kind in ("str", "dict"):
            allowed = []
            if "dict" in type_text:
                allowed.append(dict)
            if "list" in type_text:
                allowed.append(list)
            if "int" in type_text or "float" in type_text:
                allowed += [int, float]
            if "bool" in type_text or key in _BOOL_OK:
                allowed.append(bool)
            if not isinstance(item, tuple(allowed) or (str,)):
                expected = "text" if kind == "str" else "a mapping"
                return f"{key}: {item!r} is {type(item).__name__}, not {expected} ({where}); quote it or fix the value"
    return None


def _cli_chunks(argv: Sequence[str]) -> tuple[list[list[str]], list[str]]:
    """Split argv into [flag, value...] groups; tokens before the first flag are strays."""
    chunks: list[list[str]] = []
    strays: list[str] = []
    for tok in argv:
        if tok.startswith("--") and len(tok) > 2:
            chunks.append([tok])
        elif chunks:
            chunks[-1].append(tok)
        else:
            strays.append(tok)
    return chunks, strays


def _resolve_flag(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    exact = parser._option_string_actions.get(flag)
    if exact is not None:
        return exact
    if not parser.allow_abbrev:
        return None
    # argparse accepts an unambiguous prefix (allow_abbrev); accept what it accepts.
    matches = {a for s, a in parser._option_string_actions.items() if s.startswith(flag)}
    return matches.pop() if len(matches) == 1 else None


def _check_cli_chunk(parser: argparse.ArgumentParser, chunk: list[str], known: set[str]) -> str | None:
    head, values = chunk[0], chunk[1:]
    flag, eq, inline = head.partition("=")
    if eq:
        values = [inline, *values]
    name = flag[2:]
    if flag in ("--help",):
        return None
    action = _resolve_flag(parser, flag)
    if action is None:
        return unknown_key_message(name, known, "command line")
    dest = action.dest
    where = "on the command line"
    if action.nargs == 0:
        if values:
            return f"{dest}: {flag} takes no value, got {' '.join(values)!r} ({where})"
        return None
    if action.nargs is None and len(values) != 1:
        got = "no value" if not values else f"{len(values)} values ({' '.join(values)})"
        hint = "; lists and mappings are passed as one JSON string" if len(values) > 1 else ""
        return f"{dest}: {flag} needs one value, got {got} ({where}){hint}"
    if action.nargs == "?" and len(values) > 1:
        return f"{dest}: {flag} takes at most one value, got {' '.join(values)!r} ({where})"
    if action.nargs == "+" and not values:
        return f"{dest}: {flag} needs at least one value ({where})"
    for text in values:
        ok, _, why = _convert(action, text)
        if not ok:
            return f"{dest}: {why} ({where})"
    return None


def check_values(
    parser: argparse.ArgumentParser, dataclass_types: Sequence[type], config: Mapping[str, Any], argv: Sequence[str]
) -> list[str]:
    """Every bad YAML value, unknown or bad command-line flag, as messages. Unknown YAML keys: parse_recipe_args."""
    types = _field_types(dataclass_types)
    actions = _actions_by_dest(parser)
    problems = []
    for key, value in config.items():
        action = actions.get(key)
        if action is not None:
            problem = _check_yaml_value(key, value, action, types.get(key, ""))
            if problem:
                problems.append(problem)
    chunks, strays = _cli_chunks(argv)
    if strays:
        problems.append(f"command line: unexpected arguments {strays}; every setting is a --field value pair")
    for chunk in chunks:
        problem = _check_cli_chunk(parser, chunk, set(types))
        if problem:
            problems.append(problem)
    return problems


# --------------------------------------------------------------------------------------------------- 2. dataclasses


def _raise_instead_of_exit(message: str) -> None:
    raise _ArgparseError(message)


def build_dataclasses(parser, argv: Sequence[str]) -> tuple[list[Any], list[str]]:
    """argv (+ the YAML already set as defaults) -> (dataclass instances, leftover strings), or ConfigError listing the
    batch-geometry problems and every dataclass whose __post_init__ refused its values.

    This is HfArgumentParser.parse_args_into_dataclasses without the `.args` file lookup, building each dataclass
    separately so that all their problems are reported at once.
    """
    parser.error = _raise_instead_of_exit  # argparse would print usage and SystemExit; check_values ran first anyway
    try:
        namespace, rest = parser.parse_known_args(args=list(argv))
    except _ArgparseError as exc:
        raise ConfigError([f"command line: {exc}"]) from None
    values = vars(namespace)
    problems = batch_problems(values, num_processes()) if "num_generations" in values else []
    outputs = []
    for dtype in parser.dataclass_types:
        keys = {f.name for f in fields(dtype) if f.init}
        inputs = {k: values[k] for k in keys if k in values}
        try:
            outputs.append(dtype(**inputs))
        except (ValueError, TypeError) as exc:
            message = str(exc).strip().strip("'\"")
            if problems and any(w in message for w in _BATCH_WORDS):
                continue  # the same problem, already explained by batch_problems with its fix
            problems.append(_attribute(dtype, keys, message))
    if problems:
        raise ConfigError(problems + _static_on_raw_values(values, problems))
    return outputs, rest


def _static_on_raw_values(values: dict[str, Any], already: list[str]) -> list[str]:
    """A config whose dataclasses cannot be built still gets the config-alone checks, run on the raw values, so a
    batch problem does not hide a bad learning rate or an output-dir conflict until the next attempt."""
    raw = SimpleNamespace(**values)
    if "scale_rewards" in values:  # as GRPOConfig.__post_init__ maps it
        raw.scale_rewards = {True: "group", False: "none"}.get(raw.scale_rewards, raw.scale_rewards)
    try:
        errors, warnings = checks.static_checks(raw, raw)
    except (AttributeError, TypeError, ValueError) as exc:  # a raw value too broken to check: its error is reported
        logger.debug("static checks skipped on unparsed values: %s", exc)
        return []
    checks.report_warnings(warnings)
    return [e for e in errors if e not in already]


def _attribute(dtype: type, keys: set[str], message: str) -> str:
    """Name the field(s) a __post_init__ message is about, unless the message already starts with one."""
    first = message.split(":")[0].split()[0].strip("`'-") if message else ""
    if first.split("[")[0] in keys:
        return message
    mentioned = sorted(k for k in keys if f"{k}" in message and len(k) > 3)
    # prefer the longest names: "epsilon_high" also contains "epsilon"
    mentioned = [k for k in mentioned if not any(k != o and k in o for o in mentioned)]
    return f"{', '.join(mentioned[:3]) or dtype.__name__}: {message}"
