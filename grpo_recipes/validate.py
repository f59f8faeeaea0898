"""Start-up validation: everything that can be checked before a model or a dataset is loaded, reported together.

The checks run in the stages of `runner.prepare`, each collecting every problem before anything stops:

1. values (`config.parse_recipe_args`, before argparse sees them): every YAML value and every command-line value is
   converted the way argparse would convert it. argparse stops at the first bad value with `SystemExit` and a usage
   dump; here each bad value becomes one `ConfigError` entry that names the field, what was given and what is expected.
2. dataclasses: RecipeArguments, GRPOConfig and ModelConfig are built one by one, so the `__post_init__` ValueError of
   one does not hide the problems of another. The batch geometry is checked on the raw values first, with the fix
   spelled out, because GRPOConfig's own message says what is wrong but not what to change.
3. static (`runner.static_problems`): ranges, the string choices TRL only checks deep inside a training step, output
   directory versus resume/overwrite, vLLM. Out-of-the-ordinary but legal values are warnings, not errors.
4. data (`runner.prepare`, after loading): enough distinct prompts for one generation batch.

Every message starts with the field name and ends with the fix.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import fields
from types import SimpleNamespace
from typing import Any

from .config import ConfigError, unknown_key_message

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

# Words in a GRPOConfig.__post_init__ ValueError that mean "the batch geometry is wrong": when `batch_problems` has
# already explained that problem with its fix, TRL's shorter message about the same thing is dropped.
_BATCH_WORDS = ("generation_batch_size", "num_generations", "global batch size", "steps_per_generation",
                "generations per prompt")


# Text fields that TRL also documents as taking true/false (GRPOConfig.__post_init__ maps them to group/none).
_BOOL_OK = {"scale_rewards"}


class _ArgparseError(Exception):
    pass


def num_processes() -> int:
    """Training processes: WORLD_SIZE is set by `accelerate launch` and torchrun, and absent for a plain `python`."""
    return max(int(os.environ.get("WORLD_SIZE", "1")), 1)


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


def _choice_hint(value: Any, choices: Sequence[Any]) -> str:
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _convert(action: argparse.Action, text: str) -> tuple[bool, Any, str]:
    """Convert one string as argparse would (type, then choices): (ok, value, why-not)."""
    try:
        value = action.type(text) if callable(action.type) else text
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return False, None, f"'{text}' is not {_article(_type_name(action))}"
    if action.choices and value not in action.choices:
        return False, None, f"'{text}' is not {_type_name(action)}{_choice_hint(text, action.choices)}"
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
    """Every bad YAML value, unknown or bad command-line flag, as messages. Unknown YAML keys are config.py's job."""
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
    """A config whose dataclasses cannot be built still gets the static checks, run on the raw values, so a batch
    problem does not hide a bad learning rate or an output-dir conflict until the next attempt."""
    if "num_generations" not in values:  # not a GRPO config (SFT warm-up): the static checks are GRPO's
        return []
    raw = SimpleNamespace(**values)
    raw.scale_rewards = {True: "group", False: "none"}.get(raw.scale_rewards, raw.scale_rewards)  # as __post_init__
    try:
        errors, warnings = static_checks(raw, raw)
    except (AttributeError, TypeError, ValueError) as exc:  # a raw value too broken to check: its error is reported
        logger.debug("static checks skipped on unparsed values: %s", exc)
        return []
    report_warnings(warnings)
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


def _divisors(n: int, lo: int = 2) -> list[int]:
    return [d for d in range(lo, n + 1) if n % d == 0]


def batch_problems(v: Mapping[str, Any], processes: int) -> list[str]:
    """The generation batch must hold whole groups of num_generations completions of the same prompt.

    generation batch = per_device_train_batch_size × processes × steps_per_generation (steps_per_generation defaults
    to gradient_accumulation_steps), or generation_batch_size when that is given instead. GRPOConfig.__post_init__
    checks the divisibility (with WORLD_SIZE processes) but does not say what to change; the evaluation batch is
    checked only when evaluation is on.
    """
    problems = []
    ng = v.get("num_generations")
    pdb = v.get("per_device_train_batch_size") or 0
    gas = v.get("gradient_accumulation_steps") or 0
    gbs, spg = v.get("generation_batch_size"), v.get("steps_per_generation")
    for name, value in (("per_device_train_batch_size", pdb), ("gradient_accumulation_steps", gas)):
        if value < 1:
            problems.append(f"{name}: {value}; it must be at least 1")
    if ng is None or ng < 2:
        problems.append(
            f"num_generations: {ng}; GRPO needs at least 2 completions per prompt to compute group-relative "
            "advantages. Use 4-16 (e.g. --num_generations 8)"
        )
    if problems:
        return problems
    if gbs is not None and spg is not None:
        return [
            "generation_batch_size, steps_per_generation: both set; set only one, the other follows from "
            "generation_batch_size = per_device_train_batch_size × processes × steps_per_generation"
        ]
    global_batch = pdb * processes
    if gbs is not None:
        if gbs % global_batch:
            up = math.ceil(gbs / global_batch) * global_batch
            return [
                f"generation_batch_size: {gbs} is not a multiple of per_device_train_batch_size × processes = "
                f"{pdb} × {processes} = {global_batch}; use {up} (or unset it and set steps_per_generation)"
            ]
        generation, how = gbs, f"generation_batch_size {gbs}"
    else:
        steps = spg or gas
        generation = global_batch * steps
        source = "steps_per_generation" if spg else "gradient_accumulation_steps"
        how = (f"per_device_train_batch_size {pdb} × {processes} process{'es' if processes > 1 else ''} × "
               f"{source} {steps} = {generation}")
    if generation % ng:
        per_step = generation // max(pdb, 1)  # completions per unit of per_device_train_batch_size
        better_pdb = next(p for p in range(pdb, pdb * ng + 1) if (p * per_step) % ng == 0)
        fits = [d for d in _divisors(generation) if d <= max(ng * 2, 16)]
        alt = f" or num_generations to one of {fits}" if fits else ""
        problems.append(
            f"num_generations: the generation batch ({how}) is not a multiple of num_generations {ng}, so a "
            f"prompt's completions would be split across batches. Fix: set per_device_train_batch_size to "
            f"{better_pdb}{alt}"
        )
    strategy = v.get("eval_strategy") or "no"
    if str(getattr(strategy, "value", strategy)) != "no":  # TrainingArguments turns do_eval on exactly then
        ng_eval = v.get("num_generations_eval") or ng
        eval_batch = (v.get("per_device_eval_batch_size") or 0) * processes
        if ng_eval and eval_batch % ng_eval:
            problems.append(
                f"per_device_eval_batch_size: the evaluation batch ({eval_batch} = per_device_eval_batch_size × "
                f"processes) is not a multiple of num_generations_eval {ng_eval}; use a multiple of {ng_eval}"
            )
    return problems


# -------------------------------------------------------------------------------------------------------- 3. static


def static_checks(recipe, grpo, model_args=None) -> tuple[list[str], list[str]]:
    """(errors, warnings) visible from the parsed config alone. Loads nothing."""
    from . import checkpoint

    errors: list[str] = []
    warnings: list[str] = []

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
            errors.append(f"{name}: '{value}' is not one of {', '.join(choices)}{_choice_hint(value, choices)}")
    if recipe.trackio_group and "trackio" not in (grpo.report_to or []):
        errors.append(f"trackio_group: '{recipe.trackio_group}' groups Trackio runs, but report_to is "
                      f"{grpo.report_to or 'none'}; add trackio to report_to, or drop trackio_group")
    rate, window = recipe.max_reward_failure_rate, recipe.reward_failure_window
    if not 0 <= rate <= 1:
        errors.append(f"max_reward_failure_rate: {rate:g}; it is a fraction between 0 and 1 (1 never stops the run)")
    if window < 1:
        errors.append(f"reward_failure_window: {window}; it is a number of completions, at least 1")
    errors += checkpoint.output_dir_problems(recipe, grpo)
    errors += vllm_problems(grpo, model_args)
    return errors, warnings


def vllm_problems(grpo, model_args=None) -> list[str]:
    from .vllm_check import check_vllm

    return check_vllm(
        grpo.use_vllm, grpo.vllm_mode, grpo.vllm_server_host, grpo.vllm_server_port, grpo.vllm_server_timeout,
        base_url=grpo.vllm_server_base_url, model=getattr(model_args, "model_name_or_path", None),
    )


# ---------------------------------------------------------------------------------------------------------- 4. data


def data_problems(grpo, train) -> list[str]:
    """TRL's RepeatSampler drops an incomplete last group of prompts: with fewer distinct training prompts than one
    generation batch needs, it yields no batch at all and training stops at step 0 without an error."""
    prompts_per_generation = grpo.generation_batch_size // grpo.num_generations
    if len(train) < prompts_per_generation:
        return [
            f"train_size: the dataset has {len(train)} training rows, but one generation batch needs "
            f"{prompts_per_generation} distinct prompts (generation_batch_size {grpo.generation_batch_size} / "
            f"num_generations {grpo.num_generations}). Fix: more training rows, or a smaller "
            "per_device_train_batch_size"
        ]
    return []


def report_warnings(warnings: Sequence[str]) -> None:
    for w in warnings:
        logger.warning("config: %s", w)
