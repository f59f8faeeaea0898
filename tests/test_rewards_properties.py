"""Every registered reward keeps its contract on arbitrary input: it never raises, and returns one finite float or
None per completion. Rewards are found through the registry, so a reward file added later is covered too."""

from __future__ import annotations

import functools
import json
import math
import random
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_recipes.rewards.registry import CONTEXT_NAMES, available
from grpo_recipes.tasks.json_rows import build_rows

pytestmark = pytest.mark.filterwarnings("ignore::Warning")  # sympy deprecations from odd LaTeX, not ours

REWARDS = available()
OURS = {"math.py", "json_schema.py", "guards.py", "exact.py", "format.py"}
JSON_ROWS = build_rows(8, seed=1)


@functools.lru_cache(maxsize=1)
def _gym_entries() -> list[str]:
    import reasoning_gym

    entries = []
    for task in ("basic_arithmetic", "leg_counting", "chain_sum", "letter_counting"):
        entries += [json.dumps(e, default=str) for e in reasoning_gym.create_dataset(task, size=2, seed=0)]
    return entries


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
COLUMNS = {
    "answer": st.sampled_from(["42", "-3", "0.5", "\\frac{1}{2}", "", "1,000", "x+1", "+5", "{"])
    | st.text(max_size=30),
    "schema": st.sampled_from([r["schema"] for r in JSON_ROWS] + ["{}", '{"type": "nonsense"}', "[]", "not json"])
    | json_values.map(json.dumps),
    "gold": st.sampled_from([r["gold"] for r in JSON_ROWS] + ["{}", "[]", "null", "not json"])
    | json_values.map(json.dumps),
    "gym_entry": st.sampled_from(_gym_entries() + ['{"metadata": {"source_dataset": "nope"}}', "{}", "x"])
    | st.text(max_size=30),
}
nested = st.builds(lambda depth, core, opener: opener * depth + core + "}" * depth,
                   st.integers(0, 3000), st.text(max_size=20), st.sampled_from(["{", "\\boxed{", '{"a":']))
wrapped_json = st.builds(lambda pre, value, post: f"{pre}```json\n{json.dumps(value)}\n```{post}",
                         st.sampled_from(["", "<think>\nx\n</think>\n", "<think>"]), json_values, st.text(max_size=20))
TAGS = ["<think>", "</think>", "\n", "\\boxed{", "}", "{", "$", "<answer>", "</answer>", "42", "x", " ", '"', "\\"]
tagged = st.lists(st.sampled_from(TAGS), max_size=60).map("".join)
TEXTS = st.text(max_size=2000) | nested | wrapped_json | tagged


def _call(name: str, texts: list[str], columns: dict, with_ids: bool):
    rdef = REWARDS[name]
    # One id per UTF-8 byte, capped like max_completion_length caps a real completion's tokens.
    ids = [list(t.encode("utf-8", "surrogatepass")[:32_768]) for t in texts] if with_ids else None
    context = {
        "prompts": ["Solve it."] * len(texts),
        "completion_ids": ids,
        "log_metric": lambda metric, value: math.isfinite(value) or pytest.fail(f"{name} logged {metric}={value}"),
        "log_extra": lambda column, values: None,
        "trainer_state": None,
        "completion_messages": [[{"role": "assistant", "content": t}] for t in texts],
        "environments": None,
    }
    assert set(rdef.context) <= set(CONTEXT_NAMES)
    return rdef.func(texts, **columns, **{k: context[k] for k in rdef.context})


def _assert_contract(name: str, out, n: int) -> None:
    assert isinstance(out, list) and len(out) == n, f"{name} returned {out!r:.200} for {n} completions"
    for value in out:
        assert value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)), value
        assert value is None or math.isfinite(value), f"{name} returned {value}"


def _examples(name: str) -> int:
    # Rewards from other files (e.g. sandboxed code tests) can be slow per call; a few examples still show a crash.
    return 25 if Path(REWARDS[name].source).name in OURS else 5


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_reward_contract_on_arbitrary_text(name):
    rdef = REWARDS[name]

    # Generous deadline: catastrophic regex backtracking takes minutes, a normal call milliseconds.
    @settings(max_examples=_examples(name), deadline=timedelta(seconds=10), derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def run(data):
        texts = data.draw(st.lists(TEXTS, min_size=1, max_size=4))
        columns = {c: [data.draw(COLUMNS.get(c, st.text(max_size=50))) for _ in texts] for c in rdef.columns}
        _assert_contract(name, _call(name, texts, columns, with_ids=data.draw(st.booleans())), len(texts))

    run()


def _huge_texts() -> list[str]:
    rng = random.Random(0)
    mb = 1_000_000
    return [
        "".join(map(chr, rng.choices(range(0x20, 0xD7FF), k=mb))),
        "{" * (mb // 2) + "}" * (mb // 2),
        '{"a": ' * 100_000 + "1" + "}" * 100_000,
        "\\boxed{" * 140_000,
        "<think>" * 140_000 + "</think>",
        "x" * mb + "\\boxed{42}",
        "1" * mb,
    ]


HUGE = _huge_texts()


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_reward_contract_on_megabyte_completions(name):
    rdef = REWARDS[name]
    rng = random.Random(0)
    columns = {c: [rng.choice(_plausible(c)) for _ in HUGE] for c in rdef.columns}
    _assert_contract(name, _call(name, HUGE, columns, with_ids=True), len(HUGE))


def _plausible(column: str) -> list[str]:
    return {
        "answer": ["42", "\\frac{1}{2}", ""],
        "schema": [r["schema"] for r in JSON_ROWS],
        "gold": [r["gold"] for r in JSON_ROWS],
        "gym_entry": _gym_entries()[:3],
    }.get(column, ["x"])
