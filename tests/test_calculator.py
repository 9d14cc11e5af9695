"""The eval-free calculator: grammar, exact values, formatting, errors, and printing."""

from __future__ import annotations

import inspect
from fractions import Fraction

import pytest

from sentinel.env import calculator
from sentinel.env.calculator import (
    MAX_EXPRESSION_CHARS,
    BinOp,
    CalcError,
    Neg,
    Num,
    calculate,
    evaluate,
    format_value,
    parse,
    render,
)
from sentinel.env.tools import BadArguments, Calculator


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("2+3*4", "14"),
        ("2*3+4", "10"),
        ("8-3-2", "3"),  # left-associative, not 8-(3-2)=7
        ("64/4/2", "8"),  # left-associative, not 64/(4/2)=32
        ("2*(3+4)", "14"),
        ("(2+3)*(4-1)", "15"),
        ("3--4", "7"),
        ("-(2+3)*2", "-10"),
        ("-2*-3", "6"),
        ("  12 *  3 ", "36"),
        ("100-250", "-150"),
        ("0", "0"),
        ("((7))", "7"),
    ],
)
def test_calculate_values(expr: str, expected: str) -> None:
    assert calculate(expr) == expected


def test_parse_builds_left_associative_tree() -> None:
    assert parse("8-3-2") == BinOp("-", BinOp("-", Num(8), Num(3)), Num(2))
    assert parse("2+3*4") == BinOp("+", Num(2), BinOp("*", Num(3), Num(4)))
    assert parse("3--4") == BinOp("-", Num(3), Neg(Num(4)))
    assert parse("-(2+3)*2") == BinOp("*", Neg(BinOp("+", Num(2), Num(3))), Num(2))


def test_division_is_exact() -> None:
    assert evaluate(parse("7/2")) == Fraction(7, 2)
    assert evaluate(parse("1/3*3")) == 1
    assert calculate("1/3*3") == "1"
    assert calculate("7/2") == "3.5"
    assert calculate("-7/4") == "-1.75"
    assert calculate("2/3") == "0.6666666667"
    assert calculate("12/4") == "3"


def test_format_value() -> None:
    assert format_value(Fraction(42)) == "42"
    assert format_value(Fraction(-5)) == "-5"
    assert format_value(Fraction(1, 8)) == "0.125"


def test_format_value_tiny_fraction_has_no_trailing_dot() -> None:
    assert not calculate("1/10000000").endswith(".")
    assert not calculate("1999999999/2000000000").endswith(".")


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("1/0", "division by zero"),
        ("5/(3-3)", "division by zero"),
        ("2+", "unexpected end"),
        ("2**3", "unexpected token '*'"),
        ("2+x", "unexpected character 'x'"),
        ("__import__('os')", "unexpected character '_'"),
        ("(2+3", "unexpected end"),
        ("2+3)", "unexpected token ')'"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("2 3", "unexpected token '3'"),
        ("1.5+1", "unexpected character '.'"),
        ("1" + "+1" * 100, f"longer than {MAX_EXPRESSION_CHARS}"),
        ("1000000*1000000*10", "too large"),
    ],
)
def test_errors_raise_calc_error_with_message(expr: str, fragment: str) -> None:
    with pytest.raises(CalcError) as info:
        calculate(expr)
    assert fragment in str(info.value)


def test_non_string_is_rejected() -> None:
    with pytest.raises(CalcError, match="must be a string"):
        parse(12)  # type: ignore[arg-type]


def test_max_length_boundary() -> None:
    at_limit = "1" + "+1" * ((MAX_EXPRESSION_CHARS - 1) // 2)
    assert len(at_limit) <= MAX_EXPRESSION_CHARS
    assert calculate(at_limit) == str((MAX_EXPRESSION_CHARS - 1) // 2 + 1)


def test_module_never_uses_eval() -> None:
    source = inspect.getsource(calculator)
    assert "eval(" not in source
    assert "exec(" not in source


@pytest.mark.parametrize(
    "expr",
    ["8-(3-2)", "(2+3)*4", "2*(3*4)", "64/(4/2)", "8-3-2", "-(2+3)*2", "3--4", "2+3*4-5/5",
     "((1+2)*(3-4))/(5+6)", "--4", "-(-4)"],
)
def test_render_round_trips_structure(expr: str) -> None:
    tree = parse(expr)
    assert parse(render(tree)) == tree


def test_render_uses_fewest_parentheses() -> None:
    assert render(parse("((2*3))+(4)")) == "2*3+4"
    assert render(parse("(8-3)-2")) == "8-3-2"
    assert render(parse("8-(3-2)")) == "8-(3-2)"
    assert render(parse("(2+3)*4")) == "(2+3)*4"
    assert render(parse("-(2+3)")) == "-(2+3)"


def test_calculator_tool_maps_errors_to_bad_arguments() -> None:
    tool = Calculator()
    assert tool(expression="6*7") == "42"
    with pytest.raises(BadArguments, match="division by zero"):
        tool(expression="1/0")
    with pytest.raises(BadArguments, match="missing argument"):
        tool()
    with pytest.raises(BadArguments, match="unknown argument"):
        tool(expression="1+1", extra=1)
    with pytest.raises(BadArguments, match="must be string"):
        tool(expression=12)
