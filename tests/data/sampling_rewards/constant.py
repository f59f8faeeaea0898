"""A reward file for tests/test_sampling.py: every completion scores the same, so every group has zero advantage."""

from grpo_recipes.rewards import reward


@reward("test_constant")
def constant(completions):
    """1.0 for every completion: no group's rewards ever differ."""
    return [1.0 for _ in completions]
