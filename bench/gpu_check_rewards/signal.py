"""A reward for bench/gpu_check.py alone (its `--reward_dirs`): a randomly initialised model's answers never score, so
the math task's rewards tie in every group, the skip (skip_zero_advantage_batches) would train no row, and prompt
sharing and the backward pass would never run. This reward ties within the groups of about half of the questions,
chosen by the question's text (the same on every device), and differs within the others' groups, so that the skip,
the loss and dynamic sampling's refills all have work."""

from __future__ import annotations

import zlib

from grpo_recipes.rewards.registry import reward


@reward("gpu_check_signal")
def gpu_check_signal(completions: list[str], question: list) -> list[float]:
    """0 for a question whose CRC-32 is even; otherwise the completion's share of distinct characters (a random
    model's completions differ in it)."""
    return [len(set(c)) / len(c) if c and zlib.crc32(str(q).encode()) % 2 else 0.0
            for c, q in zip(completions, question)]
