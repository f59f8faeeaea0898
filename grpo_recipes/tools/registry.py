"""Named tools and environments: the `@tool` and `@environment` decorators, the guard every tool runs behind, and
what a tool message says went wrong.

A tool is a plain function in a file under a tools folder (loaded by path, like rewards):

    @tool(timeout_s=10)
    def calculator(expression: str) -> str:
        '''Evaluate an arithmetic expression exactly.

        Args:
            expression: The expression, e.g. "12 * (3 + 4)".
        '''

Its contract is TRL's (transformers.utils.get_json_schema): the function's name is the tool's name, type hints and
a Google-style docstring give the JSON schema the model sees. Keyword-only parameters (after `*`) are settings a
config sets under `params:`; they are not shown to the model.

The guard turns everything that can go wrong into a tool message the model reads, never an exception in the
trainer: arguments that do not fit the signature, a ToolError the tool raises on bad input, any other exception,
a call that outlives `timeout_s`, an oversized result. TRL 1.16 only catches exceptions (no timeout: a hung sync
tool stalls the step forever) and reports them as "{'error': '...'}"; the guard answers first, so TRL's
`tools/failure_frequency` stays 0 and the error metrics come from `classify` (see episodes.tool_metrics).
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from transformers.utils import get_json_schema

from .. import bundled
from ..values import choice_hint, value_problem
from .episodes import ERROR_KINDS, error_message
from .templates import INVALID_CALL

MAX_RESULT_CHARS = 1000  # a tool result eats completion budget; past max_completion_length TRL drops the turn


class ToolError(Exception):
    """Raised by a tool for input it refuses (an expected failure): the model sees `error (kind): message`."""

    def __init__(self, message: str, kind: str = "tool_error"):
        if kind not in ERROR_KINDS:
            raise ValueError(f"ToolError kind must be one of {ERROR_KINDS}, got {kind!r}")
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class ToolDef:
    name: str
    func: Callable
    source: str
    timeout_s: float
    settings: dict[str, Any] = field(default_factory=dict)  # keyword-only parameter -> default
    setting_types: dict[str, Any] = field(default_factory=dict)  # keyword-only parameter -> its annotation


_TOOLS: dict[str, ToolDef] = {}
_hung = 0  # calls abandoned after their timeout whose threads are still running
_hung_lock = threading.Lock()


def tool(func: Callable | None = None, *, timeout_s: float = 10.0):
    """Register a tool under its function's name. Checks its schema now, so a bad tool fails at import."""

    def register(f: Callable) -> Callable:
        name = f.__name__
        source = inspect.getsourcefile(f) or "<unknown>"
        if name == INVALID_CALL:
            raise ValueError(f"tool '{name}' ({source}): the name is reserved for malformed calls")
        if not timeout_s > 0:
            raise ValueError(f"tool '{name}' ({source}): timeout_s must be > 0")
        sig = inspect.signature(f)
        settings = {p.name: p.default for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY}
        missing = [k for k, v in settings.items() if v is inspect.Parameter.empty]
        if missing or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
            raise TypeError(f"tool '{name}' ({source}): settings (keyword-only) need defaults and *args/**kwargs "
                            "hide the contract")
        hints = typing.get_type_hints(f, include_extras=True)
        new = ToolDef(name, f, source, float(timeout_s), settings, {k: hints.get(k, Any) for k in settings})
        old = _TOOLS.get(name)
        if old is not None and old.source != source:
            raise ValueError(f"tool name '{name}' is defined twice: in {old.source} and in {source}")
        guarded(new, {})  # builds the schema: a missing type hint or docstring entry raises here, naming the tool
        _TOOLS[name] = new
        return f

    return register(func) if func is not None else register


def registered() -> dict[str, ToolDef]:
    return dict(sorted(_TOOLS.items()))


def hung_calls() -> int:
    return _hung


def _run_with_timeout(func: Callable, kwargs: dict, timeout_s: float) -> tuple[bool, Any]:
    """(finished, result-or-exception). A thread, because a sync tool cannot be interrupted: one that never returns
    keeps its daemon thread (counted by hung_calls) while training goes on. Tools that run untrusted or unbounded
    work must bound it themselves (the python tool runs in the sandbox, which kills the program)."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["result"] = func(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported to the model, never raised in the trainer
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name=f"tool-{getattr(func, '__name__', 'call')}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        global _hung
        with _hung_lock:
            _hung += 1
        return False, None
    return True, box.get("error", box.get("result"))


def _coerce(value: Any, annotation: Any) -> Any:
    # Lossless only: a number where a string is expected is the common slip (`{"expression": 12}`).
    if annotation is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def guarded(tdef: ToolDef, params: dict[str, Any], max_chars: int = MAX_RESULT_CHARS) -> Callable[..., str]:
    """The callable handed to TRL: model-visible parameters only, always returns a string."""
    unknown = set(params) - set(tdef.settings)
    if unknown:
        raise ValueError(f"tools: '{tdef.name}' has no setting {sorted(unknown)}; it accepts: "
                         f"{', '.join(tdef.settings) or 'none'}")
    settings = {**tdef.settings, **params}
    sig = inspect.signature(tdef.func)
    visible = [p for p in sig.parameters.values() if p.kind is not p.KEYWORD_ONLY]
    public_sig = sig.replace(parameters=visible)
    resolved = typing.get_type_hints(tdef.func)  # `from __future__ import annotations` leaves strings in the signature
    hints = {k: v for k, v in getattr(tdef.func, "__annotations__", {}).items() if k not in tdef.settings}
    names = ", ".join(p.name for p in visible if p.name != "self") or "none"

    def call(*args, **kwargs) -> str:
        try:
            bound = public_sig.bind(*args, **kwargs)
        except TypeError as exc:
            return error_message("bad_arguments", f"{tdef.name}: {exc}; its arguments are: {names}")
        values = {k: _coerce(v, resolved.get(k)) for k, v in bound.arguments.items()}
        finished, out = _run_with_timeout(tdef.func, {**values, **settings}, tdef.timeout_s)
        if not finished:
            return error_message("timeout", f"{tdef.name} did not answer within {tdef.timeout_s:g}s")
        if isinstance(out, ToolError):
            text = error_message(out.kind, str(out))
        elif isinstance(out, BaseException):
            text = error_message("exception", f"{type(out).__name__}: {out}")
        else:
            text = str(out)
        return text if len(text) <= max_chars else text[:max_chars] + f"... [{len(text) - max_chars} chars cut]"

    functools.update_wrapper(call, tdef.func)
    del call.__wrapped__  # the schema must come from the public signature below, not the original's
    call.__signature__ = public_sig
    call.__annotations__ = hints
    get_json_schema(call)  # raises DocstringParsingException / TypeHintParsingException naming the tool
    return call


def invalid_call_handler(known: Callable[[], list[str]] | None = None) -> Callable[..., str]:
    """Answers INVALID_CALL, the call tool_templates.parse_assistant makes of a malformed <tool_call> block."""

    def invalid_tool_call(problem: str = "", text: str = "", kind: str = "malformed", **_ignored) -> str:
        kind = kind if kind in ("malformed", "unknown_tool") else "malformed"  # the model can write this call too
        hint = 'write <tool_call>\n{"name": <tool name>, "arguments": {...}}\n</tool_call>'
        if kind == "unknown_tool" and known is not None:
            hint = f"the tools are: {', '.join(known())}"
        return error_message(kind, f"{problem}; {hint}")

    invalid_tool_call.__name__ = INVALID_CALL
    return invalid_tool_call


def _spec(entry: Any) -> tuple[Any, dict]:
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, dict):
        return entry.get("name"), entry.get("params") or {}
    return None, {}


def check_tool_specs(specs: list, environment_spec: Any, known: dict[str, ToolDef],
                     known_envs: dict[str, type]) -> list[str]:
    """All problems with a config's `tools:` and `environment:`, as messages naming the field and the fix."""
    env_name, env_params = _spec(environment_spec) if environment_spec is not None else (None, None)
    problems, names = [], []
    for i, entry in enumerate(specs):
        where = f"tools[{i}]"
        if isinstance(entry, dict) and set(entry) - {"name", "params"}:
            problems.append(f"{where}: unknown keys {sorted(set(entry) - {'name', 'params'})}; allowed: name, params")
        name, params = _spec(entry)
        if not isinstance(name, str):
            problems.append(f"{where}: expected a tool name or a mapping {{name, params}}, got {entry!r}")
            continue
        if name not in known:
            problems.append(f"{where}: unknown tool '{name}'{choice_hint(name, list(known))}. Known tools: "
                            f"{', '.join(known) or 'none'} (`tool_dirs` adds folders of tool files)")
            continue
        names.append(name)
        if not isinstance(params, dict):
            problems.append(f"{where}.params: expected a mapping of setting -> value, got {params!r}")
            continue
        tdef = known[name]
        for p in sorted(set(params) - set(tdef.settings)):
            problems.append(f"{where}.params.{p}: tool '{name}' has no setting '{p}'; it accepts: "
                            f"{', '.join(tdef.settings) or 'none'}")
        for p in sorted(set(params) & set(tdef.settings)):
            if why := value_problem(params[p], tdef.setting_types.get(p, Any)):
                problems.append(f"{where}.params.{p}: {why}")
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"tools: '{dup}' appears twice; list each tool once")
    if environment_spec is not None:
        name, params = env_name, env_params
        if name not in known_envs:
            problems.append(f"environment: unknown environment {name!r}{choice_hint(name, list(known_envs))}. Known "
                            f"environments: {', '.join(known_envs) or 'none'}")
        else:
            methods = environment_tools(known_envs[name])
            for clash in sorted(set(methods) & set(names)):  # TRL silently lets the method replace the tool
                problems.append(f"tools: '{clash}' is also a method of environment '{name}', which would replace "
                                "it in every rollout; rename one of them")
            try:
                inspect.signature(known_envs[name]).bind(**params)
            except TypeError as exc:
                problems.append(f"environment.params: {exc}; environment '{name}' is built as {name}(**params)")
    return problems


def build_tools(specs: list, known: dict[str, ToolDef]) -> list[Callable[..., str]]:
    """YAML `tools:` entries ({name, params}) -> guarded callables for GRPOTrainer(tools=...).
    Call check_tool_specs first; this raises ValueError on what it would have reported."""
    problems = check_tool_specs(specs, None, known, {})
    if problems:
        raise ValueError("; ".join(problems))
    return [guarded(known[name], params) for name, params in map(_spec, specs)]


def recipe_tools(recipe) -> list[Callable[..., str]]:
    """The recipe's `tools:`, guarded (none without them). Checked at start-up (check_tool_specs)."""
    return build_tools(recipe.tools, available(recipe.tool_dirs or ())) if recipe.tools else []


def build_environment(spec: Any, known_envs: dict[str, type]) -> Callable[[], Any] | None:
    """YAML `environment:` -> the factory TRL calls once per rollout (the class, with its params bound)."""
    if spec is None:
        return None
    name, params = _spec(spec)
    return functools.partial(known_envs[name], **params) if params else known_envs[name]


def environment_tools(cls: type) -> list[str]:
    """The tools TRL takes from an environment class: its public functions but reset and get_reward."""
    return sorted(n for n, f in inspect.getmembers(cls, inspect.isfunction)
                  if not n.startswith("_") and n not in ("reset", "get_reward"))


# ---- discovery: the same folder search and by-path loading as rewards (registry.py), with its own name table ------

def available(extra: Iterable[str | os.PathLike] = ()) -> dict[str, ToolDef]:
    bundled.TOOLS.load(extra)
    return registered()


# ---- environments: a class per rollout (TRL environment_factory), its public methods are its tools ---------------

_ENVIRONMENTS: dict[str, type] = {}


def environment(name: str, *, timeout_s: float = 10.0):
    """Register an environment class under `name`. TRL's contract: `reset(**row)` (every dataset column, `prompt`
    included) returning text appended to the last user turn or None; each public method is a tool (type hints and
    a Google docstring); an optional `get_reward()` scores the rollout from the instance's state. Each public method
    is wrapped in the same guard as a tool, so its failures are tool messages too."""

    def register(cls: type) -> type:
        source = inspect.getsourcefile(cls) or "<unknown>"
        if not callable(getattr(cls, "reset", None)):
            raise TypeError(f"environment '{name}' ({source}): needs a reset(self, **row) method")
        for attr, func in list(vars(cls).items()):
            if attr.startswith("_") or attr in ("reset", "get_reward") or not inspect.isfunction(func):
                continue
            tdef = ToolDef(attr, func, source, float(timeout_s), {})
            g = guarded(tdef, {})  # checks the schema now; the bound method hides `self` from it
            cls_method = _method(g)
            setattr(cls, attr, cls_method)
        old = _ENVIRONMENTS.get(name)
        if old is not None and inspect.getsourcefile(old) != source:
            raise ValueError(f"environment name '{name}' is defined twice: in {inspect.getsourcefile(old)} and "
                             f"{source}")
        _ENVIRONMENTS[name] = cls
        return cls

    return register


def _method(g: Callable) -> Callable:
    """A guarded function used as a method: TRL lists methods with inspect.isfunction and calls them bound."""

    def method(self, *args, **kwargs):
        return g(self, *args, **kwargs)

    functools.update_wrapper(method, g)
    del method.__wrapped__
    method.__signature__ = g.__signature__
    return method


def environments() -> dict[str, type]:
    return dict(sorted(_ENVIRONMENTS.items()))
