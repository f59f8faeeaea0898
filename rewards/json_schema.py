"""Structured-output rewards: a JSON object in the completion, scored against a per-row JSON Schema or gold object.

Extraction: the visible text after the last </think> (an open <think>, never closed or opened again after the last
</think>, means no answer yet; HTML comments are not read), then the LAST top-level {...} that looks like a record (a
key after its brace; `{braces}` in prose are skipped). Last, because models draft and then correct themselves; a
```json fence needs no special case, since the object inside it is found like any other. The last record must parse:
a broken or cut-off last record is no answer (as a last box left open is for math), not a fall back to a draft. A
record started and abandoned (`{"name": "X",` then a fresh start) hides nothing after it. An object inside an array
(`[{...}]`) is not top-level: an array is not the record asked for. NaN and Infinity (not JSON, and they pass numeric
bounds), numbers beyond the float range (`1e999` would parse as Infinity) and a key given two different values make
an object unreadable. Text after the record that takes it back ("That is wrong.", "Actually, ...") leaves no answer
(grpo_recipes/rewards/answers.py, `retracted`).
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys

from grpo_recipes.rewards import answers, reward

# A structured answer is short; scanning only the tail keeps 1 MB completions cheap (the scan is linear anyway).
_MAX_CHARS = 64_000
_FLOAT_MAX = int(sys.float_info.max)
_TOKENS = re.compile(r'[{}"\\\n]|\[(?=\s*[{\[])|\]')
# What a record looks like at its opening brace: a key (quoted, or bare as a model may write one), or nothing. An
# array of objects or arrays is a JSON value too (and no record).
_RECORD_START = re.compile(r'\{\s*(?:["\'}]|[A-Za-z_$][\w$]*\s*:)|\[')


def _answer_region(text: str) -> str | None:
    close = text.rfind("</think>")
    if close >= 0:
        text = text[close + 8 :]
    if "<think>" in text:
        return None
    return answers.visible_text(text, latex=False)


def _object_spans(text: str) -> tuple[list[tuple[int, int]], list[int]]:
    """(spans of top-level balanced {...} in order, where the braces that never close open). Braces inside JSON
    strings are ignored (a string ends at its closing quote or at a raw line break, which JSON strings cannot hold).
    One linear pass.

    Outside objects, a `[` that opens an array of objects or arrays (`[{`, `[[`) nests what it holds until its `]`,
    and the array's span is a candidate too. An object directly inside a brace that never closes counts as top-level:
    a record abandoned half-way (`{"name": "X",`) does not hide a fresh one written after it.
    """
    spans, nested, stack = [], [], []  # nested: (start, end, the brace it sits in); stack: open braces
    arrays, start, in_string, escaped_at = 0, 0, False, -1
    for m in _TOKENS.finditer(text):
        ch, pos = m.group(), m.start()
        if in_string:
            if pos == escaped_at:
                continue
            if ch == "\\":
                escaped_at = pos + 1
            elif ch in '"\n':
                in_string = False
            continue
        if ch == '"' and stack:
            in_string = True  # quotes in the prose around an object are not JSON
        elif ch == "{":
            stack.append(pos)
        elif ch == "}" and stack:
            opened = stack.pop()
            if stack:
                nested.append((opened, pos + 1, stack[-1]))
            elif arrays == 0:
                spans.append((opened, pos + 1))
        elif not stack and ch == "[":
            if arrays == 0:
                start = pos
            arrays += 1
        elif not stack and ch == "]" and arrays > 0:
            arrays -= 1
            if arrays == 0:
                spans.append((start, pos + 1))
    if stack:
        unclosed = set(stack)
        spans = sorted(spans + [(s, e) for s, e, parent in nested if parent in unclosed])
    return spans, stack


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
    # {"name": "Ann", "name": "Bob"} states two answers for one field; json.loads would silently keep the last. The
    # same value twice states one.
    record: dict = {}
    for key, value in pairs:
        if key in record and record[key] != value:
            raise ValueError("a key with two values")
        record[key] = value
    return record


def extract_json_object(text: str) -> dict | None:
    region = _answer_region(text)
    if region is None:
        return None
    region = region[-_MAX_CHARS:]
    spans, unclosed = _object_spans(region)
    records = [span for span in spans if _RECORD_START.match(region, span[0])]
    end = records[-1][1] if records else 0
    if not records or any(p >= end and _RECORD_START.match(region, p) for p in unclosed):
        return None  # no record, or the last one is cut off
    start, end = records[-1]
    try:
        value = json.loads(region[start:end], parse_constant=_reject_constant, parse_float=_finite_float,
                           parse_int=_finite_int, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError):
        return None  # the last record is broken: drafts before it are not the answer
    if not isinstance(value, dict):
        return None  # the last JSON value is an array: no record
    return None if answers.retracted(region[end:], None, any_correction=True) else value


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
