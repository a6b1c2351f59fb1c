"""Built-in calculator tool: arithmetic evaluated by walking the expression's `ast`, never `eval`.

Allowed: int and float literals, `+ - * / // % **`, unary `+ -`, parentheses; anything else
(names, calls, attributes, strings, comparisons...) raises ValueError("unsupported expression ...").
Integer results stay integers ("10//3" -> "3"); floats are printed with 10 significant digits and
no trailing ".0" ("7/2" -> "3.5", "0.1+0.2" -> "0.3", "4/2" -> "2"). Integers are limited to
MAX_INT_BITS bits, and a power is refused before it is computed when its result would be larger,
so "9**9**9" fails at once instead of hanging. Division by zero raises ZeroDivisionError.
"""

from __future__ import annotations

import ast
import operator

from horizonrl.tools.registry import tool

MAX_INT_BITS = 10_000    # about 3,000 decimal digits


def checked(value: int | float) -> int | float:
    """value, or ValueError when it is outside the calculator's range (complex, or a too large integer)."""
    if isinstance(value, complex):
        raise ValueError("the result is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ValueError(f"the result is too large (over {MAX_INT_BITS} bits)")
    return value


def power(base: int | float, exponent: int | float) -> int | float:
    """base ** exponent, refused before computing when an integer result would exceed MAX_INT_BITS
    ((bit_length(base) - 1) * exponent is a lower bound on its bit length)."""
    if isinstance(base, int) and isinstance(exponent, int) and (abs(base).bit_length() - 1) * exponent > MAX_INT_BITS:
        raise ValueError(f"the result is too large (over {MAX_INT_BITS} bits)")
    return base ** exponent


BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: power}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(node: ast.AST) -> int | float:
    """The value of an arithmetic expression tree; ValueError for any other kind of node."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        return checked(BINARY[type(node.op)](evaluate(node.left), evaluate(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](evaluate(node.operand))
    raise ValueError(f"unsupported expression {ast.unparse(node)!r}: only numbers, + - * / // % ** and "
                     "parentheses are allowed")


def format_number(value: int | float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.10g}"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / // % ** and parentheses.

    Args:
        expression: The expression to evaluate, e.g. "(2 + 3) * 4 / 7".
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"unsupported expression {expression!r}: {err.msg}") from None
    return format_number(evaluate(tree.body))
