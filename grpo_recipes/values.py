"""Settings and the values they accept, in one place: what a dataclass's fields are annotated with (the one field
walker), whether a value fits an annotation and what an annotation accepts, in words, and the one did-you-mean every
message uses. A leaf: it imports nothing from the package. Reward params, tool settings and the config's own
fields are all checked with it."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from dataclasses import MISSING, Field, dataclass, fields
from typing import Annotated, Any, Literal, Union

# How close a misspelling must be to a known name for a suggestion: "learnig_rate" -> learning_rate, "dapoo" -> dapo,
# "literall" -> literal; below it the message lists the known names instead.
CLOSE = 0.7


def did_you_mean(value: Any, known: Iterable[Any]) -> str | None:
    """The known name `value` most likely meant, or None."""
    close = difflib.get_close_matches(str(value), [str(k) for k in known], n=1, cutoff=CLOSE)
    return close[0] if close else None


def choice_hint(value: Any, choices: Iterable[Any]) -> str:
    """"; did you mean 'x'?" after a message that lists the choices, or nothing."""
    close = did_you_mean(value, choices)
    return f"; did you mean '{close}'?" if close else ""


# ------------------------------------------------------------------------------------------------ dataclass fields


def annotations(cls: type) -> dict[str, str]:
    """Field name -> its annotation as written, over the class and its bases. Not `Field.type`: HfArgumentParser
    rewrites that in place (a `dict | str | None` field becomes `str`), which would hide that a mapping is a legal YAML
    value."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            out[name] = annotation if isinstance(annotation, str) else str(annotation)
    return out


def default(f: Field) -> Any:
    """A field's default value (a factory's product), or MISSING."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def init_fields(cls: type) -> dict[str, Field]:
    """The fields a dataclass takes in its constructor, by name."""
    return {f.name: f for f in fields(cls) if f.init}


# ------------------------------------------------------------------------------------------ annotated settings


@dataclass(frozen=True)
class Range:
    """Bounds of a number setting, checked at start-up: `timeout_s: Annotated[float, Range(gt=0)] = 3`."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def holds(self, value: float) -> bool:
        return ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
                and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le))

    def __str__(self) -> str:
        bounds = [(">", self.gt), (">=", self.ge), ("<", self.lt), ("<=", self.le)]
        return " and ".join(f"{op} {v:g}" for op, v in bounds if v is not None)


SUPPORTED = "bool, int, float, str, a class, Literal[...], X | None, Annotated[int or float, Range(...)]"


def checkable(hint: Any) -> bool:
    """Whether `fits` can decide every value of this annotation."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is Annotated:  # metadata other than Range (a note, say) is not a constraint
        bounded = any(isinstance(m, Range) for m in args[1:])
        return checkable(args[0]) and (not bounded or args[0] in (int, float))
    if origin in (Union, types.UnionType):
        return all(checkable(a) for a in args)
    if origin is Literal:
        return True
    return isinstance(origin or hint, type)


def fits(value: Any, hint: Any) -> bool:
    """Whether a config value is one the annotation accepts."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is Annotated:
        ranges = [m for m in args[1:] if isinstance(m, Range)]
        return fits(value, args[0]) and all(r.holds(value) for r in ranges)
    if origin in (Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin or hint)


def accepted(hint: Any) -> str:
    """What an annotation accepts, in words: "one of 'literal', 'expression'", "a number > 0"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return "any value"
    if origin is Annotated:
        bounds = " and ".join(str(m) for m in args[1:] if isinstance(m, Range))
        return f"{accepted(args[0])} {bounds}".strip()
    if origin in (Union, types.UnionType):
        return " or ".join(accepted(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    words = {type(None): "null", bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return words.get(hint) or f"a {(origin or hint).__name__}"


def literals(hint: Any) -> list:
    """The Literal values anywhere in an annotation, for a did-you-mean."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return list(args)
    if origin in (Annotated, Union, types.UnionType):
        return [v for a in (args[:1] if origin is Annotated else args) for v in literals(a)]
    return []


def value_problem(value: Any, hint: Any) -> str | None:
    """Why a config value does not fit the annotation, or None."""
    if fits(value, hint):
        return None
    why = f"{value!r} is not {accepted(hint)}{choice_hint(value, literals(hint))}"
    if isinstance(value, str) and (number := _number(value)) is not None and fits(number, hint):
        why += "; it is text: write the number unquoted (YAML reads 1e-3 as text, 1.0e-3 as a number)"
    return why


def _number(text: str) -> float | int | None:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None
