"""`arith`: multi-step integer arithmetic solved with the `calculator` tool.

A spec is `{"expr": "(12+7)*3-5"}`, canonicalised by parsing and re-printing. The reference
solution evaluates the expression tree bottom-up, left to right, with one calculator call per
operation, so `steps:k` is the number of operations. Only tasks whose divisions are exact and whose
intermediate values stay within `max_intermediate` are valid.

Skills: `op:add|sub|mul|div`, `steps:k`, `parens` (the printed form needs parentheses), `neg`
(a negative intermediate), `big` (an intermediate of 100 or more in absolute value), and
`recover:<type>` for a task carrying a scheduled fault.

Fault schedules (`sentinel.env.faults`): a spec may carry `"faults": [{"type": T, "call": k}]`,
and then the k-th calculator call of every episode of the task meets fault T (`timeout`,
`rate_limit`, `renamed`, `truncated`), or, for a notation type (`notation`, `colon`, `plus`,
`minus`), the prompt writes operation k (in evaluation order; a `*`, `/`, `+` or `-`) as `x`, `:`,
`plus` or `minus`, which the calculator refuses. A spec without faults
has no `faults` key, so clean task ids are what they always were. The reference solution meets
the fault and applies its remedy, so SFT on it demonstrates recovery. `fault_share` and
`fault_types` put faults into the base distribution; `with_fault` / `without_faults` are the
edits the cold start, the `fault` generator and the benchmark arms use.
"""

from __future__ import annotations

import random
import re
from fractions import Fraction
from typing import Any

from pydantic import Field, model_validator

from sentinel.env.calculator import (
    OP_NAMES,
    PRECEDENCE,
    BinOp,
    CalcError,
    Neg,
    Node,
    Num,
    evaluate,
    parse,
    render,
)
from sentinel.env.faults import (
    FAULT_TYPES,
    NOTATIONS,
    RETRY_AFTER_S,
    TRUNCATED,
    Wait,
    apply_schedule,
    check_schedule,
    recover_skill,
)
from sentinel.env.tools import BadArguments, Calculator, NoSuchTool, Tool, ToolFailure
from sentinel.tasks.base import (
    MAX_INSTRUCTION_CHARS,
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
        max_length=MAX_INSTRUCTION_CHARS,
        description="system message shown before each task",
    )
    fault_share: float = Field(0.0, ge=0.0, le=1.0, description="share of sampled tasks that "
                               "carry one scheduled fault (a type of fault_types at a random call)")
    fault_types: list[str] = Field(default_factory=list, description="fault types the base "
                                   "distribution and the cold start's recovery demonstrations "
                                   "draw from (sentinel.env.faults); with rate_limit, every task "
                                   "lists the wait tool")
    fault_weights: dict[str, float] | None = Field(
        None, description="relative weights of fault_types in the base distribution's draw of "
        "a fault type (a type missing or weighted 0 is never drawn, but stays in fault_types: "
        "its tools are still listed and the cold start still demonstrates it); null: uniform")
    fault_echo: bool = Field(
        False, description="a scheduled tool fault's message quotes the arguments of the call it "
        "met (`calculator timed out after 10 s on {\"expression\": \"3*4\"}; try again`), as "
        "a server's error that quotes the request does")

    @model_validator(mode="after")
    def _check(self) -> ArithConfig:
        if self.min_operands > self.max_operands:
            raise ValueError(
                f"min_operands ({self.min_operands}) must not exceed max_operands "
                f"({self.max_operands})"
            )
        if bad := set(self.ops) - set(OP_SKILL):
            raise ValueError(f"ops may contain only + - * /, got {''.join(sorted(bad))!r}")
        if bad := [t for t in self.fault_types if t not in FAULT_TYPES]:
            raise ValueError(f"fault_types: unknown {bad}; known: {', '.join(FAULT_TYPES)}")
        if self.fault_share > 0 and not self.fault_types:
            raise ValueError("fault_share > 0 needs at least one of fault_types")
        if self.fault_weights is not None:
            if bad := sorted(set(self.fault_weights) - set(self.fault_types)):
                raise ValueError(f"fault_weights: {bad} not in fault_types {self.fault_types}")
            if any(w < 0 for w in self.fault_weights.values()) or not any(
                    w > 0 for w in self.fault_weights.values()):
                raise ValueError("fault_weights must be >= 0 with at least one > 0, got "
                                 f"{self.fault_weights}")
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


def render_marked(node: Node, marked: dict[int, str]) -> str:
    """`render`, with the operations whose `id` is in `marked` written as `marked[id]` (the
    user's notation of a notation fault: `x` for `*`, ...)."""
    if isinstance(node, Num):
        return str(node.value)
    if isinstance(node, Neg):
        inner = render_marked(node.operand, marked)
        return f"-{inner}" if isinstance(node.operand, Num) else f"-({inner})"
    prec = PRECEDENCE[node.op]
    left, right = render_marked(node.left, marked), render_marked(node.right, marked)
    if isinstance(node.left, BinOp) and PRECEDENCE[node.left.op] < prec:
        left = f"({left})"
    if isinstance(node.right, BinOp) and PRECEDENCE[node.right.op] <= prec:
        right = f"({right})"
    op = marked.get(id(node), node.op)
    return f"{left}{op}{right}"


class ArithFamily(TaskFamily):
    name = "arith"
    config_model = ArithConfig
    config: ArithConfig

    def tools(self) -> list[Tool]:
        tools: list[Tool] = [Calculator()]
        if "rate_limit" in self.config.fault_types:
            tools.append(Wait())
        return tools

    def tool_map(self, spec: dict[str, Any] | None = None) -> dict[str, Tool]:
        """The calculator (and `wait` when the config's fault types rate-limit), wrapped to meet
        the spec's fault schedule, with fresh per-episode state."""
        tools = super().tool_map()
        faults = (spec or {}).get("faults", [])
        if not faults and "wait" not in tools:
            return tools
        return apply_schedule({"calculator": tools["calculator"]}, "calculator", faults,
                              with_wait="wait" in tools, echo=self.config.fault_echo)

    # -- fault schedules -----------------------------------------------------------------------
    def fault_types(self) -> tuple[str, ...]:
        return FAULT_TYPES

    def faults_of(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        return [dict(f) for f in spec.get("faults", [])]

    def without_faults(self, spec: dict[str, Any]) -> dict[str, Any]:
        return {"expr": spec["expr"]}

    def with_fault(self, spec: dict[str, Any], fault_type: str,
                   rng: random.Random) -> dict[str, Any] | None:
        """`spec` (its faults removed) carrying one `fault_type` fault at a random call where it
        can happen (a notation fault needs its operator: `notation` a multiplication, `colon` a
        division, ...); None if there is none."""
        ops = _operations(parse(spec["expr"]))
        calls = [k for k, op in enumerate(ops)
                 if fault_type not in NOTATIONS or op.op == NOTATIONS[fault_type][0]]
        if fault_type not in FAULT_TYPES or not calls:
            return None
        return self.validate_spec({"expr": spec["expr"],
                                   "faults": [{"type": fault_type, "call": rng.choice(calls)}]})

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
        if (not isinstance(spec, dict) or not {"expr"} <= set(spec) <= {"expr", "faults"}
                or not isinstance(spec["expr"], str)):
            raise SpecError('arith spec must be {"expr": "<expression>"} with optional '
                            '"faults": [{"type": ..., "call": k}]')
        try:
            tree = parse(spec["expr"])
        except CalcError as exc:
            raise SpecError(f"malformed expression: {exc}") from exc
        if _contains_neg(tree):
            raise SpecError("operands must be non-negative integers")
        if not 2 <= _leaves(tree) <= 8:
            raise SpecError("expression must have between 2 and 8 operands")
        self._values(tree)
        out: dict[str, Any] = {"expr": render(tree)}
        if spec.get("faults"):
            ops = _operations(tree)
            try:
                faults = check_schedule(spec["faults"], len(ops))
            except ValueError as exc:
                raise SpecError(str(exc)) from exc
            for f in faults:
                if f["type"] in NOTATIONS and ops[f["call"]].op != NOTATIONS[f["type"]][0]:
                    kind, (op, _) = f["type"], NOTATIONS[f["type"]]
                    raise SpecError(f"a {kind} fault needs a {OP_NAMES[op]}; operation "
                                    f"{f['call']} is {render(ops[f['call']])}")
            out["faults"] = faults
        return out

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

    def _sample_clean(self, rng: random.Random) -> dict[str, Any]:
        n = rng.randint(self.config.min_operands, self.config.max_operands)
        return self._sample_valid(rng, lambda: self._random_tree(rng, n))

    def sample_spec(self, rng: random.Random) -> dict[str, Any]:
        spec = self._sample_clean(rng)
        if self.config.fault_share == 0 or rng.random() >= self.config.fault_share:
            return spec
        # A fault type drawn uniformly (or by `fault_weights`), then expressions until one can
        # carry it (a notation fault needs its operator), so every configured type keeps its share.
        weights = self.config.fault_weights
        fault_type = (rng.choice(self.config.fault_types) if weights is None else
                      rng.choices(self.config.fault_types,
                                  [weights.get(t, 0.0) for t in self.config.fault_types])[0])
        for _ in range(MAX_TRIES):
            if (faulty := self.with_fault(spec, fault_type, rng)) is not None:
                return faulty
            spec = self._sample_clean(rng)
        raise SpecError(f"could not sample a task that can carry a {fault_type} fault; add "
                        "ops or operands")

    # -- rendering and tags ------------------------------------------------------------------
    def render(self, spec: dict[str, Any]) -> list[dict[str, str]]:
        expr = spec["expr"]
        marked = {f["call"]: NOTATIONS[f["type"]][1] for f in spec.get("faults", [])
                  if f["type"] in NOTATIONS}
        if marked:
            tree = parse(expr)
            ops = _operations(tree)
            expr = render_marked(tree, {id(ops[k]): written for k, written in marked.items()})
        messages = [{"role": "user", "content": f"Compute {expr}"}]
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
        tags |= {recover_skill(f["type"]) for f in spec.get("faults", [])}
        return sorted(tags)

    def difficulty(self, spec: dict[str, Any]) -> float:
        skills = self.skills(spec)
        steps = len(_operations(parse(spec["expr"])))
        return float(steps + 0.5 * ("parens" in skills) + 0.5 * ("big" in skills)
                     + 0.5 * len(spec.get("faults", [])))

    # -- solving and checking ----------------------------------------------------------------
    def solve(self, spec: dict[str, Any], tools: dict[str, Tool]) -> ReferenceSolution:
        """One calculator call per operation, bottom-up, left to right; a scheduled fault is met
        and remedied as an agent would from what it sees: the same call again after a timeout or
        a truncated result, `wait` then again after a rate limit, the new name after a rename,
        `*` after the calculator refused the user's `x` (and so on for the other notations)."""
        notation = {f["call"]: NOTATIONS[f["type"]][1] for f in spec.get("faults", [])
                    if f["type"] in NOTATIONS}
        results: dict[int, int] = {}
        agent = {"tool": "calculator"}

        def value(node: Node) -> int:
            if isinstance(node, Num):
                return node.value
            return results[id(node)]

        solution = ReferenceSolution()
        for k, op in enumerate(_operations(parse(spec["expr"]))):
            left, right = _operand_text(value(op.left)), _operand_text(value(op.right))
            if k in notation:  # copy the user's `x`, be refused, re-issue with `*`
                self._refused(solution, tools, agent["tool"], f"{left}{notation[k]}{right}")
            observation = self._calculate(solution, tools, agent, f"{left}{op.op}{right}")
            try:
                results[id(op)] = int(observation)
            except ValueError as exc:
                raise SpecError(f"calculator gave non-integer {observation!r}") from exc
            solution.answer = observation
        if not results:
            raise SpecError("expression has no operation")
        return solution

    @staticmethod
    def _refused(solution: ReferenceSolution, tools: dict[str, Tool], name: str,
                 expression: str) -> None:
        try:
            tools[name](expression=expression)
        except BadArguments as exc:
            solution.calls.append(ReferenceCall(name, {"expression": expression}, f"Error: {exc}"))
            return
        raise SpecError(f"the calculator accepted {expression!r}")

    @staticmethod
    def _calculate(solution: ReferenceSolution, tools: dict[str, Tool], agent: dict[str, str],
                   expression: str) -> str:
        """Call the calculator until it answers in full, applying each fault's remedy."""
        arguments = {"expression": expression}
        last: Exception = SpecError(f"the calculator kept failing on {expression!r}")
        for _ in range(4):
            name = agent["tool"]
            try:
                observation = tools[name](**arguments)
            except NoSuchTool as exc:  # renamed: the error lists the name to use
                solution.calls.append(ReferenceCall(name, dict(arguments), f"Error: {exc}"))
                agent["tool"] = str(exc).rsplit("available: ", 1)[-1].split(",")[0].strip()
                last = exc
                continue
            except ToolFailure as exc:
                last = exc
                solution.calls.append(ReferenceCall(name, dict(arguments), f"Error: {exc}"))
                if "rate limit" in str(exc):
                    wait = {"seconds": RETRY_AFTER_S}
                    solution.calls.append(ReferenceCall("wait", wait, tools["wait"](**wait)))
                continue
            except BadArguments as exc:
                raise SpecError(f"calculator refused {expression!r}: {exc}") from exc
            solution.calls.append(ReferenceCall(name, dict(arguments), observation))
            if not observation.endswith(TRUNCATED):
                return observation
        raise last  # a tool down for good, not a scheduled fault: the task is unsolvable

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
        value by chance: `18-(3+11)` → `3+11`, `1*14`), or a wrong final answer. A `wait` call and a
        call whose result came back truncated are neither progress nor an error."""
        expected = {str(int(v)) for v in self._values(parse(task.spec["expr"]))}
        grounded = set(_NUMBER.findall(task.spec["expr"]))
        for step in steps:
            if step.kind == "answer":
                return None if self.verify(task, step.answer) else step.index
            if step.kind != "tool_call" or step.error is not None:
                return step.index
            result = (step.observation or "").strip()
            if step.tool == "wait" or result.endswith(TRUNCATED):
                continue  # a fault's remedy, or the cut result that calls for one: no progress

            used = set(_NUMBER.findall(str((step.arguments or {}).get("expression", ""))))
            if result not in expected or not used <= grounded:
                return step.index
            grounded.add(result.lstrip("-"))
        return steps[-1].index if steps else None

    # -- edits ---------------------------------------------------------------------------------
    def perturb(self, spec: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        """New operands in the same tree (same operations, so a fault schedule, which names
        operations by position, carries over unchanged)."""
        tree = parse(spec["expr"])
        faults = {"faults": spec["faults"]} if spec.get("faults") else {}
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
                candidate = self.validate_spec({"expr": render(relabel(tree)), **faults})
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
                harder = self.validate_spec({"expr": render(grow(tree, rng.randrange(n), [0]))})
            except SpecError:
                continue
            # The operations moved: the same fault types, at new positions.
            for fault in spec.get("faults", []):
                harder = self.with_fault(harder, fault["type"], rng) or harder
            return harder
        return None


def _contains_neg(node: Node) -> bool:
    if isinstance(node, Num):
        return False
    if isinstance(node, Neg):
        return True
    return _contains_neg(node.left) or _contains_neg(node.right)
