"""Exact arithmetic on a short expression, by walking its syntax tree: no eval, bounded cost.

Shared by the calculator tool (tools/calculator.py), by math_correctness's check_working, which asks whether the
working's last equation is true (`1 - 4 = 5` is not), and by the math recipe's worked solutions (`worked_steps`).
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

MAX_CHARS = 200  # what the calculator tool accepts
WORKING_CHARS = 1000  # a side of an equation in a completion's working: read further, or length would hide it
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
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, Fraction):  # Fraction: worked_steps
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


def _parse(expression: str, max_chars: int = MAX_CHARS) -> ast.AST:
    if not isinstance(expression, str) or not expression.strip():
        raise ArithmeticFault("expression must be a non-empty string such as \"12 * (3 + 4)\"")
    if len(expression) > max_chars:
        raise ArithmeticFault(f"expression is longer than {max_chars} characters")
    text = expression.translate(_SYMBOLS).strip().removesuffix("=").strip()
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a NUL byte; the others: nesting
        raise ArithmeticFault(f"cannot parse {expression!r}; write e.g. \"12 * (3 + 4)\"") from None
    return tree.body


def evaluate(expression: str, max_chars: int = MAX_CHARS) -> Fraction:
    """The exact value of `expression` (numbers, + - * / // % ** or ^, parentheses, × ÷ −), else ArithmeticFault."""
    return _value(_parse(expression, max_chars))


def parts(expression: str, max_chars: int = MAX_CHARS) -> tuple[list[Fraction], Fraction]:
    """(the values of every number and operation inside `expression`, its own value): `(3 + 4) * 2` -> ([3, 4, 7, 2],
    14). What working about the expression may compute with."""
    inner: list[Fraction] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            for child in (node.left, node.right):
                inner.append(walk(child))
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            inner.append(walk(node.operand))
        return _value(node)

    value = walk(_parse(expression, max_chars))
    return inner, value


_SIGNS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}


def _numbers(node: ast.AST) -> ast.AST:
    """The tree with every literal, and a sign on a literal (`-3`), as one exact Fraction constant."""
    if isinstance(node, (ast.Constant, ast.UnaryOp)) and _is_number(node):
        return ast.Constant(_value(node))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return ast.UnaryOp(node.op, _numbers(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return ast.BinOp(_numbers(node.left), node.op, _numbers(node.right))
    _value(node)  # raises the evaluator's own message for what it does not support
    raise ArithmeticFault(f"unsupported element '{ast.unparse(node)[:40]}'")


def _is_number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) or (isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY
                                              and isinstance(node.operand, ast.Constant))


def _text(node: ast.AST, place: str = "top") -> str:
    # How a worked solution writes it: a negative number in parentheses after an operator or a sign (`5 - (-8)`,
    # `-(-6)`) but not first (`-3 - 4`); an operation inside another in parentheses (`-(3 + 4)`, `2 * (1 + 2)`).
    if isinstance(node, ast.Constant):
        value = node.value
        text = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
        return f"({text})" if place != "top" and ((value < 0 and place != "left") or "/" in text) else text
    if isinstance(node, ast.UnaryOp):
        sign = "-" if isinstance(node.op, ast.USub) else "+"
        inner = node.operand
        # A sign on a computed value keeps its parentheses, `-(3)`, so that the step shows the value it negates.
        text = sign + (f"({_text(inner)})" if not isinstance(inner, ast.Constant) or inner.value >= 0
                       else _text(inner, "sign"))
        return f"({text})" if place in ("right", "sign") else text
    text = f"{_text(node.left, 'left')} {_SIGNS[type(node.op)]} {_text(node.right, 'right')}"
    return text if place == "top" else f"({text})"


def _reduce(node: ast.AST) -> ast.AST:
    """The tree with its first innermost operation (left to right) replaced by its value."""
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.operand, ast.Constant):
            return ast.Constant(_value(node))
        return ast.UnaryOp(node.op, _reduce(node.operand))
    if isinstance(node.left, ast.Constant) and isinstance(node.right, ast.Constant):
        return ast.Constant(_value(node))
    if not isinstance(node.left, ast.Constant):
        return ast.BinOp(_reduce(node.left), node.op, node.right)
    return ast.BinOp(node.left, node.op, _reduce(node.right))


def worked_steps(expression: str) -> list[str]:
    """`expression` reduced one operation at a time, innermost first, down to its exact value:
    `-( -1 - -7 )` -> ['-(-1 - (-7))', '-6']. Each step is plain arithmetic equal to the value."""
    tree = _numbers(_parse(expression))
    steps = [_text(tree)]
    while not isinstance(tree, ast.Constant):
        tree = _reduce(tree)
        if (text := _text(tree)) != steps[-1]:
            steps.append(text)
    return steps
