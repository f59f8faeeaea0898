"""Structured-output rewards: a JSON object in the completion, scored against a per-row JSON Schema or gold object.

Extraction: the text after the last </think> (a completion with an unclosed <think> has no answer yet), then the
LAST top-level {...} that parses as a JSON object. Last, because models draft and then correct themselves; a
```json fence needs no special case, since the object inside it is found like any other. An object inside an array
(`[{...}]`) is not top-level: an array is not the record asked for. NaN and Infinity (not JSON, and they pass numeric
bounds), numbers beyond the float range (`1e999` would parse as Infinity) and duplicate keys (two answers for one
field) make an object unreadable.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys

from grpo_recipes.rewards import reward

# A structured answer is short; scanning only the tail keeps 1 MB completions cheap (the scan is linear anyway).
_MAX_CHARS = 64_000
_MAX_CANDIDATES = 32
_FLOAT_MAX = int(sys.float_info.max)
_TOKENS = re.compile(r'[{}"\\]|\[(?=\s*[{\[])|\]')


def _answer_region(text: str) -> str | None:
    close = text.rfind("</think>")
    if close >= 0:
        return text[close + 8 :]
    return None if "<think>" in text else text


def _object_spans(text: str) -> list[tuple[int, int]]:
    """Spans of top-level balanced {...}, with braces inside JSON strings ignored. One linear pass.

    Outside objects, a `[` that opens an array of objects or arrays (`[{`, `[[`) nests what it holds until its `]`,
    and the array's span is a candidate too.
    """
    spans, depth, arrays, start, in_string, escaped_at = [], 0, 0, 0, False, -1
    for m in _TOKENS.finditer(text):
        ch, pos = m.group(), m.start()
        if in_string:
            if pos == escaped_at:
                continue
            if ch == "\\":
                escaped_at = pos + 1
            elif ch == '"':
                in_string = False
            continue
        if ch == '"' and depth > 0:
            in_string = True  # quotes in the prose around an object are not JSON
        elif ch == "{":
            if depth == 0 and arrays == 0:
                start = pos
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0 and arrays == 0:
                spans.append((start, pos + 1))
        elif depth == 0 and ch == "[":
            if arrays == 0:
                start = pos
            arrays += 1
        elif depth == 0 and ch == "]" and arrays > 0:
            arrays -= 1
            if arrays == 0:
                spans.append((start, pos + 1))
    return spans


def _reject_constant(name: str):
    # NaN passes a schema's "type": "number" and every bound (each comparison with NaN is false); JSON has no NaN.
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: Infinity spelled as a number passes "type": "number" and every minimum
        raise ValueError(f"{text} is not a finite number")
    return value


def _finite_int(text: str) -> int:
    value = int(text)
    if abs(value) > _FLOAT_MAX:  # beyond any float: Infinity to most JSON readers, and no field's value
        raise ValueError("an integer beyond the float range")
    return value


def _unique_keys(pairs: list) -> dict:
    # {"name": "Ann", "name": "Bob"} states two answers for one field; json.loads would silently keep the last.
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


def extract_json_object(text: str) -> dict | None:
    region = _answer_region(text)
    if region is None:
        return None
    region = region[-_MAX_CHARS:]
    for start, end in reversed(_object_spans(region)[-_MAX_CANDIDATES:]):
        try:
            value = json.loads(region[start:end], parse_constant=_reject_constant, parse_float=_finite_float,
                               parse_int=_finite_int, object_pairs_hook=_unique_keys)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
        return None  # the last JSON value is an array: no record, and drafts before it are not the answer
    return None


def _load(value) -> object:
    return json.loads(value) if isinstance(value, str) else value


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str):
    from jsonschema.validators import validator_for

    schema = json.loads(schema_json)
    cls = validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _schema_validator(schema):
    """The row's validator, or None when the schema itself is unusable (not JSON, not a valid schema)."""
    try:
        return _validator(json.dumps(_load(schema), sort_keys=True))
    except Exception:  # noqa: BLE001 - any failure here means the row cannot be scored; counted by the caller
        return None


def _schema_score(obj: dict, validator) -> float:
    """1.0 valid; 0.1 + 0.8 * (share of required fields present and valid) otherwise, so valid always ranks first."""
    errors = list(validator.iter_errors(obj))
    if not errors:
        return 1.0
    schema = validator.schema if isinstance(validator.schema, dict) else {}
    fields = list(schema.get("required") or schema.get("properties") or [])
    if not fields:
        return 0.1
    broken = {e.absolute_path[0] for e in errors if e.absolute_path}
    return 0.1 + 0.8 * sum(f in obj and f not in broken for f in fields) / len(fields)


@reward("json_schema", role="format")
def json_schema(completions: list[str], schema: list, log_metric) -> list[float | None]:
    """1.0 when the completion's JSON object validates against the row's schema; 0.1-0.9 by share of valid required fields; 0 when no JSON."""
    scores: list[float | None] = []
    parsed = valid = unusable = 0
    for text, row_schema in zip(completions, schema, strict=True):
        validator = _schema_validator(row_schema)
        if validator is None:
            unusable += 1
            scores.append(None)
            continue
        obj = extract_json_object(text)
        if obj is None:
            scores.append(0.0)
            continue
        parsed += 1
        try:
            score = _schema_score(obj, validator)
        except RecursionError:  # a pathologically deep object; jsonschema recurses per level
            score = 0.1
        valid += score == 1.0
        scores.append(score)
    n = max(len(completions), 1)
    log_metric("parse_rate", parsed / n)
    log_metric("schema_valid_rate", valid / n)
    log_metric("schema_unusable", unusable / n)
    return scores


def _norm(value):
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return " ".join(value.split()).casefold()
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _norm(v) for k, v in value.items()}
    return value


def _same(a, b) -> bool:
    a, b = _norm(a), _norm(b)
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return type(a) is type(b) and a == b


def _field_ok(obj: dict, key: str, expected) -> bool:
    try:
        return key in obj and _same(obj[key], expected)
    except RecursionError:  # a pathologically deep value cannot equal a gold field
        return False


@reward("json_field_accuracy")
def json_field_accuracy(completions: list[str], gold: list, log_metric) -> list[float | None]:
    """Share of the gold object's top-level fields whose values the completion's JSON matches (strings case/space-normalised, numbers by value)."""
    scores: list[float | None] = []
    parsed = unusable = 0
    for text, row_gold in zip(completions, gold, strict=True):
        try:
            expected = _load(row_gold)
        except ValueError:
            expected = None
        if not isinstance(expected, dict) or not expected:
            unusable += 1
            scores.append(None)
            continue
        obj = extract_json_object(text)
        if obj is None:
            scores.append(0.0)
            continue
        parsed += 1
        scores.append(sum(_field_ok(obj, k, v) for k, v in expected.items()) / len(expected))
    n = max(len(completions), 1)
    log_metric("parse_rate", parsed / n)
    log_metric("gold_unusable", unusable / n)
    return scores
