"""calculator: exact arithmetic on an expression, by walking its syntax tree (no eval, bounded cost)."""

from __future__ import annotations

from fractions import Fraction

from grpo_recipes.rewards.arithmetic import ArithmeticFault, evaluate
from grpo_recipes.tools import ToolError, tool


def _show(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.10g}"
    return text if Fraction(text) == value else f"{text} (rounded; exactly {value.numerator}/{value.denominator})"


@tool(timeout_s=5)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Args:
        expression: The arithmetic expression to evaluate, e.g. "(12 + 30) * 4 - 7 / 2".
    """
    try:
        return _show(evaluate(expression))
    except ArithmeticFault as exc:
        raise ToolError(str(exc)) from None
