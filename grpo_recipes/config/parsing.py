"""Reading a config's values: the file's values and the command line's flags, each checked the way argparse would
convert it, then built into the run's dataclasses (RecipeArguments, the last stage's training config, ModelConfig).
config/resolve.py decides which values go in; this module reads and builds them.

1. values, before argparse sees them: every YAML value and every command-line value is converted the way argparse
   would convert it, through the argparse actions the parser created (`Parser.actions`, kept as add_argument returns
   them). argparse stops at the first bad value with `SystemExit` and a usage dump; here each bad value becomes one
   `ConfigError` entry that names the field, what was given and what is expected.
2. dataclasses: each is built one by one, so the `__post_init__` ValueError of one does not hide the problems of
   another. The batch geometry is checked on the raw values first (batching.batch_problems), with the fix spelled out,
   because GRPOConfig's own message says what is wrong but not what to change; when a dataclass cannot be built, the
   config-alone checks still run on the raw values.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from trl import TrlParser

from ..errors import ConfigError
from ..values import annotations, choice_hint, did_you_mean, init_fields
from . import checks
from .batching import batch_problems, num_processes

logger = logging.getLogger("grpo_recipes")

# Words in a GRPOConfig.__post_init__ ValueError that mean "the batch geometry is wrong": when `batch_problems` has
# already explained that problem with its fix, TRL's shorter message about the same thing is dropped.
_BATCH_WORDS = ("generation_batch_size", "num_generations", "global batch size", "steps_per_generation",
                "generations per prompt")

# Text fields that TRL also documents as taking true/false (GRPOConfig.__post_init__ maps them to group/none).
_BOOL_OK = {"scale_rewards"}


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


class Parser(TrlParser):
    """TrlParser over the run's dataclasses. It keeps each flag's argparse action as `add_argument` returns it, so the
    checks below read the actions' public attributes (type, choices, nargs), and it raises ConfigError where argparse
    would print usage and exit."""

    def __init__(self, dataclass_types: Sequence[type]):
        self.actions: dict[str, argparse.Action] = {}  # "--flag" -> its action
        self.types = tuple(dataclass_types)
        super().__init__(self.types, allow_abbrev=False)  # --max_step is a typo, not max_steps

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        for option in action.option_strings:
            self.actions[option] = action
        return action

    def error(self, message: str):
        raise ConfigError([f"command line: {message}"])

    def field_action(self, name: str) -> argparse.Action | None:
        """The action of a field's `--name` flag (a bool field also has a `--no_name` one)."""
        return self.actions.get(f"--{name}")

    def known(self) -> set[str]:
        return {name for cls in self.types for name in init_fields(cls)}


def unknown_key_message(key: str, known: set[str], where: str) -> str:
    close = did_you_mean(key, known)
    hint = f"did you mean `{close}`?" if close else "see `--help` for the accepted fields"
    return f"{key}: unknown field in the {where}; {hint}"


# ------------------------------------------------------------------------------------------------------- 1. values


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


def _check_cli_chunk(parser: Parser, chunk: list[str], known: set[str]) -> str | None:
    head, values = chunk[0], chunk[1:]
    flag, eq, inline = head.partition("=")
    if eq:
        values = [inline, *values]
    name = flag[2:]
    if flag in ("--help",):
        return None
    action = parser.actions.get(flag)
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


def check_values(parser: Parser, values: Mapping[str, Any], argv: Sequence[str]) -> list[str]:
    """Every bad config value, unknown or bad command-line flag, as messages. Unknown config keys: unknown_keys."""
    types = {name: text for cls in parser.types for name, text in annotations(cls).items()}
    problems = []
    for key, value in values.items():
        action = parser.field_action(key)
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


def unknown_keys(values: Mapping[str, Any], parser: Parser) -> list[str]:
    """A config file's keys that are no field, each with a did-you-mean."""
    known = parser.known()
    return [unknown_key_message(k, known, "config file") for k in values if k not in known]


# --------------------------------------------------------------------------------------------------- 2. dataclasses


def namespace(parser: Parser, values: Mapping[str, Any], argv: Sequence[str]) -> dict[str, Any]:
    """Every field's value: `values` as the defaults, the flags over them, each converted by argparse. Call
    check_values first: a bad value here is reported as argparse words it."""
    parser.set_defaults_with_config(**values)
    parsed, rest = parser.parse_known_args(args=list(argv))
    flags = [a[2:].split("=")[0] for a in rest if a.startswith("--")]
    if flags or rest:
        known = parser.known()
        raise ConfigError([unknown_key_message(f, known, "command line") for f in flags]
                          or [f"unexpected arguments {rest}"])
    return vars(parsed)


def build(parser: Parser, values: Mapping[str, Any]) -> list[Any]:
    """Each dataclass from the fields' values, or ConfigError listing the batch-geometry problems and every dataclass
    whose __post_init__ refused its values. HfArgumentParser.parse_args_into_dataclasses without the `.args` file
    lookup, building each dataclass separately so that all their problems are reported at once. The values are
    copied: a __post_init__ that normalises a list in place leaves `values` as they were."""
    problems = batch_problems(values, num_processes()) if "num_generations" in values else []
    outputs = []
    for dtype in parser.types:
        keys = set(init_fields(dtype))
        inputs = {k: copy.deepcopy(values[k]) for k in keys if k in values}
        try:
            outputs.append(dtype(**inputs))
        except (ValueError, TypeError) as exc:
            message = str(exc).strip().strip("'\"")
            if problems and any(w in message for w in _BATCH_WORDS):
                continue  # the same problem, already explained by batch_problems with its fix
            problems.append(_attribute(dtype, keys, message))
    if problems:
        raise ConfigError(problems + checks.raw_problems(dict(values), problems))
    return outputs


def _attribute(dtype: type, keys: set[str], message: str) -> str:
    """Name the field(s) a __post_init__ message is about, unless the message already starts with one."""
    first = message.split(":")[0].split()[0].strip("`'-") if message else ""
    if first.split("[")[0] in keys:
        return message
    mentioned = sorted(k for k in keys if f"{k}" in message and len(k) > 3)
    # prefer the longest names: "epsilon_high" also contains "epsilon"
    mentioned = [k for k in mentioned if not any(k != o and k in o for o in mentioned)]
    return f"{', '.join(mentioned[:3]) or dtype.__name__}: {message}"
