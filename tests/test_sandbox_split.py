"""The host's side of a verdict, without a sandbox: splitting tests, the data-only codec, the host evaluator, and
reading result records. These decide what a program can and cannot forge, so they are tested piece by piece."""

import ast
import gc
import json
import sys
import threading
import time

import pytest

from grpo_recipes.sandbox import split, verdict
from grpo_recipes.sandbox.inside import codec
from grpo_recipes.tasks.code_rows import generate_code_tasks
from grpo_recipes.tasks.humaneval import load_humaneval

# ---- codec: plain data in, plain data out, bounded, nothing executed


class _I(int):
    __eq__ = lambda self, other: True  # noqa: E731 - the issue's reproducer
    __hash__ = int.__hash__


class _Weird:
    pass


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 2 ** 200, -(2 ** 70), 1.5, -0.0, float("inf"), 1e-300, 3 + 4j, "", "héllo\n\x00\udcff",
    b"\x00\xff", bytearray(b"ab"), [], [1, [2, [3]]], (), (1, "a", None), {1, 2}, frozenset({(1, 2)}),
    {"a": [1, {"b": (2,)}], 3: None}, range(2, 10, 3),
])
def test_codec_round_trips_plain_data_exactly(value):
    tokens = json.loads(json.dumps(codec.encode(value)))
    back = codec.decode(tokens)
    assert back == value and type(back) is type(value)


def test_codec_nan_and_iterators():
    assert str(codec.decode(codec.encode(float("nan")))) == "nan"
    back = codec.decode(codec.encode(x * x for x in range(4)))
    assert list(back) == [0, 1, 4, 9]


def test_subclasses_travel_as_their_base_value_and_objects_do_not_travel():
    back = codec.decode(codec.encode(_I(0)))
    # the builtin's value and behaviour (the rigged __eq__ stays behind), marked as a subclass: `type(r) is int`
    # is False on the host, as it is in Python (issue 46)
    assert isinstance(back, int) and type(back) is not int and type(back) is not _I and back == 0 and back != 1
    assert type(back).__eq__ is int.__eq__ and type(back).__hash__ is int.__hash__
    assert codec.decode(codec.encode([_I(5)])) == [5]
    with pytest.raises(codec.CodecError):
        codec.encode(_Weird())
    with pytest.raises(codec.CodecError):
        codec.encode([lambda: 1])


def test_encode_survives_deep_or_self_referencing_values():
    deep = []
    for _ in range(codec.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(codec.CodecError):
        codec.encode(deep)
    loop = []
    loop.append(loop)
    with pytest.raises(codec.CodecError):
        codec.encode(loop)
    with pytest.raises(codec.CodecError):
        codec.encode("x" * (codec.MAX_BYTES + 1))


@pytest.mark.parametrize("tokens", [
    "not a list", [], ["l", 2, "i", "1"], ["i", "1", "i", "2"], ["i", "zz"], ["i", "1" * (codec.MAX_INT_HEX + 1)],
    ["f", "1e5; import os"], ["f", "__import__('os')"], ["s", 5], ["b", "xyz"], ["?"], [["l"]], ["l", -1],
    ["l", 10 ** 9], ["S", 1, "l", 0], ["d", 1, "l", 0, "N"], ["r", "0", "fffffffff", "1"],
    ["l", 1] * (codec.MAX_DEPTH + 1) + ["N"], ["r", "0", "f" * 4000, "1"],  # a range len() cannot size
    ["S", codec.MAX_HASHED + 1] + ["i", "0"] * (codec.MAX_HASHED + 1),
])
def test_decode_rejects_malformed_or_unbounded_tokens(tokens):
    with pytest.raises(codec.CodecError):
        codec.decode(tokens)


def test_hash_collisions_are_bounded():
    colliding = [(2 ** 61 - 1) * k for k in range(codec.MAX_HASHED)]  # all hash to 0
    assert len(codec.decode(codec.encode(set(colliding)))) == codec.MAX_HASHED
    with pytest.raises(codec.CodecError):
        codec.decode(codec.encode([set(colliding[:3000]), set(colliding[:3000])]))


# ---- splitting: what goes in, what stays out


def steps_of(source):
    plan = split.split_test(source)
    assert plan.mode == "host", plan.reason
    return [s[1] for s in plan.steps]


def sent(plan) -> str:
    """Everything a plan sends into the sandbox, as text."""
    return json.dumps([[s[1], s[2]] for s in plan.steps])


@pytest.mark.parametrize("test, probes", [
    ("assert f(2) == 4", ["f(2)"]),
    ("assert f(2) != 5", ["f(2)"]),
    ("assert abs(f(1) - 0.3333) < 1e-3", ["f(1)"]),
    ("assert f(1) is True and f(2) is None", ["f(1)", "f(2)"]),
    ("assert not f('x')", ["f('x')"]),
    ("assert f('x')", ["f('x')"]),
    ("r = f(2); assert type(r) is int and r == 4", ["f(2)"]),
    ("assert sorted(f([3, 1])) == [1, 3]", ["f([3, 1])"]),
    ("assert f('a').startswith('ab')", ["f('a')"]),
    ("import math\nassert math.isclose(f(1), 0.5)", ["import math", "f(1)"]),
    ("assert f(x=3)[0] == 'secret'", ["f(x=3)"]),
    ("for x in range(3):\n    assert f(x) == x * 2", ["f(x)", "f(x)", "f(x)"]),
    ("assert [f(x) for x in range(3)] == [0, 2, 4]", ["[f(x) for x in range(3)]"]),
    ("def check(candidate):\n    assert candidate(1) == 'one'\ncheck(spell)", ["spell(1)"]),
])
def test_humaneval_style_assertions_are_split(test, probes):
    assert steps_of(test) == probes


@pytest.mark.parametrize("test, secrets", [
    ("assert f(2) == 4444", ["4444"]),
    ("assert abs(f(1) - 0.3333) < 1e-3", ["0.3333", "0.001"]),
    ("assert f('a').startswith('zyx') == True", ["zyx", "true"]),
    ("expected = [98, 87]\nassert f(3) == expected", ["98", "87"]),
    ("assert f(1) == 'four' and f(2) in ('five', 'six')", ["four", "five", "six"]),
    ("for x in [7]:\n    assert f(x) == 'seven' + str(x)", ["seven"]),
    ("assert f(1) == {'k': (4444, 'four')}", ["4444", "four"]),
    ("assert sorted(f(1), reverse=True) == [3, 2, 1]", ["3, 2"]),
    ("tests = [([3, 1, 2], [7777, 8888])]\nfor t in tests:\n    assert f(t[0]) == t[1]", ["7777"]),
    ("cases = [{'in': 2, 'out': 7777}]\nfor case in cases:\n    assert f(case['in']) == case['out']", ["7777", "out"]),
    ("for c in [(1, 2, 7777)]:\n    assert f(*c[:-1]) == c[-1]", ["7777"]),
    ("assert all(f(x) == y for x, y in [(1, 7777)])", ["7777"]),
    ("assert [f(t[0]) for t in [(1, 7777)]] == [7777]", ["7777"]),
    ("assert [f(x) for x, y in [(1, 7777), (2, 0)] if y] == [2]", ["7777"]),
    ("assert f(1) == next(iter([7777]))", ["7777"]),
    ("assert f(1) == format(7777, 'x')", ["7777"]),
    ("from collections import Counter\nassert f('ab') == Counter('zzzz')", ["zzzz"]),
    ("import itertools\nassert f(1) == list(itertools.permutations('zyx'))", ["zyx"]),
])
def test_expected_values_never_enter_the_sandbox(test, secrets):
    plan = split.split_test(test)
    assert plan.mode == "host", plan.reason
    text = sent(plan).lower()
    assert plan.steps and not [s for s in secrets if s in text], text


def test_a_value_the_program_may_change_is_read_back_after_the_call():
    plan = split.split_test("a = [3, 1, 2]\nr = f(a)\nassert r == [1, 2, 3] and a == [3, 1, 2]")
    assert [s[1] for s in plan.steps] == ["f(a)", "a"]  # a lives in the sandbox once f has it
    assert split.judge(plan, [[1, 2, 3], [3, 1, 2]])[0]
    assert not split.judge(plan, [[1, 2, 3], [1, 2, 3]])[0]  # f sorted it in place
    plan = split.split_test("a = [3, 1, 2]\nf(a)\nassert a == [1, 2, 3]")
    assert [s[1] for s in plan.steps] == ["f(a)", "a"]
    assert split.judge(plan, [None, [1, 2, 3]])[0] and not split.judge(plan, [None, [3, 1, 2]])[0]
    assert [s[1] for s in split.split_test("x = (1, 'a')\nf(x)\nassert x == (1, 'a')").steps] == ["f(x)"]


def test_a_builtin_the_program_redefines_is_the_programs_and_the_real_one():
    assert split.shadowed_builtins("def sum(xs): pass\nimport math as len\nfor max in []: pass\n"
                                   "def g():\n    global min\nx = 1\nclass list: pass") == {"sum", "len", "max",
                                                                                       "min", "list"}
    assert split.shadowed_builtins("def f(:") == frozenset()
    plan = split.split_test("assert sum([1, 2, 3]) == 6", frozenset({"sum"}))
    assert plan.program_names and [s[1] for s in plan.steps] == ["sum([1, 2, 3])"]
    assert split.judge(plan, [6])[0] and not split.judge(plan, [0])[0]
    plan = split.split_test("assert f(0) == sorted([3, 1, 2])", frozenset({"sorted"}))  # f too: the real sorted
    assert not plan.program_names and [s[1] for s in plan.steps] == ["f(0)"]


def test_inputs_made_by_modules_the_host_does_not_evaluate_stay_in_the_sandbox():
    plan = split.split_test("import json\ndata = json.loads('[1, 2]')\nassert f(data) == 3")
    assert plan.mode == "host" and [s[1] for s in plan.steps] == ["import json", "json.loads('[1, 2]')", "f(data)"]
    assert split.split_test("import json\ndata = json.loads('[1, 2]')\nassert f(1) == data").mode == "sandbox"


def test_inputs_do_enter_as_plain_data():
    plan = split.split_test("xs = list(range(3))\nassert f(xs) == 3")
    (step,) = plan.steps
    assert step[1] == "f(xs)" and step[2] == (("xs", codec.encode([0, 1, 2])),)


@pytest.mark.parametrize("test, why", [
    ("try:\n    f(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False", "Try"),
    ("assert all(f(x) == 2 * x for x in f(3))", "comprehension"),
    ("assert f(1) == ''.join(['a', 'b']).title().zfill(3)", "cannot evaluate"),
    ("if f(1):\n    assert f(2) == 3", "an if on values the program computes"),
    ("import numpy as np\nassert np.allclose(f(1), [1, 2])", "the sandbox may not see its values"),
    ("assert f(1) == ascii('x')", "cannot evaluate"),
    ("def helper():\n    return 3\nassert f() == helper()", "FunctionDef"),
    ("assert f(1) == (lambda: 3)()", "cannot evaluate"),
    ("s = f(1) + 1\nassert g(s) == 2", "passed back in"),
])
def test_what_cannot_be_split_runs_in_the_sandbox_and_says_why(test, why):
    plan = split.split_test(test)
    assert plan.mode == "sandbox" and why in plan.reason and plan.source == test
    assert plan.wire() == ("sandbox", test, False)


def test_humaneval_is_all_judged_on_the_host():
    rows = load_humaneval()
    plans = [split.split_test(r["tests"][0]) for r in rows]
    in_sandbox = sorted(r["task_id"] for r, p in zip(rows, plans) if p.mode == "sandbox")
    # 32 builds its inputs with a seeded random.Random, 38 and 50 with random and string: all evaluated here
    assert in_sandbox == []


class _Cycle:
    """Cyclic garbage whose finalizer runs Python code: a collection inside a parse's allocations switches threads."""

    def __init__(self):
        self.me = self

    def __del__(self):
        sum(range(200))
        time.sleep(0)


def test_splitting_in_worker_threads_survives_thread_switches_mid_parse():
    """run_many splits in worker threads. CPython 3.11 shares the AST constructor's depth counter between threads
    (gh-106905): a CI run under load failed HumanEval's canonical solutions with "SystemError: AST constructor
    recursion depth mismatch". Here the switches are forced; without the split lock this failed within a few runs."""
    tests = [r["tests"][0] for r in load_humaneval()][:60]
    errors = []

    def work(k: int) -> None:
        for n, test in enumerate(tests):
            for _ in range(20):
                _Cycle()
            try:
                split.split_test(f"{test}\n# {k} {n}")  # a new source each time: split_test is cached
            except SystemError as exc:
                errors.append(str(exc))

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(50, 1, 1)
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
    assert errors == []


def test_the_training_tasks_are_all_judged_on_the_host():
    rows = generate_code_tasks(300, seed=0)
    assert {split.split_test(t).mode for r in rows for t in r["tests"]} == {"host"}


# ---- the host evaluator: pure functions only, bounded


def judge(test, values):
    plan = split.split_test(test)
    return split.judge(plan, values)


def test_judge_compares_real_values():
    assert judge("assert f(2) == 4", [4]) == (True, "")
    ok, why = judge("assert f(2) == 4", [5])
    assert not ok and "false on the host" in why and "5" in why
    assert judge("assert f(2) == 4", [4.0])[0]  # Python's own == : 4.0 == 4
    assert not judge("r = f(2)\nassert type(r) is int and r == 4", [4.0])[0]
    assert not judge("assert f(1) is True", [1])[0]
    assert judge("assert abs(f(1) - 1/3) < 1e-6", [0.3333333333])[0]


def test_judge_failures_raised_and_opaque_values():
    ok, why = judge("assert f(2) == 4", [split.Raised("ZeroDivisionError")])
    assert not ok and "ZeroDivisionError" in why
    ok, why = judge("assert f(2) == 4", [split.Opaque("a Foo is not plain data")])
    assert not ok and "Foo" in why
    assert judge("x = f(1)\nassert g(2) == 3", [split.Opaque("a Foo"), 3])[0]  # never used on the host: fine
    assert judge("assert f(1) is None or f(2) == 3", [None, split.Raised("ValueError")])[0]  # short-circuit


@pytest.mark.parametrize("test", [
    "assert f(1) == 2 ** 10 ** 8", "assert f(1) == 'x' * 10 ** 9", "assert f(1) == 1 << 10 ** 9",
    "assert f(1) == list(range(10 ** 12))", "assert f(1) == '%0999999d' % 1", "assert f(1) == bytes(10 ** 12)",
    "assert f(1) == format(1, '999999999')", "assert f(1) == hash('differs per process')",
    "import itertools\nassert f(1) == len(list(itertools.permutations(range(12))))",
])
def test_the_host_evaluator_refuses_unbounded_work(test):
    ok, why = judge(test, [1])
    assert not ok and "on the host" in why


@pytest.mark.parametrize("expr", [
    "(1).__class__", "(1).__class__.__subclasses__()", "__import__('os')", "open('/etc/passwd')", "eval('1')",
    "type(1)(2).__init__", "getattr(1, 'real')", "[].append(1)", "{}.setdefault(1, 2)", "print(1)", "f(1)",
    "'{0.__class__}'.format(1)", "(lambda: 1)()", "[x for x in ()].__len__()",
])
def test_the_host_evaluator_runs_no_arbitrary_code(expr):
    with pytest.raises(split.HostJudgeError):
        split.Evaluator({})(ast.parse(expr, mode="eval").body)


def test_dunder_access_on_a_program_value_happens_in_the_sandbox_not_here():
    plan = split.split_test("assert f(1).__class__ == int")
    assert [s[1] for s in plan.steps] == ["f(1).__class__"]
    ok, why = split.judge(plan, [split.Opaque("a type is not plain data")])
    assert not ok and "not plain data" in why


# ---- result records: order, nonce, well-formedness


NONCE = "ab" * 16


def records(*recs) -> bytes:
    return b"".join(f"{NONCE} {json.dumps(list(r))}\n".encode() for r in recs)


def test_records_in_order_are_judged():
    plans = [split.split_test("assert f(2) == 4"), split.split_test("try:\n    f(0)\nexcept Exception:\n    pass")]
    raw = records(["ready"], ["load", True], ["value", 0, 0, codec.encode(4)], ["end", 0], ["verdict", 1, True],
                  ["done"])
    ready, done, outcomes, forged = verdict.read_tests(raw, NONCE, plans)
    assert (ready, done, forged) == (True, True, "")
    assert [(o.passed, o.mode) for o in outcomes] == [(True, "host"), (True, "sandbox")]


@pytest.mark.parametrize("raw", [
    records(["ready"], ["load", True], ["value", 0, 0, codec.encode(4)], ["end", 0], ["end", 0], ["done"]),
    records(["ready"], ["load", True], ["value", 0, 1, codec.encode(4)], ["end", 0], ["done"]),
    records(["ready"], ["load", True], ["verdict", 0, True], ["done"]),
    records(["ready"], ["load", True], ["value", 0, 0, codec.encode(4)], ["end", 0], ["done"], ["done"]),
    records(["ready"], ["load", True]) + b"0" * 32 + b' ["value",0,0,["i","4"]]\n',
    records(["ready"], ["load", True]) + f'{NONCE} ["value",0,0,1e400]\n'.encode(),
    records(["ready"], ["load", True]) + f'{NONCE} {"[" * 100000}\n'.encode(),
    records(["ready"], ["load", True]) + f'{NONCE} ["value",0,0,{"9" * 5000}]\n'.encode(),
])
def test_out_of_order_or_malformed_records_are_tampering(raw):
    ready, done, outcomes, forged = verdict.read_tests(raw, NONCE, [split.split_test("assert f(2) == 4")])
    assert forged == "result records tampered with"


def test_a_forged_value_record_is_still_judged_against_the_host_value():
    raw = records(["ready"], ["load", True], ["value", 0, 0, codec.encode(5)], ["end", 0], ["done"])
    _, done, outcomes, forged = verdict.read_tests(raw, NONCE, [split.split_test("assert f(2) == 4")])
    assert done and not forged and outcomes[0].passed is False
