"""A tiny arithmetic evaluator for demo.eval: an allow-list walk over Python's AST.

Model-written code never reaches eval/exec: only numbers, + - * / // % **, unary minus/plus and
parentheses evaluate; any other node (a name, a call, an attribute, a comparison...) is refused
with a message naming the construct. Sizes are bounded so a short expression cannot hang the pool.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

Number = int | float

MAX_SOURCE_CHARS = 10_000
MAX_INT_BITS = 4_096  # ~1,233 decimal digits: plenty for arithmetic, cheap to compute

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


class ArithError(ValueError):
    """The expression is not allowed arithmetic, or cannot be computed."""


def evaluate(source: str) -> Number:
    text = source.strip()
    if not text:
        raise ArithError("empty expression")
    if len(text) > MAX_SOURCE_CHARS:
        raise ArithError(f"expression longer than {MAX_SOURCE_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
        return _checked(_eval(tree.body))
    except SyntaxError as exc:
        raise ArithError(f"not an arithmetic expression: {exc.msg}") from None
    except (RecursionError, MemoryError):  # CPython's parser reports deep nesting as either
        raise ArithError("expression nested too deeply") from None
    except ZeroDivisionError:
        raise ArithError("division by zero") from None
    except OverflowError:
        raise ArithError("result too large") from None


def _eval(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ArithError(f"only numbers are allowed, not {type(value).__name__} literals")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    raise ArithError(f"not allowed in arithmetic: {_describe(node)}")


def _check_power(base: Number, exponent: Number) -> None:
    # Refuse before computing: 9**9**9 would otherwise hold the event loop for minutes.
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and abs(base) > 1
        and base.bit_length() * exponent > MAX_INT_BITS
    ):
        raise ArithError("result too large")


def _checked(value: Number) -> Number:
    if isinstance(value, complex):
        raise ArithError("result is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ArithError("result too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise ArithError("result is not finite")
    return value


def _describe(node: ast.AST) -> str:
    names = {
        ast.Name: "names",
        ast.Call: "function calls",
        ast.Attribute: "attribute access",
        ast.Subscript: "subscripts",
        ast.Compare: "comparisons",
        ast.BoolOp: "boolean operators",
        ast.Lambda: "lambdas",
    }
    for kind, label in names.items():
        if isinstance(node, kind):
            return label
    if isinstance(node, ast.BinOp | ast.UnaryOp):
        return f"the operator {type(node.op).__name__}"
    return type(node).__name__
