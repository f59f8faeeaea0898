"""What judging a program's values costs the host (issue 46, sandbox items 1 to 6): each attack sends values that
are cheap to make in the sandbox and dear to handle on the host. Judging runs in a process of its own under a CPU
and memory budget (judge.py): an attack is cut there and scores 0, the trainer's own CPU and memory stay flat, and
the honest program still passes the same test. The CPU bounds on the trainer's process are hang checks: its own
work per job is tens of milliseconds, the attacks cost it seconds to minutes before the budget existed."""

import builtins
import gc
import os
import resource
import textwrap
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_recipes import sandbox
from grpo_recipes.rewards import registry

HANG_S = 120
HOST_CPU_S = 2.0  # the trainer's own CPU for one job: tens of milliseconds when the judging is elsewhere
HOST_MB = 24  # the trainer's Python allocations for one job: its records (at most 8 MiB) and little else
PLAN_MB = 2  # more than one plan of the 300-step test below holds (about 0.5 MB): the 23 of them hold 10
unit_tests = registry.available()["unit_tests"].func

COLLIDING = "[(2**61 - 1) * k for k in range(24000)]"  # CPython hashes each of these ints to 0
ATTACKS = {  # name: (program, tests, honest program)
    "item1_set": (f"def f(x):\n    return {COLLIDING}", ["assert set(f(7)) == {1, 2, 3}"],
                  "def f(x):\n    return [1, 2, 3, 3]"),
    "item1_counter": (f"def f(x):\n    return {COLLIDING}",
                      ["from collections import Counter\nassert Counter(f(7)) == Counter([1, 1])"],
                      "def f(x):\n    return [1, 1]"),
    "item1_dict": (f"def f(x):\n    return [(k, 0) for k in {COLLIDING}]", ["assert dict(f(7)) == {1: 0}"],
                   "def f(x):\n    return [(1, 0)]"),
    # colliding on the host only: inside, the tuples hash by id; each comparison walks 40 equal strings
    "item1_frozenset": ("""
        class T(tuple):
            __hash__ = object.__hash__
        def f(x):
            return frozenset(T(['ab'] * 40 + [(2**61 - 1) * i]) for i in range(3000))
        """, ["assert f(1) == 1"], "def f(x):\n    return 1"),
    "item2_per_value": ("S = set((2**61 - 1) * k for k in range(4096))\ndef f(x):\n    return S",
                        ["assert f(1) == 1"] * 40, "def f(x):\n    return 1"),
    "item3_permutations": ("def f(x):\n    return list(range(2000))",
                           ["import itertools\nassert len(list(itertools.permutations(f(1)))) == 2"],
                           "def f(x):\n    return [1, 2]"),
    "item3_map_list": ("def f(x):\n    return [range(10**5)] * 65535", ["assert list(map(list, f(1))) == [[0]]"],
                       "def f(x):\n    return [range(1)]"),
    "item3_map_sum": ("def f(x):\n    return [range(10**5)] * 65535", ["assert sum(map(sum, f(1))) == 1"],
                      "def f(x):\n    return [range(2)]"),
    "item4_empty_containers": ("def f(x):\n    return [set() for _ in range(131000)]",
                               ["\n".join(f"a{i} = f({i})" for i in range(10)) + "\nassert a0 == a9 == []"],
                               "def f(x):\n    return []"),
}


def host_cost(job: sandbox.Job) -> tuple[sandbox.SandboxResult, float, float]:
    """The job's result, the trainer process's own CPU seconds for it and the peak of its Python allocations
    (MB), its zygote and judging process already started."""
    sandbox.run_many([sandbox.Job("pass", ("pass",))], max_workers=1)
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF)
    tracemalloc.start()
    try:
        result = sandbox.run_many([job], max_workers=1)[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return result, cpu, peak / 2**20


@pytest.mark.parametrize("name", ATTACKS)
def test_issue46_values_that_are_dear_to_judge_are_cut_at_the_budget(name):
    program, tests, honest = ATTACKS[name]
    result, cpu, peak = host_cost(sandbox.Job(textwrap.dedent(program), tuple(tests), timeout_s=HANG_S))
    assert result.status == "failed" and result.passed == 0, result
    assert "judging its values on the host ran over its" in result.detail, result  # cut at the budget
    assert cpu < HOST_CPU_S and peak < HOST_MB, (cpu, peak)  # none of it on the trainer
    good = sandbox.run_tests(honest, tests, timeout_s=HANG_S)
    assert good.status == "ok", good  # the same test, judged within the budget


def test_issue46_a_program_text_that_is_dear_to_read_is_cut_at_the_budget():
    """The host reads a program's names (what it imports, binds and reads) before its tests are split: its text
    is the program's too. 60,000 f-string fields take seconds to parse."""
    program = 'x = f"' + "{1}" * 60000 + '"\ndef f(x):\n    return 1'
    result, cpu, peak = host_cost(sandbox.Job(program, ("assert f(1) == 1",), timeout_s=HANG_S))
    assert (result.status, result.passed) == ("failed", 0), result
    assert "reading its text on the host ran over its" in result.detail, result
    assert cpu < HOST_CPU_S and peak < HOST_MB, (cpu, peak)


def test_issue46_item5_the_split_cache_is_not_keyed_by_what_the_program_chooses():
    """A program picks which builtins it redefines: the plans cached for a test must not multiply with its choices."""
    test = "for x in range(300):\n    assert f(x) == 2 * x"  # a large plan (PLAN_MB): one step per item
    names = sorted(n for n in dir(builtins) if n.islower() and not n.startswith("_") and n != "f")[:24]
    programs = [f"def f(x):\n    return 2 * x\ndef {a}(): pass\ndef {b}(): pass" for a, b in zip(names, names[1:])]
    sandbox.run_tests(programs[0], [test], timeout_s=HANG_S)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        results = sandbox.run_many([sandbox.Job(p, (test,), timeout_s=HANG_S) for p in programs[1:]], max_workers=2)
        gc.collect()
        kept = (tracemalloc.get_traced_memory()[0] - base) / 2**20
    finally:
        tracemalloc.stop()
    assert {r.status for r in results} == {"ok"}, results
    assert kept < PLAN_MB, kept  # 23 jobs with 23 choices of builtins: one plan at most, not 23


def test_issue46_item6_a_value_the_host_cannot_print_is_the_programs_failure_not_none():
    program = "def f(x):\n    return 1 << 16000"
    tests = ["assert {1: 'a', 2: 'b'}[f(1)] == 'a'", "assert str(f(1)) == '1'", "assert f(1) == 1",
             "assert [f(1)] == [1]", "assert f(1) in {1: 2}"]
    result = sandbox.run_tests(program, tests, timeout_s=HANG_S)
    assert (result.status, result.passed) == ("failed", 0), result
    assert "KeyError" in result.stderr, result.stderr
    metrics = {}
    fenced = "```python\n" + program + "\n```"
    scores = unit_tests([fenced], [tests], lambda k, v: metrics.update({k: v}), timeout_s=HANG_S)
    assert scores == [0.0] and metrics["status/infra_error"] == 0, (scores, metrics)


def test_issue46_a_hostile_completion_in_every_group_keeps_the_trainer_flat():
    """Three steps of two groups: each group has an honest completion, a wrong one and a hostile one. The hostile
    rows score 0, the rest score as always, and the trainer's memory does not grow from step to step."""
    hostile = [ATTACKS[name] for name in ("item4_empty_containers", "item3_map_list", "item1_set")]
    peaks, kept = [], []
    started = len(children())
    gc.collect()
    tracemalloc.start()
    try:
        for step in range(3):
            program, tests, honest = hostile[step]
            fence = "```python\n{}\n```".format
            completions = [fence(honest), fence("def f(x):\n    return None"), fence(textwrap.dedent(program))] * 2
            tracemalloc.reset_peak()
            scores = unit_tests(completions, [tests] * 6, lambda k, v: None, timeout_s=HANG_S)
            assert scores == [1.0, 0.0, 0.0] * 2, (step, scores)
            gc.collect()
            peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
            kept.append(tracemalloc.get_traced_memory()[0] / 2**20)
    finally:
        tracemalloc.stop()
    assert max(peaks) < 2 * HOST_MB, peaks  # the records of the jobs in flight, not the values they hold
    assert kept[-1] - kept[0] < 4, kept  # nothing of a judged job stays behind
    assert len(children()) <= started + 2 * 6, (started, children())  # processes replaced, not piled up


def children() -> list[str]:
    """This process's child processes (zygotes, judging processes)."""
    pids = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            pids += f.read().split()
    return pids


# ---- no value a program can send makes the reward None (TRL would give that row no advantage at all)

_LEAVES = st.sampled_from([
    "1 << 16000", "-(1 << 16000)", "float('nan')", "float('inf')", "1e308", "-0.0", "complex(1, float('nan'))",
    "'\\udcff'", "'x' * 100000", "b'\\xff' * 1000", "bytearray(b'a')", "range(10**5)", "range(1 << 100)",
    "None", "True", "0", "''", "()", "iter([1, 2])", "(x for x in 'ab')", "frozenset({1})", "{1: 2}", "set()",
    "(2**61 - 1) * 3", "object()", "type", "print", "Exception('e')", "...",
])
_VALUES = st.recursive(_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=3).map(lambda xs: "[%s]" % ", ".join(xs)),
    st.lists(inner, max_size=3).map(lambda xs: "(%s,)" % ", ".join(xs) if xs else "()"),
    st.tuples(inner, inner).map(lambda kv: "{%s: %s}" % kv),
    st.tuples(inner, st.sampled_from(["2", "1000", "65536"])).map(lambda vn: "[%s] * %s" % vn),
), max_leaves=6)
_TESTS = ["assert {1: 'a', 2: 'b'}[f(1)] == 'a'", "assert str(f(1)) == '1'", "assert set(f(1)) == {1}",
          "assert sorted(f(1)) == [1]", "assert f(1) == 1", "assert f(1) in [1, 2]", "assert len(f(1)) == 1",
          "assert f(1)[0] == 1", "assert f(1) + 1 == 2", "assert format(f(1), 'x') == '1'", "assert hash(f(1)) == 1",
          "assert int(f(1)) == 1", "assert dict(f(1)) == {}", "assert max(f(1)) == 1", "assert abs(f(1) - 1) < 1e-9",
          "assert f(1).startswith('a')", "assert list(map(list, f(1))) == []", "assert sum(f(1)) == 1",
          "r = f(1)\nassert r is not None and r == r", "import math\nassert math.isclose(f(1), 1.0)",
          "from collections import Counter\nassert Counter(f(1)) == Counter()"]


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_VALUES, min_size=3, max_size=3))
def test_issue46_item6_no_program_value_makes_the_reward_none(values):
    completions = ["```python\ndef f(x):\n    return %s\n```" % v for v in values]
    metrics = {}
    scores = unit_tests(completions, [_TESTS] * len(values), lambda k, v: metrics.update({k: v}), timeout_s=HANG_S)
    assert None not in scores and metrics["status/infra_error"] == 0, (scores, metrics)
