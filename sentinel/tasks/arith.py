"""`arith`: multi-step integer arithmetic solved with the `calculator` tool.

A spec is `{"expr": "(12+7)*3-5"}`, canonicalised by parsing and re-printing. The reference
solution evaluates the expression tree bottom-up, left to right, with one calculator call per
operation, so `steps:k` is the number of operations. Only tasks whose divisions are exact and whose
intermediate values stay within `max_intermediate` are valid.

Skills: `op:add|sub|mul|div`, `steps:k`, `parens` (the printed form needs parentheses), `neg`
(a negative intermediate), `big` (an intermediate of 100 or more in absolute value).
"""

from __future__ import annotations

import random
import re
from fractions import Fraction
from typing import Any

from pydantic import Field, model_validator

from sentinel.env.calculator import BinOp, CalcError, Neg, Node, Num, evaluate, parse, render
from sentinel.env.tools import Calculator, Tool
from sentinel.tasks.base import (
    FamilyConfig,
    ReferenceCall,
    ReferenceSolution,
    SpecError,
    TaskFamily,
)
from sentinel.types import Step, Task

_NUMBER = re.compile(r"\d+")  # the unsigned integer literals of an expression

OP_SKILL = {"+": "op:add", "-": "op:sub", "*": "op:mul", "/": "op:div"}
MAX_TRIES = 200


class ArithConfig(FamilyConfig):
    min_operands: int = Field(2, ge=2, description="fewest numbers in a sampled expression")
    max_operands: int = Field(3, ge=2, le=8, description="most numbers in a sampled expression")
    max_value: int = Field(20, ge=2, description="operands are drawn from 1..max_value")
    ops: str = Field("+-*/", min_length=1, description="operators to sample from")
    max_intermediate: int = Field(1000, ge=10, description="bound on |intermediate values|")
    instruction: str = Field(
        "Use the calculator, one operation per call. End with <answer>N</answer>.",
        description="system message shown before each task",
    )

    @model_validator(mode="after")
    def _check(self) -> ArithConfig:
        if self.min_operands > self.max_operands:
            raise ValueError(
                f"min_operands ({self.min_operands}) must not exceed max_operands "
                f"({self.max_operands})"
            )
        if bad := set(self.ops) - set(OP_SKILL):
            raise ValueError(f"ops may contain only + - * /, got {''.join(sorted(bad))!r}")
        return self


def _operations(node: Node) -> list[BinOp]:
    """Binary operations in evaluation order (post-order, left first)."""
    if isinstance(node, Num):
        return []
    if isinstance(node, Neg):
        return _operations(node.operand)
    return [*_operations(node.left), *_operations(node.right), node]


def _leaves(node: Node) -> int:
    if isinstance(node, Num):
        return 1
    if isinstance(node, Neg):
        return _leaves(node.operand)
    return _leaves(node.left) + _leaves(node.right)


def _operand_text(value: int) -> str:
    return f"({value})" if value < 0 else str(value)


class ArithFamily(TaskFamily):
    name = "arith"
    config_model = ArithConfig
    config: ArithConfig

    def tools(self) -> list[Tool]:
        return [Calculator()]

    # -- validation ----------------------------------------------------------------------------
    def _values(self, node: Node) -> list[Fraction]:
        """Values of every operation in evaluation order; raises SpecError if any is invalid."""
        values = []
        for op in _operations(node):
            try:
                value = evaluate(op)
            except CalcError as exc:
                raise SpecError(str(exc)) from exc
            if value.denominator != 1:
                raise SpecError(f"division {render(op)} is not exact")
            if abs(value) > self.config.max_intermediate:
                raise SpecError(f"intermediate {render(op)} = {value} exceeds max_intermediate")
            values.append(value)
        return values

    def validate_spec(self, spec: Any) -> dict[str, Any]:
        if not isinstance(spec, dict) or set(spec) != {"expr"} or not isinstance(spec["expr"], str):
            raise SpecError('arith spec must be {"expr": "<expression>"}')
        try:
            tree = parse(spec["expr"])
        except CalcError as exc:
            raise SpecError(f"malformed expression: {exc}") from exc
        if _contains_neg(tree):
            raise SpecError("operands must be non-negative integers")
        if not 2 <= _leaves(tree) <= 8:
            raise SpecError("expression must have between 2 and 8 operands")
        self._values(tree)
        return {"expr": render(tree)}

    # -- sampling --------------------------------------------------------------------------
    def _random_tree(self, rng: random.Random, n: int) -> Node:
        if n == 1:
            return Num(rng.randint(1, self.config.max_value))
        k = rng.randint(1, n - 1)
        op = rng.choice(self.config.ops)
        left, right = self._random_tree(rng, k), self._random_tree(rng, n - k)
        if op == "/":
            left, right = self._exact_division(left, right, rng)
        return BinOp(op, left, right)

    def _exact_division(self, left: Node, right: Node, rng: random.Random) -> tuple[Node, Node]:
        """Choose leaf values so that left/right is exact and not trivial (x/x, x/1) when the
        operands allow it; other shapes are left to validation (which may reject them)."""
        top = self.config.max_value
        if isinstance(left, Num) and isinstance(right, Num) and top >= 4:
            divisor = rng.randint(2, top // 2)
            return Num(divisor * rng.randint(2 if divisor * 2 <= top else 1, top // divisor)), Num(
                divisor
            )
        if isinstance(right, Num):
            try:
                lv = evaluate(left)
            except CalcError:
                return left, right
            if lv.denominator == 1 and lv != 0:
                n = abs(lv.numerator)
                divisors = [d for d in range(2, min(top, n - 1) + 1) if n % d == 0]
                return left, Num(rng.choice(divisors) if divisors else 1)
        return left, right

    def _sample_valid(self, rng: random.Random, build) -> dict[str, Any]:
        for _ in range(MAX_TRIES):
            try:
                return self.validate_spec({"expr": render(build())})
            except SpecError:
                continue
        raise SpecError("could not sample a valid expression; loosen max_intermediate or ops")

    def sample_spec(self, rng: random.Random) -> dict[str, Any]:
        n = rng.randint(self.config.min_operands, self.config.max_operands)
        return self._sample_valid(rng, lambda: self._random_tree(rng, n))

    # -- rendering and tags ------------------------------------------------------------------
    def render(self, spec: dict[str, Any]) -> list[dict[str, str]]:
        messages = [{"role": "user", "content": f"Compute {spec['expr']}"}]
        if self.config.instruction:
            messages.insert(0, {"role": "system", "content": self.config.instruction})
        return messages

    def skills(self, spec: dict[str, Any]) -> list[str]:
        tree = parse(spec["expr"])
        ops = _operations(tree)
        values = [evaluate(op) for op in ops]
        tags = {OP_SKILL[op.op] for op in ops} | {f"steps:{len(ops)}"}
        if "(" in spec["expr"]:
            tags.add("parens")
        if any(v < 0 for v in values):
            tags.add("neg")
        if any(abs(v) >= 100 for v in values):
            tags.add("big")
        return sorted(tags)

    def difficulty(self, spec: dict[str, Any]) -> float:
        skills = self.skills(spec)
        steps = len(_operations(parse(spec["expr"])))
        return float(steps + 0.5 * ("parens" in skills) + 0.5 * ("big" in skills))

    # -- solving and checking ----------------------------------------------------------------
    def solve(self, spec: dict[str, Any], tools: dict[str, Tool]) -> ReferenceSolution:
        calculator = tools["calculator"]
        results: dict[int, int] = {}

        def value(node: Node) -> int:
            if isinstance(node, Num):
                return node.value
            return results[id(node)]

        solution = ReferenceSolution()
        for op in _operations(parse(spec["expr"])):
            expression = f"{_operand_text(value(op.left))}{op.op}{_operand_text(value(op.right))}"
            observation = calculator(expression=expression)
            try:
                results[id(op)] = int(observation)
            except ValueError as exc:
                raise SpecError(f"calculator gave non-integer {observation!r}") from exc
            solution.calls.append(
                ReferenceCall("calculator", {"expression": expression}, observation))
        if not solution.calls:
            raise SpecError("expression has no operation")
        solution.answer = solution.calls[-1].observation
        return solution

    def verify(self, task: Task, answer: str | None) -> bool:
        if answer is None:
            return False
        try:
            return int(answer.strip()) == int(task.answer)
        except ValueError:
            return False

    def locate_error(self, task: Task, steps: list[Step]) -> int | None:
        """First step that is not progress: a failed call, a call whose result is not one of the
        reference's intermediate values, a call using a number that is neither in the task nor a
        result obtained before it (a copy error, even when its result equals an intermediate
        value by chance: `18-(3+11)` → `3+11`, `1*14`), or a wrong final answer."""
        expected = {str(int(v)) for v in self._values(parse(task.spec["expr"]))}
        grounded = set(_NUMBER.findall(task.spec["expr"]))
        for step in steps:
            if step.kind == "answer":
                return None if self.verify(task, step.answer) else step.index
            if step.kind != "tool_call" or step.error is not None:
                return step.index
            result = (step.observation or "").strip()
            used = set(_NUMBER.findall(str((step.arguments or {}).get("expression", ""))))
            if result not in expected or not used <= grounded:
                return step.index
            grounded.add(result.lstrip("-"))
        return steps[-1].index if steps else None

    # -- edits ---------------------------------------------------------------------------------
    def perturb(self, spec: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        tree = parse(spec["expr"])
        skills = set(self.skills(spec))

        def relabel(node: Node) -> Node:
            if isinstance(node, Num):
                return Num(rng.randint(1, self.config.max_value))
            if isinstance(node, Neg):
                return Neg(relabel(node.operand))
            left = relabel(node.left)
            right = relabel(node.right)
            if node.op == "/":
                left, right = self._exact_division(left, right, rng)
            return BinOp(node.op, left, right)

        fallback = None
        for _ in range(MAX_TRIES):
            try:
                candidate = self.validate_spec({"expr": render(relabel(tree))})
            except SpecError:
                continue
            if candidate == spec:
                continue
            if set(self.skills(candidate)) == skills:
                return candidate
            fallback = fallback or candidate
        if fallback is None:
            raise SpecError(f"no valid perturbation of {spec['expr']!r}")
        return fallback

    def decompose(self, spec: dict[str, Any], step: int) -> dict[str, Any] | None:
        ops = _operations(parse(spec["expr"]))
        if not 0 <= step < len(ops) or len(ops) == 1:
            return None
        return self.validate_spec({"expr": render(ops[step])})

    def escalate(self, spec: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
        tree = parse(spec["expr"])
        if _leaves(tree) >= 8:
            return None

        def grow(node: Node, target: int, counter: list[int]) -> Node:
            if isinstance(node, Num):
                counter[0] += 1
                if counter[0] - 1 == target:
                    new = Num(rng.randint(1, self.config.max_value))
                    return BinOp(rng.choice(self.config.ops), node, new)
                return node
            if isinstance(node, Neg):
                return Neg(grow(node.operand, target, counter))
            left = grow(node.left, target, counter)
            return BinOp(node.op, left, grow(node.right, target, counter))

        n = _leaves(tree)
        for _ in range(MAX_TRIES):
            try:
                return self.validate_spec({"expr": render(grow(tree, rng.randrange(n), [0]))})
            except SpecError:
                continue
        return None


def _contains_neg(node: Node) -> bool:
    if isinstance(node, Num):
        return False
    if isinstance(node, Neg):
        return True
    return _contains_neg(node.left) or _contains_neg(node.right)
