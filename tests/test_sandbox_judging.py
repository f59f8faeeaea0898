"""Hostile programs against the host's judging (issue 34, sandbox items 1-7 and the sandbox-mode tests): each
attack must get no credit, and the honest program must still pass the same tests. docs/sandbox.md's threat model
cites each test. Time bounds here only catch hangs."""

import functools
import textwrap

import pytest

from grpo_recipes import sandbox
from grpo_recipes.rewards import registry

HANG_S = 120
run_tests = functools.partial(sandbox.run_tests, timeout_s=HANG_S)
unit_tests = functools.partial(registry.available()["unit_tests"].func, timeout_s=HANG_S)


class Metrics(dict):
    def __call__(self, name, value):
        self[name] = value


def fenced(program: str) -> str:
    return "```python\n" + textwrap.dedent(program) + "\n```"


def assert_no_credit(program: str, tests: list[str], honest: str, **kw) -> sandbox.SandboxResult:
    """The attack passes nothing and is the program's failure (never infra_error); the honest program passes."""
    result = run_tests(textwrap.dedent(program), tests, **kw)
    assert result.passed == 0 and result.status in ("failed", "crashed"), result
    good = run_tests(textwrap.dedent(honest), tests, **kw)
    assert good.status == "ok", good
    return result


# ---- item 1: a value the host cannot decode is the program's failure, not the host's


def test_issue34_item1_undecodable_values_score_zero_not_none():
    huge_range = "def f(*a, **k):\n    return range(1 << 100)"
    result = run_tests(huge_range, ["assert f(1) == 2", "assert len(f(1)) == 2"])
    assert (result.status, result.passed) == ("failed", 0), result
    assert "undecodable value" in result.stderr
    # a forged record, as well-formed as the harness's own, carrying a range the decoder cannot size
    forged = textwrap.dedent("""
        import os, sys, json
        def f(x):
            frame = sys._getframe()
            while "channel" not in frame.f_locals:
                frame = frame.f_back
            ch, i = frame.f_locals["channel"], frame.f_locals["i"]
            os.write(ch.fd, (ch.prefix + json.dumps(["value", i, 0, ["r", "0", "f" * 4000, "1"]]) + "\\n").encode())
            os.write(ch.fd, (ch.prefix + json.dumps(["end", i]) + "\\n").encode())
            os.write(ch.fd, (ch.prefix + json.dumps(["done"]) + "\\n").encode())
            os._exit(0)
    """)
    result = run_tests(forged, ["assert f(1) == 2"])
    assert result.status == "failed" and result.passed == 0, result
    too_large = "def f(x):\n    return 'x' * (2 << 20)"
    assert run_tests(too_large, ["assert f(1) == 'x'"]).status == "failed"
    flood = "def f(x):\n    return 'x' * 900_000"  # 10 values of 900 kB: past the 8 MiB of records a job may write
    result = run_tests(flood, ["assert f(1) == 'y'"] * 10)
    assert result.status == "crashed" and result.passed == 0, result
    metrics = Metrics()  # through the reward: 0, never None (TRL would give a None row no advantage at all)
    assert unit_tests([fenced(huge_range), fenced(flood)], [["assert f(1) == 2"] * 10] * 2, metrics) == [0.0, 0.0]
    assert metrics["status/infra_error"] == 0


# ---- item 2: tests the host cannot split are refused by default, so a forged verdict gains nothing

FORGE_EMIT = """
import sys
def f(x):
    return -1
frame = sys._getframe()
while "channel" not in frame.f_locals:
    frame = frame.f_back
channel = frame.f_locals["channel"]
real = channel.emit
channel.emit = lambda *record: real(*(("verdict", record[1], True) if record[0] == "verdict" else record))
"""
SANDBOX_MODE = ["if f(1) >= 0:\n    assert f(1) == 2\nelse:\n    assert False",
                "try:\n    r = f(1)\nexcept ValueError:\n    r = None\nassert r == 2",
                "y = f(1)\nwhile y < 0:\n    y += 10\nassert y == 2"]


def test_issue34_item2_forged_sandbox_verdicts_gain_nothing_when_refused():
    refused = run_tests(FORGE_EMIT, SANDBOX_MODE, sandbox_mode_tests="refuse")
    assert refused.passed == 0 and refused.modes == ("refused",) * 3, refused
    assert "refused" in refused.stderr
    # run whole in the sandbox the forgery works, and the result says that those tests were judged there
    forged = run_tests(FORGE_EMIT, SANDBOX_MODE, sandbox_mode_tests="run")
    assert forged.passed == 3 and forged.judged_in_sandbox == 3, forged
    # the reward refuses them unless told otherwise, and logs the share
    metrics = Metrics()
    assert unit_tests([fenced(FORGE_EMIT)], [SANDBOX_MODE + ["assert f(1) == 2"]], metrics) == [0.0]
    assert metrics["refused"] == pytest.approx(3 / 4)


def test_issue34_item2_training_and_held_out_tests_are_never_refused():
    from grpo_recipes.sandbox import split
    from grpo_recipes.tasks.code_rows import generate_code_tasks
    from grpo_recipes.tasks.humaneval import load_humaneval

    tests = [t for r in generate_code_tasks(300, seed=0) for t in r["tests"]] + \
        [t for r in load_humaneval() for t in r["tests"]]
    assert {split.split_test(t).mode for t in tests} == {"host"}


# ---- item 3: case tables: only the inputs go in

PEEK = """
import gc, sys
def _find(x):
    seen = [v for fr in _frames() for v in fr.f_locals.values()] + gc.get_objects()
    for o in seen:
        if isinstance(o, (list, tuple)) and len(o) >= 2 and any(e == x for e in o[:-1]) and o[-1] != x:
            return o[-1]
        if isinstance(o, dict) and o.get("in") == x and "out" in o:
            return o["out"]
    return None
def _frames():
    fr = sys._getframe()
    while fr is not None:
        yield fr
        fr = fr.f_back
def f(*x):
    return _find(x[0] if len(x) == 1 else x[0])
"""
TABLES = [
    "tests = [([3, 1, 2], [1, 2, 3]), ([5, 4], [4, 5])]\nfor t in tests:\n    assert f(t[0]) == t[1]",
    "cases = [{'in': [2, 1], 'out': [1, 2]}]\nfor case in cases:\n    assert f(case['in']) == case['out']",
    "for c in [([9, 8], [8, 9]), ([7, 6], [6, 7])]:\n    assert f(*c[:-1]) == c[-1]",
    "tests = [([3, 1, 2], [1, 2, 3])]\nassert all(f(t[0]) == t[1] for t in tests)",
    "tests = [([3, 1, 2], [1, 2, 3])]\nassert [f(a) for a, b in tests] == [b for a, b in tests]",
]


def test_issue34_item3_case_tables_send_only_the_inputs():
    result = assert_no_credit(PEEK, TABLES, "def f(xs):\n    return sorted(xs)")
    assert result.modes == ("host",) * len(TABLES)


# ---- item 4: expected values the host computes itself, or tests it refuses: none computed in the sandbox

LATER_STEPS = """
import sys
def f(*args):
    frame = sys._getframe(1)
    while "body" not in frame.f_locals:
        frame = frame.f_back
    body, j = frame.f_locals["body"], frame.f_locals["j"]
    for step in body[j + 1:]:
        ns = dict(frame.f_locals["ns"])
        try:
            return eval(step[1], ns)
        except Exception:
            pass
    return None
"""
COMPUTED = ["assert f(1) == bytearray(b'ab')", "assert f(1) == next(iter([44]))", "assert f(1) == format(255, 'x')",
            "assert f(1) == hash((4, 5))", "assert f(1) == [1, 2, 3, 4][slice(1, 3)]",
            "from collections import Counter\nassert f(1) == Counter('abca')",
            "import itertools\nassert f(1) == list(itertools.permutations([1, 2]))",
            "import string\nassert f(1) == string.ascii_lowercase[:3]",
            "import heapq\nassert f(1) == heapq.nsmallest(2, [5, 1, 4])"]
HONEST_COMPUTED = """
def f(x, _answers=iter([bytearray(b'ab'), 44, 'ff', hash((4, 5)), [2, 3], {'a': 2, 'b': 1, 'c': 1},
                         [(1, 2), (2, 1)], 'abc', [1, 4]])):
    return next(_answers)
"""


def test_issue34_item4_expected_values_are_never_computed_in_the_sandbox():
    result = assert_no_credit(LATER_STEPS, COMPUTED, HONEST_COMPUTED)
    assert result.modes == ("host",) * len(COMPUTED)
    # what the host cannot compute (json here) is refused, never sent in: the weakness is stated, not run
    other = ["import json\nassert f(1) == json.dumps([1, 2])", "assert f(1) == ascii('é')"]
    refused = run_tests(LATER_STEPS, other, sandbox_mode_tests="refuse")
    assert refused.passed == 0 and refused.modes == ("refused", "refused"), refused


# ---- item 5: the host's Counter and permutations are the real ones, whatever the program does to its own

RIG = """
import collections, itertools, sys, types
collections.Counter = lambda *a, **k: {"rigged": 1}
itertools.permutations = lambda *a, **k: iter([("rigged",)])
fake = types.ModuleType("collections")
fake.Counter = collections.Counter
sys.modules["collections"] = fake
def f(x):
    return {"rigged": 1} if isinstance(x, str) else [("rigged",)]
"""
RIGGED = ["from collections import Counter\nassert f('abca') == Counter('abca')",
          "import collections\nassert f('abca') == collections.Counter('abca')",
          "import itertools\nassert f([1, 2]) == list(itertools.permutations([1, 2]))",
          "from itertools import permutations\nassert f([1, 2]) == list(permutations([1, 2]))"]
HONEST_RIG = """
import collections, itertools
def f(x):
    return dict(collections.Counter(x)) if isinstance(x, str) else list(itertools.permutations(x))
"""


def test_issue34_item5_rigged_modules_gain_nothing():
    assert_no_credit(RIG, RIGGED, HONEST_RIG)


# ---- item 6: the host judges the object the program changed, read back after the call


def test_issue34_item6_in_place_changes_are_judged_as_python_would():
    returns_sorted_in_place = "def f(a):\n    a.sort()\n    return a"
    keeps_input = "a = [3, 1, 2]\nr = f(a)\nassert r == [1, 2, 3] and a == [3, 1, 2]"
    assert_no_credit(returns_sorted_in_place, [keeps_input], "def f(a):\n    return sorted(a)")
    in_place = ["a = [3, 1, 2]\nf(a)\nassert a == [1, 2, 3]", "a = [3, 1, 2]\nb = a\nf(a)\nassert b == [1, 2, 3]"]
    assert_no_credit("def f(a):\n    return sorted(a)", in_place, "def f(a):\n    a.sort()")
    later = "s = Box([1])\nx = [5]\ns.keep(x)\ns.grow()\nassert x == [5, 6]"  # a reference kept, changed later
    box = "class Box:\n    def __init__(self, v): pass\n    def keep(self, v): self.v = v\n"
    assert run_tests(box + "    def grow(self): self.v.append(6)", [later]).status == "ok"
    assert run_tests(box + "    def grow(self): pass", [later]).passed == 0


# ---- item 7: a program's own `sum` is what a test that calls `sum` calls; redefining a builtin never helps


def test_issue34_item7_an_entry_point_named_like_a_builtin_is_the_programs():
    tests = ["assert sum([1, 2, 3]) == 6", "def check(candidate):\n    assert candidate([4]) == 4\ncheck(sum)"]
    assert_no_credit("def sum(xs):\n    return 0", tests,
                     "def sum(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total")
    # an entry point named like a builtin but meaning something else is judged as itself
    assert run_tests("def max(a, b, c):\n    return a * b * c", ["assert max(1, 2, 3) == 6"]).status == "ok"
    # the rigs issue 13 closed stay closed: where the test calls other program functions the builtin is the real one
    rigs = "len = lambda x: 3\nsorted = lambda x: [0]\nabs = lambda x: 0\nf = g = h = lambda x: 'z'"
    tests = ["assert len(f(1)) == 3", "assert sorted(g(1)) == sorted([0])", "assert abs(h(1) - 1.5) < 1e-6"]
    assert_no_credit(rigs, tests, "f = lambda x: 'abc'\ng = lambda x: [0]\nh = lambda x: 1.5")
    # a builtin redefined by a program whose test calls other program functions too is the real one there: its
    # inputs (here the expected list) must not reach the sandbox, where f would read them from a later step
    peeking = LATER_STEPS + "import builtins\nsorted = lambda xs: builtins.sorted(xs)\n"
    result = run_tests(peeking, ["assert f(0) == sorted([3, 1, 2])"])
    assert result.passed == 0 and result.modes == ("host",), result
