"""Integer arithmetic without `eval`: a recursive-descent parser and an exact evaluator.

Grammar (the usual precedence, left-associative):
    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := "-" factor | "(" expr ")" | INT

Values are `fractions.Fraction`, so division is exact; the `arith` family only builds tasks whose
divisions are exact, and the calculator tool reports a non-integer result as a decimal.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
MAX_ABS_VALUE = 10**12


class CalcError(ValueError):
    """The expression is malformed or cannot be evaluated (division by zero, too large)."""


@dataclass(frozen=True)
class Num:
    value: int


@dataclass(frozen=True)
class Neg:
    operand: Node


@dataclass(frozen=True)
class BinOp:
    op: str
    left: Node
    right: Node


Node = Num | Neg | BinOp
PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
OP_NAMES = {"+": "addition", "-": "subtraction", "*": "multiplication", "/": "division"}
# How users write operations that the calculator refuses, with a hint naming the accepted form
# (the `notation` fault types of `sentinel.env.faults` render them).
USER_NOTATION = {"x": "*", "\u00d7": "*", ":": "/", "plus": "+", "minus": "-"}


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch.isdigit():
            j = i
            while j < len(text) and text[j].isdigit():
                j += 1
            tokens.append(text[i:j])
            i = j
        elif ch in "+-*/()":
            tokens.append(ch)
            i += 1
        elif word := next((w for w in USER_NOTATION if text.startswith(w, i)), None):
            # a user's notation the calculator does not accept: say what to write instead
            op = USER_NOTATION[word]
            shown = repr(word) if len(word) > 1 else f"character {word!r}"
            raise CalcError(f"unexpected {shown} at position {i}; write {OP_NAMES[op]} as {op}")
        else:
            raise CalcError(f"unexpected character {ch!r} at position {i}")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise CalcError("unexpected end of expression")
        self.pos += 1
        return tok

    def expr(self) -> Node:
        node = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            node = BinOp(op, node, self.term())
        return node

    def term(self) -> Node:
        node = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            node = BinOp(op, node, self.factor())
        return node

    def factor(self) -> Node:
        tok = self.take()
        if tok == "-":
            return Neg(self.factor())
        if tok == "(":
            node = self.expr()
            if self.take() != ")":
                raise CalcError("expected ')'")
            return node
        if tok.isdigit():
            return Num(int(tok))
        raise CalcError(f"unexpected token {tok!r}")


def parse(text: str) -> Node:
    """Parse an arithmetic expression; raises `CalcError` with the reason when it is malformed."""
    if not isinstance(text, str):
        raise CalcError("expression must be a string")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens = _tokenize(text)
    if not tokens:
        raise CalcError("empty expression")
    parser = _Parser(tokens)
    node = parser.expr()
    if parser.peek() is not None:
        raise CalcError(f"unexpected token {parser.peek()!r}")
    return node


def evaluate(node: Node) -> Fraction:
    if isinstance(node, Num):
        return Fraction(node.value)
    if isinstance(node, Neg):
        return -evaluate(node.operand)
    left, right = evaluate(node.left), evaluate(node.right)
    if node.op == "+":
        value = left + right
    elif node.op == "-":
        value = left - right
    elif node.op == "*":
        value = left * right
    else:
        if right == 0:
            raise CalcError("division by zero")
        value = left / right
    if abs(value) > MAX_ABS_VALUE:
        raise CalcError("result too large")
    return value


def format_value(value: Fraction) -> str:
    """Integers print as integers; other values with 10 significant digits."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.10g}"


def render(node: Node) -> str:
    """Print a tree with the fewest parentheses that keep its structure (right operands of the
    same precedence keep theirs, so the tree, and hence the reference steps, round-trip)."""
    if isinstance(node, Num):
        return str(node.value)
    if isinstance(node, Neg):
        inner = render(node.operand)
        return f"-{inner}" if isinstance(node.operand, Num) else f"-({inner})"
    prec = PRECEDENCE[node.op]
    left, right = render(node.left), render(node.right)
    if isinstance(node.left, BinOp) and PRECEDENCE[node.left.op] < prec:
        left = f"({left})"
    if isinstance(node.right, BinOp) and PRECEDENCE[node.right.op] <= prec:
        right = f"({right})"
    return f"{left}{node.op}{right}"


def calculate(text: str) -> str:
    """Evaluate `text` and format the result; raises `CalcError`."""
    return format_value(evaluate(parse(text)))
