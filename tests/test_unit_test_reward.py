"""The code rewards: code extraction, scores, None for sandbox failures, metrics, and the registry contract."""

import functools

import pytest

from grpo_recipes import sandbox
from grpo_recipes.rewards import registry
from grpo_recipes.rewards.registry import CompiledReward, RewardSpec
from grpo_recipes.values import value_problem

known = registry.available()
# a generous per-job budget: on a loaded machine a right answer must never score less for want of time
unit_tests = functools.partial(known["unit_tests"].func, timeout_s=120)
unit_tests_binary = functools.partial(known["unit_tests_binary"].func, timeout_s=120)
io_tests = functools.partial(known["io_tests"].func, timeout_s=120)
extract_code = known["unit_tests"].func.__globals__["extract_code"]

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]
RIGHT = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"
HALF = "```python\ndef add(a, b):\n    return a + b if a > 0 else 99\n```"  # passes 2 of 3


class Metrics(dict):
    def __call__(self, name, value):
        self[name] = value


def test_contract_seen_by_the_registry():
    for name, column in (("unit_tests", "tests"), ("unit_tests_binary", "tests"), ("io_tests", "io_cases")):
        rdef = known[name]
        assert rdef.columns == (column,) and rdef.context == ("log_metric",)
        assert {"timeout_s", "memory_mb", "code_block", "whole_text_fallback"} <= set(rdef.params)
        assert rdef.doc


def test_fraction_binary_and_metrics():
    metrics = Metrics()
    completions = [RIGHT, HALF, "no code here", "```python\nimport os\nos._exit(0)\n```"]
    scores = unit_tests(completions, [TESTS] * 4, metrics)
    assert scores == [1.0, pytest.approx(2 / 3), 0.0, 0.0]
    assert metrics["status/ok"] == 1 and metrics["status/failed"] == 1 and metrics["status/crashed"] == 1
    assert metrics["status/no_code"] == 1 and metrics["status/infra_error"] == 0
    assert metrics["pass_rate"] == pytest.approx((1 + 2 / 3) / 4)
    assert unit_tests_binary(completions, [TESTS] * 4, Metrics()) == [1.0, 0.0, 0.0, 0.0]


def test_code_block_choice_and_whole_text_fallback():
    two = "```python\ndef add(a, b):\n    return None\n```\nbetter:\n```python\ndef add(a, b):\n    return a + b\n```"
    assert unit_tests([two], [TESTS], Metrics()) == [1.0]  # last block by default
    assert unit_tests([two], [TESTS], Metrics(), code_block="first") == [0.0]
    assert unit_tests([two], [TESTS], Metrics(), code_block="all") == [1.0]  # later definition wins
    bare = "def add(a, b):\n    return a + b\n"
    assert unit_tests([bare], [TESTS], Metrics()) == [0.0]
    assert unit_tests([bare], [TESTS], Metrics(), whole_text_fallback=True) == [1.0]


def test_extraction_never_raises_on_malformed_completions():
    odd = [None, 42, "", "```", "``````", "```python", "```python\n", "```js\nx\n```", "\x00```python\nx=1",
           "```python\n" + "a" * 200_000 + "\n```", "```PY\nx = 1\n```", "text ```python inline``` text",
           "```python\r\ndef add(a, b):\r\n    return a + b\r\n```"]
    for text in odd:
        extract_code(text)
    assert extract_code("```python\nx = 1") == "x = 1"  # unclosed: a truncated answer is still code
    assert extract_code("```\nx = 2\n```") == "x = 2"  # untagged block when no python one exists
    assert extract_code("```js\nx\n```") is None
    assert extract_code("```python\n" + "a" * 200_000 + "\n```") is None  # too long to be an answer
    scores = unit_tests(odd, [TESTS] * len(odd), Metrics())
    assert len(scores) == len(odd) and scores[-1] == 1.0
    assert all(s == 0.0 for s in scores[:-1])


def test_unusable_rows_score_none_and_json_columns_parse():
    rows = [None, [], "not json", [1, 2], '["assert add(1, 2) == 3"]']
    metrics = Metrics()
    assert unit_tests([RIGHT] * 5, rows, metrics) == [None, None, None, None, 1.0]
    assert metrics["status/bad_row"] == 4


def test_infra_error_scores_none_not_zero(monkeypatch):
    monkeypatch.setattr(sandbox.host, "PYTHON", "/nonexistent/python")
    sandbox.shutdown()
    metrics = Metrics()
    assert unit_tests([RIGHT, "no code"], [TESTS] * 2, metrics) == [None, 0.0]
    assert metrics["status/infra_error"] == 1


def test_io_tests_reward():
    program = "```python\nimport sys\nprint(sum(map(int, sys.stdin.read().split())))\n```"
    cases = [["1 2", "3"], ["4 5 6", "15\n"], ["0", "1"]]
    assert io_tests([program, "nothing"], [cases] * 2, Metrics()) == [pytest.approx(2 / 3), 0.0]
    assert io_tests([program], [[["1", "1", "extra"]]], Metrics()) == [None]  # malformed case


def test_through_the_trl_facing_wrapper():
    reward = CompiledReward(known["unit_tests"], RewardSpec("unit_tests", params={"timeout_s": 120.0}))
    logged = {}
    chat = [[{"role": "assistant", "content": RIGHT}], [{"role": "assistant", "content": HALF}]]
    scores = reward(chat, tests=[TESTS, TESTS], prompts=["p", "p"], log_metric=lambda k, v: logged.update({k: v}))
    assert scores == [1.0, pytest.approx(2 / 3)]
    assert logged["rewards/unit_tests/status/ok"] == 1.0 and logged["rewards/unit_tests/none_rate"] == 0.0


def test_the_share_of_tests_judged_in_the_sandbox_is_logged():
    metrics = Metrics()
    unit_tests([RIGHT, HALF], [TESTS] * 2, metrics)
    assert metrics["judged_in_sandbox"] == 0.0  # plain asserts: the host judged every one
    whole = "try:\n    add(None, 1)\nexcept TypeError:\n    pass\nelse:\n    assert False"
    metrics = Metrics()
    scores = unit_tests([RIGHT, "no code"], [TESTS + [whole]] * 2, metrics, sandbox_mode_tests="run")
    assert scores == [1.0, 0.0]
    assert metrics["judged_in_sandbox"] == pytest.approx(1 / 4)  # of the tests that ran: 1 of RIGHT's 4
    assert metrics["refused"] == 0.0


def test_tests_the_host_cannot_judge_are_refused_by_default():
    whole = "try:\n    add(None, 1)\nexcept TypeError:\n    pass\nelse:\n    assert False"
    metrics = Metrics()
    assert unit_tests([RIGHT], [TESTS + [whole]], metrics) == [pytest.approx(3 / 4)]  # failed, never run
    assert metrics["refused"] == pytest.approx(1 / 4) and metrics["judged_in_sandbox"] == 0.0
    assert unit_tests_binary([RIGHT], [TESTS + [whole]], Metrics()) == [0.0]
    assert unit_tests([RIGHT], [[whole]], metrics) == [0.0] and metrics["refused"] == 1.0
    hint = known["unit_tests"].param_types["sandbox_mode_tests"]
    assert "refuse" in value_problem("forge", hint)


def test_a_rigged_answer_scores_nothing():
    rigged = ("```python\nclass _I(int):\n    __eq__ = lambda s, o: True\n    __hash__ = int.__hash__\n"
              "def add(a, b):\n    return _I(7)\ntype = lambda o: int\n```")
    assert unit_tests([rigged], [TESTS], Metrics()) == [0.0]
