"""A reward file for tests/test_distill.py, found through `reward_dirs` as a user's would be."""

from grpo_recipes.rewards import reward


@reward("test_even_length")
def even_length(completions):
    """1 for a completion of an even number of characters, else 0: a random tiny teacher passes this verifier on about
    half of its samples, so a distill stage keeps some traces and rejects others."""
    return [float(len(text) % 2 == 0) for text in completions]
