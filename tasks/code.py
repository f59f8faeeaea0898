"""Code (the code recipe): write a small Python function from its description; the row's `tests` run in the sandbox.

Training rows come from the config's data settings (recipes/data/code_train.jsonl); the held-out set is HumanEval,
never trained on. The verifier is `unit_tests`, the same reward as in training.
"""

from grpo_recipes.tasks import Task, task
from grpo_recipes.tasks.humaneval import load_humaneval


@task("code")
class Code(Task):
    defaults = {
        # refuse: a test the host cannot split is failed, not run where a program can forge it (docs/sandbox.md)
        "rewards": [{"name": "unit_tests", "weight": 1.0,
                     "params": {"timeout_s": 5.0, "memory_mb": 512, "sandbox_mode_tests": "refuse"}}],
        "answer_field": None,
    }

    def held_out(self, recipe):
        return load_humaneval()
