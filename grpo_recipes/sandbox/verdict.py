"""From what the supervisor saw to a SandboxResult: read the records, judge host-mode tests, compare io output.

Records are lines `<nonce> <json list>` written by inside/harness.py on fd 3, in a fixed order:
ready, load, then per test either its steps' results and `end` (host mode; a refused test has no steps) or
`verdict` (sandbox mode), then done. The program can write there too. A line out of order, with another nonce,
or not well formed marks the job as tampered with: 0 passed. A program that forges well-formed host-mode records
only reports values of its choosing, which it could have returned anyway: the host still compares them with
values it never sent. Whatever the records hold is the program's doing: nothing in them can make reading them
fail other than as the program's failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

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


def _records(raw: bytes, nonce: str) -> tuple[list[list], bool]:
    """(parsed records, forged). A partial last line (the process was killed mid-write) is dropped."""
    lines = raw.split(b"\n")[:-1]
    out = []
    prefix = (nonce + " ").encode()
    for line in lines:
        if not line.startswith(prefix):
            return out, True
        try:
            record = json.loads(line[len(prefix):].decode("utf-8"), parse_int=_bounded_int, parse_float=_no_float,
                                parse_constant=_no_float)
        except Exception:  # noqa: BLE001 - ValueError, RecursionError, MemoryError: not well formed
            return out, True
        if not isinstance(record, list) or not record or not isinstance(record[0], str):
            return out, True
        out.append(record)
    return out, False


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
    records, forged = _records(raw, nonce)
    reason = "result records tampered with" if forged else ""
    pos, outcomes, ready, done = 0, [], False, False

    def take():
        nonlocal pos
        pos += 1
        return records[pos - 1] if pos <= len(records) else None

    def fail(why: str):
        return ready, False, outcomes, why

    if records[:1] != [["ready"]]:
        return fail(reason) if records else (False, False, [], reason)
    ready, pos = True, 1
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
    if record != ["done"] or pos != len(records):
        return fail("result records tampered with")
    done = True
    return ready, done, outcomes, reason


def same_output(got: str, expected: str) -> bool:
    """Equal up to trailing whitespace on each line and trailing blank lines."""
    return [line.rstrip() for line in got.rstrip().splitlines()] == \
        [line.rstrip() for line in expected.rstrip().splitlines()]
