"""calculator: exact arithmetic on an expression, by walking its syntax tree (no eval, bounded cost)."""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

from grpo_recipes.tools import ToolError, tool

MAX_CHARS = 200
MAX_BITS = 400  # ~120 decimal digits for any intermediate value: bounds time and memory of every operation
MAX_EXPONENT = 64
_SYMBOLS = str.maketrans({"×": "*", "÷": "/", "−": "-", "^": "**"})  # how people (and models) write arithmetic
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _check_size(value: Fraction) -> Fraction:
    if max(abs(value.numerator).bit_length(), value.denominator.bit_length()) > MAX_BITS:
        raise ToolError("the result is too large (more than ~120 digits)")
    return value


def _power(base: Fraction, exp: Fraction) -> Fraction:
    if exp.denominator != 1 or abs(exp) > MAX_EXPONENT:
        raise ToolError(f"exponents must be whole numbers between -{MAX_EXPONENT} and {MAX_EXPONENT}")
    if base == 0 and exp < 0:
        raise ToolError("division by zero")
    bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length())
    if bits * abs(int(exp)) > MAX_BITS:
        raise ToolError("the result is too large (more than ~120 digits)")
    return base ** int(exp)


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check_size(Fraction(str(node.value)))  # via the literal's text: 0.1 stays exactly 1/10
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_power(left, right))
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise ToolError("division by zero")
        return _check_size(Fraction(_BINARY[type(node.op)](left, right)))
    raise ToolError(f"unsupported element '{ast.unparse(node)[:40]}': use numbers, + - * / // % ** and parentheses")


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
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("expression must be a non-empty string such as \"12 * (3 + 4)\"")
    if len(expression) > MAX_CHARS:
        raise ToolError(f"expression is longer than {MAX_CHARS} characters")
    text = expression.translate(_SYMBOLS).strip().removesuffix("=").strip()
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a NUL byte; the others: nesting
        raise ToolError(f"cannot parse {expression!r}; write e.g. \"12 * (3 + 4)\"") from None
    return _show(_value(tree.body))
