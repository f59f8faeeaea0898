"""Exact arithmetic on a short expression, by walking its syntax tree: no eval, bounded cost.

Shared by the calculator tool (tools/calculator.py) and by math_correctness's check_working, which asks whether the
working's last equation is true (`1 - 4 = 5` is not).
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

MAX_CHARS = 200
MAX_BITS = 400  # ~120 decimal digits for any intermediate value: bounds time and memory of every operation
MAX_EXPONENT = 64
_SYMBOLS = str.maketrans({"×": "*", "÷": "/", "−": "-", "^": "**"})  # how people (and models) write arithmetic
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class ArithmeticFault(ValueError):
    """The expression cannot be evaluated; the message says why, in words a model can act on."""


def _check_size(value: Fraction) -> Fraction:
    if max(abs(value.numerator).bit_length(), value.denominator.bit_length()) > MAX_BITS:
        raise ArithmeticFault("the result is too large (more than ~120 digits)")
    return value


def _power(base: Fraction, exp: Fraction) -> Fraction:
    if exp.denominator != 1 or abs(exp) > MAX_EXPONENT:
        raise ArithmeticFault(f"exponents must be whole numbers between -{MAX_EXPONENT} and {MAX_EXPONENT}")
    if base == 0 and exp < 0:
        raise ArithmeticFault("division by zero")
    bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length())
    if bits * abs(int(exp)) > MAX_BITS:
        raise ArithmeticFault("the result is too large (more than ~120 digits)")
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
            raise ArithmeticFault("division by zero")
        return _check_size(Fraction(_BINARY[type(node.op)](left, right)))
    raise ArithmeticFault(f"unsupported element '{ast.unparse(node)[:40]}': use numbers, + - * / // % ** and "
                          "parentheses")


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression` (numbers, + - * / // % ** or ^, parentheses, × ÷ −), else ArithmeticFault."""
    if not isinstance(expression, str) or not expression.strip():
        raise ArithmeticFault("expression must be a non-empty string such as \"12 * (3 + 4)\"")
    if len(expression) > MAX_CHARS:
        raise ArithmeticFault(f"expression is longer than {MAX_CHARS} characters")
    text = expression.translate(_SYMBOLS).strip().removesuffix("=").strip()
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a NUL byte; the others: nesting
        raise ArithmeticFault(f"cannot parse {expression!r}; write e.g. \"12 * (3 + 4)\"") from None
    return _value(tree.body)
