"""Guard rewards: shape length and repetition alongside a task reward. They read token ids, not text.

`overlong_penalty` and `repetition_penalty` wrap TRL's own (`trl.rewards`), so their numbers match TRL's docs.
Without `completion_ids` (a reward called outside the trainer) they return None and count it in `no_token_ids`.
"""

from __future__ import annotations

import functools
from typing import Annotated

from grpo_recipes.rewards import Range, reward


@functools.lru_cache(maxsize=16)
def _trl_overlong(max_completion_len: int, soft_punish_cache: int):
    from trl.rewards import get_soft_overlong_punishment

    return get_soft_overlong_punishment(max_completion_len, soft_punish_cache)


@functools.lru_cache(maxsize=16)
def _trl_repetition(ngram_size: int, max_penalty: float):
    from trl.rewards import get_repetition_penalty_reward

    return get_repetition_penalty_reward(ngram_size, max_penalty)


def _without_ids(completions: list[str], log_metric) -> list[None]:
    log_metric("no_token_ids", 1.0)
    return [None] * len(completions)


@reward("overlong_penalty")
def overlong_penalty(
    completions: list[str],
    completion_ids,
    log_metric,
    *,
    max_completion_len: Annotated[int, Range(ge=0)] = 256,
    soft_punish_cache: Annotated[int, Range(ge=0)] = 64,
) -> list[float | None]:
    """DAPO soft overlong penalty: 0 up to max_completion_len - soft_punish_cache tokens, then linear down to -1 at the limit."""
    if completion_ids is None:
        return _without_ids(completions, log_metric)
    if not 0 <= soft_punish_cache <= max_completion_len:
        raise ValueError(f"soft_punish_cache ({soft_punish_cache}) must be within [0, {max_completion_len}], "
                         "the max_completion_len")
    return _trl_overlong(int(max_completion_len), int(soft_punish_cache))(list(completion_ids))


@reward("repetition_penalty")
def repetition_penalty(
    completions: list[str],
    completion_ids,
    log_metric,
    *,
    ngram_size: Annotated[int, Range(ge=1)] = 3,
    max_penalty: Annotated[float, Range(le=0)] = -1.0,
) -> list[float | None]:
    """Penalty proportional to the share of repeated token n-grams, from 0 (none repeated) down to max_penalty."""
    if completion_ids is None:
        return _without_ids(completions, log_metric)
    return _trl_repetition(int(ngram_size), float(max_penalty))([list(ids) for ids in completion_ids])


@reward("length_reward")
def length_reward(
    completions: list[str],
    completion_ids,
    log_metric,
    *,
    target_len: Annotated[int, Range(gt=0)] = 256,
) -> list[float | None]:
    """1.0 at exactly target_len tokens, falling linearly to 0.0 at 0 and at 2 x target_len tokens (and beyond)."""
    if completion_ids is None:
        return _without_ids(completions, log_metric)
    if target_len <= 0:
        raise ValueError(f"target_len must be positive, got {target_len}")
    return [max(0.0, 1.0 - abs(len(ids) - target_len) / target_len) for ids in completion_ids]


# Examples for `grpo-recipes rewards check`, which counts one token per UTF-8 byte.
overlong_penalty.check_examples = lambda row, params: {
    "good": ["A short answer: 42."],
    "bad": ["word " * params["max_completion_len"]],
}
repetition_penalty.check_examples = lambda row, params: {
    "good": ["Quick zebras jump over lively dogs."],
    "bad": ["ha" * 200, "the same line\n" * 30],
}
length_reward.check_examples = lambda row, params: {
    "good": ["x" * params["target_len"]],
    "bad": ["", "x" * (3 * params["target_len"])],
}
