"""Spell a word backward (reasoning-gym `spell_backward`), the answer alone in one box: docs/tasks.md's example."""

import json
import re

from grpo_recipes.rewards import reward
from grpo_recipes.tasks import Task, task

BOX = re.compile(r"\\boxed\{([^{}]*)\}")


@reward("spelled_backward")
def spelled_backward(completions, answer):
    """1.0 when the completion's one box holds exactly the word spelled backward; 0.0 otherwise (no box, several)."""
    scores = []
    for text, gold in zip(completions, answer):
        boxes = BOX.findall(text)
        scores.append(float(len(boxes) == 1 and boxes[0].strip() == gold))
    return scores


@task("spell_backward")
class SpellBackward(Task):
    defaults = {
        "dataset_source": "reasoning_gym",
        "gym_task": "spell_backward",
        "prompt_template": "{question} Answer as \\boxed{{letters}}.",
        "rewards": [{"name": "spelled_backward"}],
        "demonstration_field": "demonstration",
    }

    def prepare(self, row, recipe):
        word = json.loads(row["gym_entry"])["metadata"]["word"]
        # The letters one by one, then the answer: the working a person would write.
        return {**row, "demonstration": f"{' '.join(reversed(word))}. \\boxed{{{row['answer']}}}"}
