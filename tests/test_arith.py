"""The `arith` task family: sampling, validation, skills, solving, checking and spec edits."""

from __future__ import annotations

import random
import re

import pytest
from pydantic import ValidationError

from sentinel.env.calculator import calculate, parse
from sentinel.tasks import PluginError, SpecError, family_class, load_family
from sentinel.tasks.arith import ArithConfig, ArithFamily
from sentinel.types import Step


def _operands(expr: str) -> int:
    return len(re.findall(r"\d+", expr))


def _steps(skills: list[str]) -> int:
    (tag,) = [s for s in skills if s.startswith("steps:")]
    return int(tag.split(":")[1])


def test_sampled_specs_are_valid_and_solved_by_the_calculator(arith: ArithFamily) -> None:
    rng = random.Random(1234)
    cfg = arith.config
    seen = set()
    for _ in range(200):
        spec = arith.sample_spec(rng)
        assert arith.validate_spec(spec) == spec  # already canonical
        n = _operands(spec["expr"])
        assert cfg.min_operands <= n <= cfg.max_operands
        task = arith.make_task(spec)
        assert task.answer == calculate(spec["expr"])
        solution = arith.solve(spec, arith.tool_map())
        assert len(solution.calls) == _steps(task.skills) == n - 1
        assert all(c.tool == "calculator" for c in solution.calls)
        assert solution.answer == solution.calls[-1].observation == task.answer
        assert arith.verify(task, solution.answer)
        seen.add(spec["expr"])
    assert len(seen) > 100  # the distribution is not degenerate


def test_sampling_is_seeded(arith: ArithFamily) -> None:
    a = [arith.sample_spec(random.Random(7)) for _ in range(3)]
    b = [arith.sample_spec(random.Random(7)) for _ in range(3)]
    assert a == b
    rng = random.Random(7)
    assert len({arith.sample_spec(rng)["expr"] for _ in range(5)}) > 1


def test_wider_config_samples_more_operands() -> None:
    family = load_family("arith", {"min_operands": 4, "max_operands": 5, "ops": "+-"})
    rng = random.Random(0)
    for _ in range(30):
        expr = family.sample_spec(rng)["expr"]
        assert 4 <= _operands(expr) <= 5
        assert set(re.findall(r"[*/]", expr)) == set()


def test_make_task_fields(arith: ArithFamily) -> None:
    task = arith.make_task({"expr": "((3+4))*5"}, origin="generated", created_round=2)
    assert task.spec == {"expr": "(3+4)*5"}
    assert task.answer == "35"
    assert task.family == "arith"
    assert task.origin == "generated" and task.created_round == 2
    assert task.prompt[-1] == {"role": "user", "content": "Compute (3+4)*5"}
    assert task.prompt[0]["role"] == "system"
    assert task.difficulty == 2.5  # 2 steps + 0.5 for parens
    # the same canonical spec gives the same id
    assert arith.make_task({"expr": "(3 + 4) * 5"}).task_id == task.task_id


def test_verify(arith: ArithFamily) -> None:
    task = arith.make_task({"expr": "6*7"})
    assert arith.verify(task, "42")
    assert arith.verify(task, " 42 ")
    assert arith.verify(task, "42\n")
    assert not arith.verify(task, "41")
    assert not arith.verify(task, "abc")
    assert not arith.verify(task, "")
    assert not arith.verify(task, None)


@pytest.mark.parametrize(
    ("expr", "skills"),
    [
        ("(3+4)*5", ["op:add", "op:mul", "parens", "steps:2"]),
        ("3-5+10", ["neg", "op:add", "op:sub", "steps:2"]),
        ("50*3", ["big", "op:mul", "steps:1"]),
        ("12/4", ["op:div", "steps:1"]),
        ("2+3*4", ["op:add", "op:mul", "steps:2"]),
        ("20*20-500", ["big", "neg", "op:mul", "op:sub", "steps:2"]),
    ],
)
def test_skills(arith: ArithFamily, expr: str, skills: list[str]) -> None:
    assert arith.skills({"expr": expr}) == skills


def test_reference_solution_with_negative_intermediate(arith: ArithFamily) -> None:
    solution = arith.solve({"expr": "3-5+10"}, arith.tool_map())
    assert [c.arguments["expression"] for c in solution.calls] == ["3-5", "(-2)+10"]
    assert [c.observation for c in solution.calls] == ["-2", "8"]
    assert solution.answer == "8"
    assert solution.assistant_turns()[-1] == "<answer>8</answer>"
    assert len(solution.assistant_turns()) == 3


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"expr": "7/2"}, "not exact"),
        ({"expr": "-3+4"}, "non-negative"),
        ({"expr": "3--4"}, "non-negative"),
        ({"expr": "5"}, "between 2 and 8"),
        ({"expr": "+".join(["1"] * 9)}, "between 2 and 8"),
        ({"expr": "5/0"}, "division by zero"),
        ({"expr": "2+"}, "malformed expression"),
        ({"expr": "999*999"}, "exceeds max_intermediate"),
        ({"expr": "1+1", "answer": "2"}, "arith spec must be"),
        ({"expression": "1+1"}, "arith spec must be"),
        ({"expr": 5}, "arith spec must be"),
        (None, "arith spec must be"),
        ([], "arith spec must be"),
        ("1+1", "arith spec must be"),
    ],
)
def test_validate_spec_rejects(arith: ArithFamily, spec: object, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        arith.validate_spec(spec)
    assert fragment in str(info.value)


def test_validate_spec_canonicalises(arith: ArithFamily) -> None:
    assert arith.validate_spec({"expr": " ( (3 + 4) ) * 5 "}) == {"expr": "(3+4)*5"}
    assert arith.validate_spec({"expr": "8-(3-2)"}) == {"expr": "8-(3-2)"}


def test_perturb_keeps_skills_and_changes_values(arith: ArithFamily) -> None:
    rng = random.Random(3)
    specs = [arith.sample_spec(rng) for _ in range(30)]
    kept = 0
    for spec in specs:
        new = arith.perturb(spec, rng)
        assert new != spec
        assert arith.validate_spec(new) == new
        # the structure (operators, parentheses) is the same; only numbers change
        assert re.sub(r"\d+", "N", new["expr"]) == re.sub(r"\d+", "N", spec["expr"])
        kept += arith.skills(new) == arith.skills(spec)
    assert kept >= 25


def test_decompose_returns_the_sub_expression_of_each_step(arith: ArithFamily) -> None:
    spec = {"expr": "(3+4)*5-2"}
    solution = arith.solve(spec, arith.tool_map())
    assert [c.arguments["expression"] for c in solution.calls] == ["3+4", "7*5", "35-2"]
    assert arith.decompose(spec, 0) == {"expr": "3+4"}
    assert arith.decompose(spec, 1) == {"expr": "(3+4)*5"}
    assert arith.decompose(spec, 2) == spec
    assert arith.decompose(spec, 3) is None
    assert arith.decompose(spec, -1) is None
    assert arith.decompose({"expr": "3+4"}, 0) is None  # a single step has no sub-problem
    # the sub-problem's answer is the reference's intermediate at that step
    assert calculate(arith.decompose(spec, 1)["expr"]) == solution.calls[1].observation


def test_escalate_adds_one_operand(arith: ArithFamily) -> None:
    rng = random.Random(5)
    for spec in [{"expr": "3+4"}, {"expr": "(3+4)*5"}, {"expr": "12/4-1"}]:
        harder = arith.escalate(spec, rng)
        assert harder is not None
        assert _operands(harder["expr"]) == _operands(spec["expr"]) + 1
        assert arith.validate_spec(harder) == harder
    assert arith.escalate({"expr": "+".join(["1"] * 8)}, rng) is None


def _step(index: int, kind: str, **fields: object) -> Step:
    return Step(index=index, text="", kind=kind, **fields)  # type: ignore[arg-type]


def test_locate_error(arith: ArithFamily) -> None:
    task = arith.make_task({"expr": "(3+4)*5"})  # intermediates 7, 35
    good = [_step(0, "tool_call", observation="7"), _step(1, "tool_call", observation="35")]
    assert arith.locate_error(task, [*good, _step(2, "answer", answer="35")]) is None
    assert arith.locate_error(task, [*good, _step(2, "answer", answer="36")]) == 2
    assert arith.locate_error(task, [_step(0, "answer", answer="12")]) == 0
    wrong_value = [_step(0, "tool_call", observation="7"), _step(1, "tool_call", observation="36")]
    assert arith.locate_error(task, wrong_value) == 1
    failed = [_step(0, "tool_call", observation="Error: x", error="x", error_kind="timeout")]
    assert arith.locate_error(task, failed) == 0
    assert arith.locate_error(task, [_step(0, "malformed", error="bad", error_kind="parse")]) == 0
    assert arith.locate_error(task, [_step(0, "text")]) == 0
    assert arith.locate_error(task, good) == 1  # all progress but no answer: the last step
    assert arith.locate_error(task, []) is None


def test_config_validation() -> None:
    with pytest.raises(ValidationError, match=r"min_operands \(4\) must not exceed"):
        ArithConfig(min_operands=4, max_operands=3)
    with pytest.raises(ValidationError, match="ops may contain only"):
        ArithConfig(ops="+x")
    with pytest.raises(ValidationError):
        ArithConfig(max_operands=9)
    with pytest.raises(ValidationError):
        ArithConfig(unknown=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        load_family("arith", {"ops": "x"})


def test_family_lookup() -> None:
    assert family_class("arith") is ArithFamily
    assert family_class("sentinel.tasks.arith:ArithFamily") is ArithFamily
    with pytest.raises(PluginError, match="unknown task family 'nope'"):
        family_class("nope")
    with pytest.raises(PluginError, match="not a TaskFamily"):
        family_class("sentinel.tasks.arith:ArithConfig")


def test_parse_of_canonical_expr_is_stable(arith: ArithFamily) -> None:
    spec = arith.validate_spec({"expr": "(((2)))*(3+(4))"})
    assert spec == {"expr": "2*(3+4)"}
    assert parse(spec["expr"]) == parse("(((2)))*(3+(4))")
