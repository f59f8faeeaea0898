"""Named rewards: discovery of `rewards/*.py`, the `@reward` decorator, and compilation into TRL reward functions.

A reward is a plain function in a file under a rewards folder:

    @reward("math_correctness")
    def math_correctness(completions, answer, *, timeout_s: float = 5.0):
        ...

Its signature is its contract, so nothing is declared twice:
- `completions`: the completion texts (str), one per sampled completion.
- parameters with no default after it: dataset columns it reads (one value per completion).
- keyword parameters with a default: settings a YAML config may set under `params:`. Their annotations say which
  values they accept (`check_specs` reports any other before the model loads): bool, int, float, str, a class,
  `Literal[...]`, `X | None`, and `Annotated[float, Range(gt=0)]` for bounds. An unannotated one takes any value.
- the context names in CONTEXT_NAMES, when present, are filled in from the trainer.
It returns one float or None per completion. None means "could not score" and is excluded by TRL.

Reward files are loaded by path under a private module prefix, so no top-level `rewards` package is ever
imported or installed, and a file dropped into a rewards folder is usable by name with no other edit (the folder
search and the loader are bundled.py's, shared by every drop-in kind; a setting's annotation is checked with
values.py).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import threading
import types
import typing
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import bundled
from ..errors import RewardContractError, RewardFailureRateExceeded
from ..values import SUPPORTED, accepted, checkable, value_problem

logger = logging.getLogger(__name__)

# Names a reward may ask for that come from the trainer, not from the dataset or the config.
# `completion_messages`: the completions as TRL hands them (for a tool run, each one a list of chat messages: the
# assistant turns with their tool calls and the tool results); `completions` is their text. `environments`: the
# per-rollout environment instances of a run with an environment (None otherwise).
CONTEXT_NAMES = ("prompts", "completion_ids", "log_metric", "log_extra", "trainer_state", "completion_messages",
                 "environments")
PER_COMPLETION = ("prompts", "completion_ids", "completion_messages", "environments")


@dataclass(frozen=True)
class RewardDef:
    name: str
    func: Callable[..., list]
    source: str
    columns: tuple[str, ...]
    params: dict[str, Any]  # name -> default
    context: tuple[str, ...]
    role: str | None = None  # "format": scores the shape of an answer, not its truth (see default_format_reward)
    param_types: dict[str, Any] = field(default_factory=dict)  # name -> resolved annotation, for annotated params

    @property
    def doc(self) -> str:
        return (inspect.getdoc(self.func) or "").strip().splitlines()[0] if self.func.__doc__ else ""

    def describe_params(self) -> list[str]:
        """One line per parameter: its default and the values it accepts, as `rewards list` shows them."""
        return [f"{p}={default!r}  ({accepted(self.param_types.get(p, Any))})" for p, default in self.params.items()]


_REGISTRY: dict[str, RewardDef] = {}


ROLES = (None, "format")


def _describe(func: Callable, name: str, source: str, role: str | None = None) -> RewardDef:
    sig = inspect.signature(func)
    items = list(sig.parameters.values())
    if not items or items[0].name != "completions":
        raise TypeError(f"reward '{name}' ({source}): the first parameter must be `completions`")
    columns, params, context = [], {}, []
    for p in items[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"reward '{name}' ({source}): *args/**kwargs hide the contract; name each input")
        if p.name in CONTEXT_NAMES:
            context.append(p.name)
        elif p.default is inspect.Parameter.empty:
            columns.append(p.name)
        else:
            params[p.name] = p.default
    types_ = {n: _param_type(func, name, source, n, sig.parameters[n].annotation) for n in params
              if sig.parameters[n].annotation is not inspect.Parameter.empty}
    return RewardDef(name, func, source, tuple(columns), params, tuple(context), role, types_)


def _param_type(func: Callable, name: str, source: str, param: str, annotation: Any) -> Any:
    """A parameter's annotation, resolved (reward files may use `from __future__ import annotations`) and known to
    be checkable; a TypeError at registration otherwise, so a contract is never silently unchecked."""
    holder = types.SimpleNamespace(__annotations__={param: annotation})
    try:
        hint = typing.get_type_hints(holder, globalns=getattr(func, "__globals__", {}), include_extras=True)[param]
    except Exception as exc:
        raise TypeError(f"reward '{name}' ({source}): the annotation of parameter '{param}' ({annotation!r}) cannot "
                        f"be resolved: {exc}") from None
    if not checkable(hint):
        raise TypeError(f"reward '{name}' ({source}): parameter '{param}' is annotated {hint!r}, which the registry "
                        f"cannot check; use one of: {SUPPORTED}")
    return hint


def reward(name: str, *, role: str | None = None) -> Callable[[Callable], Callable]:
    """Register `func` under `name`. A second, different function under the same name is an error.
    role="format" marks a reward that scores an answer's shape: eval/format_rate and the format-hacking alert
    use it when the config names no format_reward."""
    if role not in ROLES:
        raise ValueError(f"reward '{name}': role must be one of {ROLES}, got {role!r}")

    def register(func: Callable) -> Callable:
        source = inspect.getsourcefile(func) or "<unknown>"
        new = _describe(func, name, source, role)
        old = _REGISTRY.get(name)
        if old is not None and (old.source != new.source or old.func.__qualname__ != func.__qualname__):
            raise ValueError(f"reward name '{name}' is defined twice: in {old.source} and in {new.source}")
        _REGISTRY[name] = new
        return func

    return register


def available(extra_dirs: Iterable[str | os.PathLike] = ()) -> dict[str, RewardDef]:
    """Every reward of the reward folders (bundled.REWARDS: `extra_dirs` first), by name."""
    bundled.REWARDS.load(extra_dirs)
    return dict(sorted(_REGISTRY.items()))


@dataclass
class RewardSpec:
    """One entry of a config's `rewards:` list."""

    name: str
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)
    alias: str | None = None  # metric name, for using one reward twice with different params

    @property
    def metric_name(self) -> str:
        return self.alias or self.name

    @classmethod
    def parse(cls, entry: Any, index: int) -> RewardSpec:
        where = f"rewards[{index}]"
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict) or "name" not in entry:
            raise ValueError(f"{where}: expected a mapping with a `name` (and optional weight, params), got {entry!r}")
        unknown = set(entry) - {"name", "weight", "params", "alias"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}; allowed: name, weight, params, alias")
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"{where}.weight: expected a finite number, got {weight!r}")
        params = entry.get("params") or {}
        if not isinstance(params, dict):
            raise ValueError(f"{where}.params: expected a mapping of parameter -> value, got {params!r}")
        return cls(str(entry["name"]), float(weight), dict(params), entry.get("alias"))


def default_format_reward(specs: list[RewardSpec], known: dict[str, RewardDef], correctness: str | None) -> str | None:
    """The configured reward with role "format" (not the correctness one), when there is exactly one; else None."""
    found = [s.metric_name for s in specs
             if s.name in known and known[s.name].role == "format" and s.metric_name != correctness]
    return found[0] if len(found) == 1 else None


def check_specs(
    specs: list[RewardSpec], known: dict[str, RewardDef], columns: Iterable[str] | None = None
) -> list[str]:
    """All problems with a rewards list, as messages that name the field and the fix. Empty when fine."""
    problems = []
    if not specs:
        problems.append("rewards: the list is empty; name at least one reward (see `grpo-recipes rewards list`)")
    names = [s.metric_name for s in specs]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"rewards: '{dup}' appears twice; give one of them an `alias` to log it separately")
    for i, spec in enumerate(specs):
        where = f"rewards[{i}] ({spec.name})"
        rdef = known.get(spec.name)
        if rdef is None:
            problems.append(f"{where}: unknown reward '{spec.name}'. Known rewards: {', '.join(known) or 'none'}")
            continue
        for p in sorted(set(spec.params) - set(rdef.params)):
            names = ", ".join(rdef.params) or "none"
            problems.append(f"{where}.params.{p}: '{rdef.name}' has no parameter '{p}'; it accepts: {names}")
        for p in [p for p in spec.params if p in rdef.params]:
            if why := value_problem(spec.params[p], rdef.param_types.get(p, Any)):
                problems.append(f"{where}.params.{p}: {why}")
        if columns is not None:
            for col in rdef.columns:
                if col not in columns:
                    problems.append(
                        f"{where}: needs dataset column '{col}', which the dataset lacks "
                        f"(columns: {', '.join(sorted(columns))}); map it with the dataset settings"
                    )
    return problems


def completion_text(completion: Any) -> str:
    """TRL hands completions as text or as a list of chat messages; rewards always see text."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(m.get("content") or "" for m in completion if isinstance(m, dict))
    return "" if completion is None else str(completion)


class FaultLog:
    """Appends each reward fault (the completion and inputs that made a reward raise) to a JSONL file."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, record: dict) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


class CompiledReward:
    """A registered reward bound to its params, callable the way TRL calls reward functions.

    It converts completions to text, passes only what the reward declares, checks the output contract,
    and turns a reward that raises into None for the completions concerned (counted, never silent).
    """

    def __init__(
        self,
        rdef: RewardDef,
        spec: RewardSpec,
        fault_log: Callable[[dict], None] | None = None,
        max_failure_rate: float | None = None,
        failure_window: int = 64,
    ):
        self.rdef, self.spec = rdef, spec
        self.__name__ = spec.metric_name  # TRL logs rewards/<__name__>/mean
        self.kwargs = {**rdef.params, **spec.params}
        self.fault_log = fault_log
        self.calls = 0
        self.scored = 0
        self.none_count = 0
        self.error_count = 0
        # Faults (the reward raised) of the last `failure_window` completions, 1 per fault; None: never stop.
        self.max_failure_rate = max_failure_rate
        self._recent: deque[int] = deque(maxlen=max(int(failure_window), 1))

    def _metric(self, log_metric: Callable | None) -> Callable[[str, float], None]:
        prefix = f"rewards/{self.__name__}/"

        def log(name: str, value: float) -> None:
            if log_metric is not None:
                log_metric(prefix + name, float(value))

        return log

    def _invoke(self, texts: list[str], columns: dict[str, list], context: dict[str, Any]) -> list:
        out = self.rdef.func(texts, **columns, **context, **self.kwargs)
        if not isinstance(out, (list, tuple)) or len(out) != len(texts):
            got = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
            raise RewardContractError(f"reward '{self.rdef.name}' returned {got} for {len(texts)} completions")
        return [_as_score(self.rdef.name, v) for v in out]

    def __call__(self, completions: list, **kwargs: Any) -> list[float | None]:
        texts = [completion_text(c) for c in completions]
        columns = {c: kwargs[c] for c in self.rdef.columns}
        log_metric = self._metric(kwargs.get("log_metric"))
        context = {}
        for name in self.rdef.context:
            context[name] = (log_metric if name == "log_metric" else list(completions) if name == "completion_messages"
                             else kwargs.get(name))
        errors_before = self.error_count
        try:
            scores = self._invoke(texts, columns, context)
        except RewardContractError:
            raise
        except Exception:
            scores = self._one_by_one(texts, columns, context)
        self.calls += 1
        nones = sum(s is None for s in scores)
        self.none_count += nones
        self.scored += len(scores)
        log_metric("none_rate", nones / max(len(scores), 1))
        faults = self.error_count - errors_before
        log_metric("fault_rate", faults / max(len(scores), 1))
        self._check_failure_rate(faults, len(scores))
        return scores

    def _check_failure_rate(self, faults: int, n: int) -> None:
        """Stop the run once too many completions could not be scored: past that, training follows noise.

        Judged over a full window; before it is full, only when the faults seen already exceed the limit for a
        full window (so a reward that fails on everything stops the run at its first batch).
        """
        self._recent.extend([1] * faults + [0] * (n - faults))
        if self.max_failure_rate is None:
            return
        count, window = sum(self._recent), self._recent.maxlen
        full = len(self._recent) == window
        if (full and count / window > self.max_failure_rate) or count > self.max_failure_rate * window:
            seen = len(self._recent)
            where = getattr(self.fault_log, "path", None) or "the fault log"
            raise RewardFailureRateExceeded(
                f"reward '{self.__name__}' raised on {count} of the last {seen} completions ({count / seen:.0%}), "
                f"more than max_reward_failure_rate {self.max_failure_rate:g} of a {window}-completion window; "
                f"stopping rather than training on unscored completions. The errors and the completions that caused "
                f"them are in {where}. Fix the reward, or raise max_reward_failure_rate (1 never stops)."
            )

    def _one_by_one(self, texts: list[str], columns: dict[str, list], context: dict[str, Any]) -> list:
        """The batch raised: find the completions that make it raise, give those None, keep the rest."""
        scores: list[float | None] = []
        for i, text in enumerate(texts):
            row_cols = {k: [v[i]] for k, v in columns.items()}
            # Context lists with one entry per completion are cut to this completion's entry too.
            row_context = {k: [v[i]] if k in PER_COMPLETION and isinstance(v, list) and len(v) == len(texts) else v
                           for k, v in context.items()}
            try:
                scores.extend(self._invoke([text], row_cols, row_context))
            except RewardContractError:
                raise
            except Exception as exc:  # a reward must not take the run down for one odd completion
                self.error_count += 1
                scores.append(None)
                record = {"reward": self.__name__, "error": f"{type(exc).__name__}: {exc}", "completion": text[:4000],
                          **{k: repr(v[0])[:2000] for k, v in row_cols.items()}}
                logger.warning("reward %s raised on one completion: %s", self.__name__, record["error"])
                if self.fault_log is not None:
                    self.fault_log(record)
        return scores


def _as_score(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RewardContractError(f"reward '{name}' returned {type(value).__name__} {value!r}; expected float or None")
    value = float(value)
    return None if math.isnan(value) else value


def compile_rewards(
    specs: list[RewardSpec],
    known: dict[str, RewardDef],
    fault_log: Callable[[dict], None] | None = None,
    max_failure_rate: float | None = None,
    failure_window: int = 64,
) -> tuple[list[CompiledReward], list[float]]:
    """Specs -> (TRL reward_funcs, reward_weights). Call check_specs first; this assumes they passed."""
    funcs = [CompiledReward(known[s.name], s, fault_log, max_failure_rate, failure_window) for s in specs]
    return funcs, [s.weight for s in specs]
