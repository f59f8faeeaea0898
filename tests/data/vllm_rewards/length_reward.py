"""A reward file for tests/test_vllm_cpu.py, found through `reward_dirs` as a user's would be."""

from grpo_recipes.rewards import reward


@reward("test_completion_length")
def completion_length(completions):
    """Characters per completion: rewards that differ within a group, so a random tiny model learns at once."""
    return [float(len(text)) for text in completions]
