"""A reward file for tests/test_skip_zero_advantage.py, found through `reward_dirs` as a user's would be."""

from grpo_recipes.rewards import reward


@reward("test_length_on_multiples_of_three")
def length_on_multiples_of_three(completions, answer):
    """Characters per completion where the gold answer is a multiple of 3, else 0: about a third of the groups
    carry advantages and the rest none, so some micro-batches skip and some steps skip whole."""
    return [float(len(text)) if int(gold) % 3 == 0 else 0.0 for text, gold in zip(completions, answer)]
