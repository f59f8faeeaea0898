"""Guard rewards: the same numbers as TRL's own functions, None without token ids, and the length reward."""

from __future__ import annotations

import pytest
from trl.rewards import get_repetition_penalty_reward, get_soft_overlong_punishment

from grpo_recipes.rewards.registry import available

REWARDS = available()
IDS = [[1] * 10, [1] * 85, [1] * 90, [1] * 100, [1] * 130, list(range(50)), [1, 2, 3] * 20, [7, 8]]


def run(name: str, ids, **params) -> tuple[list, dict]:
    metrics = {}
    texts = ["x"] * (len(ids) if ids is not None else 3)
    return REWARDS[name].func(texts, ids, log_metric=metrics.__setitem__, **params), metrics


def test_overlong_penalty_matches_trl():
    out, _ = run("overlong_penalty", IDS, max_completion_len=100, soft_punish_cache=20)
    assert out == get_soft_overlong_punishment(100, 20)(IDS)
    assert out[:5] == [0.0, -0.25, -0.5, -1.0, -1.0]


def test_repetition_penalty_matches_trl():
    out, _ = run("repetition_penalty", IDS, ngram_size=2, max_penalty=-0.5)
    assert out == get_repetition_penalty_reward(2, -0.5)(IDS)
    assert out[5] == 0.0 and out[6] < -0.4


def test_length_reward_peaks_at_target():
    out, _ = run("length_reward", [[0] * n for n in (0, 50, 100, 150, 200, 500)], target_len=100)
    assert out == [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]


@pytest.mark.parametrize("name", ["overlong_penalty", "repetition_penalty", "length_reward"])
def test_guards_without_token_ids_score_none_and_say_so(name):
    out, metrics = run(name, None)
    assert out == [None, None, None] and metrics == {"no_token_ids": 1.0}


@pytest.mark.parametrize("name, params", [
    ("overlong_penalty", {"max_completion_len": 10, "soft_punish_cache": 20}),
    ("repetition_penalty", {"max_penalty": 0.5}),
    ("length_reward", {"target_len": 0}),
])
def test_guards_reject_impossible_params(name, params):
    with pytest.raises(ValueError):
        run(name, IDS, **params)
