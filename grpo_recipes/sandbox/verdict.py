"""From what the supervisor saw to a SandboxResult: read the records, judge host-mode tests, compare io output.

Records are lines `<nonce> <json list>` written by inside/harness.py on fd 3, in a fixed order:
ready, load, then per test either its steps' results and `end` (host mode; a refused test has no steps) or
`verdict` (sandbox mode), then done. The program can write there too. A line out of order, with another nonce,
or not well formed marks the job as tampered with: 0 passed. A program that forges well-formed host-mode records only reports values of
its choosing, which it could have returned anyway: the host still compares them with values it never sent.
Records are parsed one at a time as the host reads them, never more lines than the harness writes, and a long
line only as a flat token list within the codec's bounds: forged records cost the host no more memory than
honest ones. Whatever the records hold is the program's doing: nothing in them can make reading them fail
other than as the program's failure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.decoder import scanstring as _scanstring

from . import split
from .inside import codec


@dataclass(frozen=True)
class TestOutcome:
    passed: bool
    mode: str  # "host", "sandbox" or "refused"
    why: str = ""


def _bounded_int(text: str) -> int:
    if len(text) > 20:
        raise ValueError("number too long")
    return int(text)


def _no_float(text: str):
    raise ValueError("floats travel as strings")


SHORT_LINE = 4096  # longer record lines must be value records in the harness's compact form
_VALUE_HEAD = re.compile(rb'\["value",(0|[1-9][0-9]{0,8}),(0|[1-9][0-9]{0,8}),\[')
_COUNT = re.compile(r"0|[1-9][0-9]{0,19}")


def _most_records(plans: list[split.Plan]) -> int:
    """The longest record stream the harness writes for `plans`: ready, load, per test its steps and end (host
    mode) or its verdict, done."""
    return 3 + sum(len(p.steps) + 1 if p.mode == "host" else 1 for p in plans)


def _records(raw: bytes, nonce: str, limit: int):
    """The records one at a time, each parsed only when the host reads it; None for a line that is not well
    formed (the end of the stream for the host). More than `limit` lines are tampering whatever they hold: they
    are never parsed. A partial last line (the process was killed mid-write) is dropped."""
    if raw.count(b"\n") > limit:
        yield None
        return
    prefix, start = (nonce + " ").encode(), 0
    while True:
        end = raw.find(b"\n", start)
        if end < 0:
            return
        record = _parse(raw, start + len(prefix), end) if raw.startswith(prefix, start) else None
        yield record
        if record is None:
            return
        start = end + 1


def _parse(raw: bytes, start: int, end: int) -> list | None:
    """The record in raw[start:end]."""
    if end - start > SHORT_LINE:
        head = _VALUE_HEAD.match(raw, start, end)
        tokens = _flat_tokens(raw, head.end(), end) if head else None
        return None if tokens is None else ["value", int(head[1]), int(head[2]), tokens]
    try:
        record = json.loads(raw[start:end].decode("utf-8"), parse_int=_bounded_int, parse_float=_no_float,
                            parse_constant=_no_float)
    except Exception:  # noqa: BLE001 - ValueError, RecursionError, MemoryError: not well formed
        return None
    return record if isinstance(record, list) and record and isinstance(record[0], str) else None


def _flat_tokens(raw: bytes, start: int, end: int) -> list | None:
    """A value's tokens in raw[start:end] (strings and item counts, nothing nested, then `]]`), read one at a
    time and no more of them than the codec allows: whatever the line holds, parsing it makes no more objects
    than an honest value would."""
    if raw[start:start + 1] not in (b'"', b"]") and not raw[start:start + 1].isdigit():
        return None
    try:
        text = str(memoryview(raw)[start:end], "ascii")  # the harness writes JSON with ensure_ascii
    except UnicodeDecodeError:
        return None
    if text == "]]":
        return []
    tokens, chars, pos = [], 0, 0
    while len(tokens) <= codec.MAX_TOKENS + 8:  # past the codec's bound, decode rejects the value, not the job
        if text.startswith('"', pos):
            try:
                token, pos = _scanstring(text, pos + 1, True)
            except ValueError:
                return None
            chars += len(token)
            if chars > 4 * codec.MAX_BYTES:
                return None
        else:
            count = _COUNT.match(text, pos)
            if count is None:
                return None
            token, pos = int(count[0]), count.end()
        tokens.append(token)
        if text.startswith(",", pos):
            pos += 1
        else:
            return tokens if pos + 2 == len(text) and text.endswith("]]") else None
    return None


def _step_value(record: list, test: int, step: int):
    """The value one step record stands for, or None when the record does not fit (forged)."""
    kind = record[0]
    if len(record) < 3 or record[1] != test or record[2] != step:
        return None
    if kind == "ran" and len(record) == 3:
        return ("ran",)
    if kind == "raised" and len(record) == 4 and isinstance(record[3], str):
        return (split.Raised(record[3][:100]),)
    if kind == "opaque" and len(record) == 4 and isinstance(record[3], str):
        return (split.Opaque(record[3][:200]),)
    if kind == "value" and len(record) == 4:
        try:
            return (codec.decode(record[3]),)
        except Exception as exc:  # noqa: BLE001 - a value the host cannot decode fails the test, as the program's
            return (split.Opaque("undecodable value: %s: %s" % (type(exc).__name__, str(exc)[:200])),)
    return None


def read_tests(raw: bytes, nonce: str, plans: list[split.Plan]) -> tuple[bool, bool, list[TestOutcome], str]:
    """(ready, done, one outcome per test seen, forged: why or ''), from the records of a tests job."""
    records = _records(raw, nonce, _most_records(plans))
    reason, outcomes, ready, done = "", [], False, False

    def take():
        nonlocal reason
        record = next(records, False)  # False: the end of the stream; None: a line that is not well formed
        if record is None:
            reason = "result records tampered with"
        return record or None

    def fail(why: str):
        return ready, False, outcomes, why

    first = take()
    if first != ["ready"]:
        return fail(reason) if first is not None else (False, False, [], reason)
    ready = True
    load = take()
    if load is None:
        return ready, False, outcomes, reason
    if load[:1] != ["load"] or len(load) != 2 or not isinstance(load[1], bool):
        return fail("result records tampered with")
    for i, plan in enumerate(plans if load[1] else ()):
        if plan.mode == "sandbox":
            record = take()
            if record is None:
                return ready, False, outcomes, reason
            if record[:2] != ["verdict", i] or len(record) != 3 or not isinstance(record[2], bool):
                return fail("result records tampered with")
            outcomes.append(TestOutcome(record[2], "sandbox"))
            continue
        values = []
        while True:
            record = take()
            if record is None:
                return ready, False, outcomes, reason
            if record == ["end", i]:
                break
            value = _step_value(record, i, len(values)) if len(values) < len(plan.steps) else None
            if value is None:
                return fail("result records tampered with")
            values.append(value[0])
        values += [split.Raised("(not run)")] * (len(plan.steps) - len(values))
        if plan.mode == "refused":
            outcomes.append(TestOutcome(False, "refused", plan.reason))
            continue
        passed, why = split.judge(plan, values)
        outcomes.append(TestOutcome(passed, "host", why))
    record = take()
    if record is None:
        return ready, False, outcomes, reason
    if record != ["done"] or take() is not None or reason:
        return fail("result records tampered with")
    done = True
    return ready, done, outcomes, reason


def same_output(got: str, expected: str) -> bool:
    """Equal up to trailing whitespace on each line and trailing blank lines."""
    return [line.rstrip() for line in got.rstrip().splitlines()] == \
        [line.rstrip() for line in expected.rstrip().splitlines()]
