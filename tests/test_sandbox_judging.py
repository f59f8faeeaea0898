"""Hostile programs against the host's judging (issue 34, sandbox items 1-7 and the sandbox-mode tests): each
attack must get no credit, and the honest program must still pass the same tests. docs/sandbox.md's threat model
cites each test. Time bounds here only catch hangs."""

import functools
import textwrap

import pytest

from grpo_recipes import sandbox
from grpo_recipes.rewards import registry
from grpo_recipes.sandbox import split

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


# ---- issue 46, items 7 to 9: the host's verdict is Python's, the tests run in sequence in one namespace as the
# dataset's own harness runs them, or the test is refused with the reason


def in_python(program: str, tests: list[str]) -> tuple[bool, ...]:
    """Each test's verdict when the program and then the tests run in one namespace, one after another."""
    ns = {"__name__": "__main__"}
    exec(program, ns)  # noqa: S102 - this module's own programs, none of which rigs anything outside its namespace
    verdicts = []
    for test in tests:
        try:
            exec(test, ns)  # noqa: S102
            verdicts.append(True)
        except Exception:  # noqa: BLE001 - a failed test, whatever it raised
            verdicts.append(False)
    return tuple(verdicts)


def assert_as_python(program: str, tests: list[str]) -> sandbox.SandboxResult:
    """Every verdict is Python's, or the test is refused (failed) with its reason in stderr."""
    result = run_tests(program, tests)
    expected = in_python(program, tests)
    for i, (got, want, mode) in enumerate(zip(result.results, expected, result.modes)):
        assert got == want or (mode == "refused" and not got and f"test {i}: refused" in result.stderr), (
            i, tests[i], expected, result)
    return result


def test_issue46_item7_names_bound_by_an_earlier_test_mean_what_they_mean_in_python():
    items = ["r = f(2)", "assert r == 4", "assert r == 4", "assert r == 4"]
    wrong = assert_as_python("r = 4\ndef f(x):\n    return 5", items)
    assert wrong.passed == 1, wrong  # Python: 1/4; the program's own `r` answered the three asserts before
    assert "it reads 'r', which test 0 binds" in wrong.stderr
    assert_as_python("def f(x):\n    return 4", items)
    # a test's name that the program's code reads: in Python the program sees the test's value
    reads_global = "k = 2\ndef f(x):\n    return x * k"
    result = assert_as_python(reads_global, ["k = 3", "assert f(2) == 6", "assert f(3) == 9"])
    assert result.passed == 0 and "binds 'k', which the program's code reads" in result.stderr, result
    assert_as_python(reads_global, ["assert f(2) == 4", "j = 3\nassert f(j) == 6"])  # nothing shared: all judged
    # names a test does not spell out: dir(), globals(), eval, import *
    assert_as_python("def f():\n    return 1", ["x = f()", "assert 'x' not in dir()", "assert eval('x') == 2"])
    result = assert_as_python("sqrt = lambda x: 0\ndef f(x):\n    return x", ["from math import *",
                                                                             "assert sqrt(f(4)) == 0"])
    assert result.passed == 0 and "may bind any name" in result.stderr, result  # Python: math's sqrt, 2.0
    # an import in an earlier test is the module in the later ones, as in Python
    result = assert_as_python("def f(x):\n    return 12.56", ["import math", "assert math.isclose(f(2), 12.56)"])
    assert result.status == "ok", result


FAKE_MATH = """
class math:
    isclose = staticmethod(lambda *a, **k: True)
def f(r):
    return 0
"""


def test_issue46_item8_module_names_the_tests_do_not_import_are_modules_not_program_objects():
    tests = ["assert math.isclose(f(2), 12.56)", "assert math.isclose(f(1), 3.14)", "assert math.isclose(f(3), 28.26)"]
    honest = "import math\ndef f(r):\n    return 3.14 * r * r"
    assert run_tests(honest, tests).status == "ok"  # MBPP style: the program imports math, the tests use it
    wrong = "import math\ndef f(r):\n    return 2 * r"
    assert run_tests(wrong, tests).passed == 0
    rigged = "import math\nmath.isclose = lambda *a, **k: True\ndef f(r):\n    return 0"  # Python: 3/3, the rig
    result = run_tests(rigged, tests)
    assert result.passed == 0 and result.modes == ("host",) * 3, result  # the host's own math
    for program in (FAKE_MATH, "def f(r):\n    return 0"):  # a program object named math, or no math at all
        result = run_tests(program, tests, sandbox_mode_tests="refuse")
        assert result.passed == 0 and result.modes == ("refused",) * 3, result
        assert "uses 'math' without importing it" in result.stderr, result.stderr
        plans = split.split_tests(tests, program)
        assert not any("12.56" in str(p.wire()) for p in plans)  # the expected value never enters the sandbox


MUTATES = """
def f(*args):
    todo = list(args)
    while todo:
        x = todo.pop()
        if isinstance(x, list):
            x.sort()
            todo += x
        elif isinstance(x, dict):
            todo += x.values()
    return args[0]
"""


def test_issue46_item9_values_the_program_may_change_are_never_judged_stale():
    aliased = [
        "cases = [[3, 1, 2], [5, 4]]\nbox = {'k': cases[0]}\nf(box)\nassert cases[0] == [3, 1, 2]",
        "cases = [[3, 1, 2]]\nbox = {}\nbox.update({'k': cases[0]})\nf(box)\nassert cases == [[3, 1, 2]]",
        "cases = [[3, 1, 2]]\nf(cases[0])\nassert cases[0] == [3, 1, 2]",
        "x = [3, 1, 2]\nbox = [x]\nf(box)\nassert x == [3, 1, 2]",
        "x = [3, 1, 2]\nf(x, [x])\nassert x == [3, 1, 2]",
        "x = [3, 1, 2]\nf(x, [x])\nassert [x] == [[3, 1, 2]]",
    ]
    result = assert_as_python(MUTATES, aliased)
    assert result.passed == 0, result  # Python: 0/6; the host's copies passed them before
    # the test takes its value before the call, and compares it after: Python compares the changed list
    keeps_a_copy = "def f(a):\n    r = list(a)\n    a.sort()\n    return r"
    taken_before = ["a = [3, 1, 2]\nassert a == f(a)", "cases = [[3, 1, 2]]\nassert cases[0] == f(cases[0])",
                    "a = [3, 1, 2]\nr = (a, f(a))\nassert r[0] == [3, 1, 2]"]
    assert assert_as_python(keeps_a_copy, taken_before).passed == 0
    assert_as_python("def f(*args):\n    return None", aliased)
    # the case table that stays judged: only an unchanged part is read after the call
    table = "tests = [([3, 1, 2], [1, 2, 3])]\nfor t in tests:\n    assert f(t[0]) == t[1]"
    assert assert_as_python(MUTATES, [table]).modes == ("host",)


def test_issue46_identity_and_exact_types_are_judged_as_python_would():
    same = "def f(a):\n    return a"
    assert_as_python(same, ["a = [1]\nassert f(a) is not a", "a = [1]\nassert f(a) is a"])
    assert run_tests(same, ["a = [1]\nassert f(a) is not a"]).passed == 0
    subclass = "class I(int):\n    pass\ndef f(x):\n    return I(2 * x)"  # Python: type(r) is int is False
    exact = ["r = f(2)\nassert type(r) is int and r == 4", "assert type(f(2)) == int", "assert isinstance(f(2), int)"]
    result = assert_as_python(subclass, exact)
    assert result.results == (False, False, True), result
    assert run_tests("def f(x):\n    return 2 * x", exact).status == "ok"
