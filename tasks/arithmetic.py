"""Arithmetic (the math and agent recipes): reasoning-gym `basic_arithmetic` expressions, answered in a box.

Each row gets its `expression` (from reasoning-gym's metadata) and, where the gold is the expression's exact value,
a `worked_solution`: the expression reduced one operation a step, then boxed (`-(5 + 2) = -(7) = -7. \\boxed{-7}`),
which an sft stage trains on. With `gold_check_tool`, a row whose gold the tool disagrees with is dropped
(reasoning-gym floors some divisions, so a correct calculator answer would score 0 there).

Rewards: `math_correctness` with `answer_form: literal`, the strict verifier (the question is an expression, so only
the number itself may count: with "expression", \\boxed{( -9 - 8 )}, the question copied into the box, scores 1.0 on
every question; docs/rewards.md), reading the working too (`check_working`, `check_equations`: every equation must
hold and the last must end on the answer, so `7 + 1 = 7. \\boxed{7}` scores 0), and 0.2 x `boxed_format` with
`numeric` (a number literal in the box, not `\\boxed{B}` or an empty box).
"""

import json

from grpo_recipes.rewards import arithmetic
from grpo_recipes.tasks import Task, task
from grpo_recipes.tools import registry as tools


@task("arithmetic")
class Arithmetic(Task):
    defaults = {
        "dataset_source": "reasoning_gym",
        "gym_task": "basic_arithmetic",
        "rewards": [{"name": "math_correctness", "weight": 1.0,
                     "params": {"answer_form": "literal", "check_working": True, "check_equations": True}},
                    {"name": "boxed_format", "weight": 0.2, "params": {"numeric": True}}],
        "correctness_reward": "math_correctness",
    }
    reads = ("gold_check_tool",)

    def __init__(self):
        self._check = None

    def prepare(self, row, recipe):
        row = {**row, "expression": self.expression(row)}
        row["worked_solution"] = self.worked_solution(row)
        if recipe.gold_check_tool:
            if self._check is None:
                self._check = tools.build_tools([recipe.gold_check_tool], tools.available(recipe.tool_dirs or ()))[0]
            if row["expression"] is None or self._check(row["expression"]).strip() != str(row["answer"]).strip():
                return None
        return row

    @staticmethod
    def expression(row: dict) -> str | None:
        """The row's `expression` column, or a reasoning-gym row's metadata expression."""
        if isinstance(row.get("expression"), str):
            return row["expression"]
        entry = row.get("gym_entry")
        meta = (json.loads(entry) if isinstance(entry, str) else entry or {}).get("metadata") or {}
        return meta.get("expression") if isinstance(meta.get("expression"), str) else None

    @staticmethod
    def worked_solution(row: dict) -> str | None:
        """A correct completion in the math recipe's answer format, for a row with an arithmetic expression whose
        value is the gold: the expression reduced one operation at a time, then the boxed value."""
        expression = Arithmetic.expression(row)
        if expression is None:
            return None
        try:
            steps = arithmetic.worked_steps(expression)
            if arithmetic.evaluate(steps[-1]) != arithmetic.evaluate(str(row["answer"])):
                return None  # reasoning-gym floors some divisions: a demonstration must score, so none where they differ
        except arithmetic.ArithmeticFault:
            return None
        return f"{' = '.join(steps)}. \\boxed{{{steps[-1]}}}"
