"""The `fault` generator: from failures on fault tasks, new tasks with the same fault type at new
operands and positions, through the real validation pipeline. Real arith tasks, no mocks."""

from __future__ import annotations

import random

from generators import GenerationContext, load_generator, validate_candidates
from sentinel.env.faults import FAULT_TYPES
from sentinel.tasks.arith import ArithConfig, ArithFamily
from sentinel.types import Failure, Step, Task, Trajectory

FAMILY = ArithFamily(ArithConfig(instruction="", fault_types=list(FAULT_TYPES)))
FAMILIES = {"arith": FAMILY}


def failure_on(task: Task, mode: str = "tool_error_unrecovered") -> Failure:
    return Failure(traj_id=f"t-{task.task_id}", task_id=task.task_id, round=1, mode=mode,
                   first_error_step=1, evidence="", skills=task.skills, family="arith")


def context(tasks: list[Task], budget: int = 32, seed: int = 0) -> GenerationContext:
    return GenerationContext(round=1, failures=[failure_on(t) for t in tasks],
                             tasks={t.task_id: t for t in tasks}, families=FAMILIES,
                             rng=random.Random(seed), budget=budget)


def test_same_fault_type_new_operands_and_positions() -> None:
    parent = FAMILY.make_task({"expr": "(3+4)*5-6*2", "faults": [{"type": "timeout", "call": 1}]})
    gen = load_generator({"type": "fault", "per_failure": 8})
    candidates = list(gen.generate(context([parent])))
    assert candidates, "no candidates from a failed fault task"
    assert all(c.spec["faults"][0]["type"] == "timeout" for c in candidates)
    assert all(c.parent_task_id == parent.task_id for c in candidates)
    assert all(c.spec["expr"] != parent.spec["expr"] for c in candidates)
    # New positions too: over 8 variants of a 4-call task the call is not always the parent's.
    assert {c.spec["faults"][0]["call"] for c in candidates} != {1}
    accepted, rejected = validate_candidates(candidates, generator="fault", families=FAMILIES,
                                             known_task_ids=lambda ids: set(), round=1)
    assert accepted and all("recover:timeout" in t.skills for t in accepted)
    assert len(accepted) + len(rejected) == len(candidates)


def test_clean_failures_are_ignored_unless_clean_too() -> None:
    clean = FAMILY.make_task({"expr": "3*4+5"})
    assert list(load_generator({"type": "fault"}).generate(context([clean]))) == []
    made = list(load_generator({"type": "fault", "clean_too": True, "types": ["renamed"]})
                .generate(context([clean])))
    assert made and all(c.spec["faults"][0]["type"] == "renamed" for c in made)


def test_budget_and_notation_feasibility() -> None:
    parents = [FAMILY.make_task(FAMILY.with_fault(FAMILY.sample_spec(random.Random(i)),
                                                  "notation", random.Random(i)) or
                                {"expr": "2*3+1", "faults": [{"type": "notation", "call": 0}]})
               for i in range(6)]
    made = list(load_generator({"type": "fault", "per_failure": 3}).generate(
        context(parents, budget=5)))
    assert len(made) <= 5
    # perturb keeps the operations, so a notation parent's variants still have a `*` to mark.
    assert all(c.spec["faults"][0]["type"] == "notation" for c in made)


def test_shorten_gives_the_sub_problem_at_the_fault() -> None:
    parent = FAMILY.make_task({"expr": "(3+4)*5-6*2", "faults": [{"type": "timeout", "call": 2}]})
    made = list(load_generator({"type": "fault", "per_failure": 4, "shorten": True})
                .generate(context([parent])))
    assert made
    for c in made:
        task = FAMILY.make_task(c.spec)
        # One operation (the parent's third, a multiplication), the fault at its only call.
        assert "steps:1" in task.skills and "op:mul" in task.skills
        assert c.spec["faults"] == [{"type": "timeout", "call": 0}]


def test_fresh_draws_new_tasks_of_the_failed_fault_type() -> None:
    """`fresh`: the failure picks only the fault type; the task is a new draw of the family, not a
    perturbation (which keeps the parent's operations and length)."""
    parent = FAMILY.make_task({"expr": "(3+4)*5-6*2", "faults": [{"type": "rate_limit",
                                                                  "call": 1}]})
    perturbed = list(load_generator({"type": "fault", "per_failure": 12})
                     .generate(context([parent])))
    fresh = list(load_generator({"type": "fault", "per_failure": 12, "fresh": True})
                 .generate(context([parent])))
    assert fresh and all(c.spec["faults"][0]["type"] == "rate_limit" for c in fresh)
    assert all(c.parent_task_id == parent.task_id for c in fresh)

    def shape(task: Task) -> tuple[str, ...]:
        return tuple(sorted(s for s in task.skills if s.startswith(("steps:", "op:"))))

    def shapes(made: list) -> set[tuple[str, ...]]:
        return {shape(FAMILY.make_task(c.spec)) for c in made}
    # A perturbation keeps the parent's shape (4 operations: add, mul, sub); fresh draws vary.
    assert shapes(perturbed) == {shape(parent)}
    assert len(shapes(fresh)) > 1
    accepted, _ = validate_candidates(fresh, generator="fault", families=FAMILIES,
                                      known_task_ids=lambda ids: set(), round=1)
    assert accepted and all("recover:rate_limit" in t.skills for t in accepted)


def test_fresh_draws_again_until_the_task_can_carry_the_type() -> None:
    """A fresh draw without a division cannot carry a `colon` fault: it is drawn again, so every
    failure still gets its `per_failure` candidates (about half were lost to such draws)."""
    parent = FAMILY.make_task({"expr": "12/4+5", "faults": [{"type": "colon", "call": 0}]})
    fresh = list(load_generator({"type": "fault", "per_failure": 10, "fresh": True})
                 .generate(context([parent])))
    assert len(fresh) == 10
    assert all(c.spec["faults"][0]["type"] == "colon" for c in fresh)


def _step(i: int, expression: str, observation: str, tool: str = "calculator",
          error_kind: str | None = None) -> Step:
    return Step(i, f"call {i}", "tool_call", tool=tool, arguments={"expression": expression},
                observation=observation, error=observation if error_kind else None,
                error_kind=error_kind)


def test_only_failures_that_did_not_get_past_the_fault_are_mined() -> None:
    """A rollout that met its fault and then made a successful call before its first error
    recovered (its failure is a later copy error: `restart`'s); one stuck at the fault is mined;
    `recovered_too` mines both."""
    task = FAMILY.make_task({"expr": "10-19*3", "faults": [{"type": "renamed", "call": 0}]})
    renamed = _step(0, "19*3", "Error: unknown tool 'calculator'", error_kind="unknown_tool")
    got_past = [renamed, _step(1, "19*3", "57", tool="calc"), _step(2, "10-77", "-67", "calc"),
                Step(3, "<answer>-67</answer>", "answer", answer="-67")]
    stuck = [renamed, _step(1, "19*3", "Error: unknown tool 'calculator'",
                            error_kind="unknown_tool"),
             Step(2, "<answer>57</answer>", "answer", answer="57")]

    def ctx(steps: list[Step], first: int) -> GenerationContext:
        traj = Trajectory(task_id=task.task_id, messages=[], token_ids=[], loss_mask=[],
                          logprobs=[], steps=steps, finish_reason="answer", traj_id="t-1")
        failure = Failure(traj_id="t-1", task_id=task.task_id, round=1, mode="premature_answer",
                          first_error_step=first, evidence="", skills=task.skills, family="arith")
        return GenerationContext(round=1, failures=[failure], tasks={task.task_id: task},
                                 families=FAMILIES, rng=random.Random(0), budget=8,
                                 trajectories={"t-1": traj})

    gen = load_generator({"type": "fault"})
    assert list(gen.generate(ctx(got_past, first=2))) == []
    assert list(gen.generate(ctx(stuck, first=0)))
    assert list(load_generator({"type": "fault", "recovered_too": True}).generate(
        ctx(got_past, first=2)))
    # The first error at the successful call itself: nothing succeeded before it, not recovered.
    assert list(gen.generate(ctx(got_past, first=1)))
    # Wrong before the fault came (a notation task misread: `3x11*20` called as `3*20`): mined.
    notation = FAMILY.make_task({"expr": "3*11*20", "faults": [{"type": "notation", "call": 0}]})
    misread = [_step(0, "3*20", "60"), _step(1, "60*20", "1200"),
               Step(2, "<answer>1200</answer>", "answer", answer="1200")]
    failure = Failure(traj_id="t-2", task_id=notation.task_id, round=1, mode="premature_answer",
                      first_error_step=0, evidence="", skills=notation.skills, family="arith")
    traj = Trajectory(task_id=notation.task_id, messages=[], token_ids=[], loss_mask=[],
                      logprobs=[], steps=misread, finish_reason="answer", traj_id="t-2")
    made = list(gen.generate(GenerationContext(
        round=1, failures=[failure], tasks={notation.task_id: notation}, families=FAMILIES,
        rng=random.Random(0), budget=8, trajectories={"t-2": traj})))
    assert made and all(c.spec["faults"][0]["type"] == "notation" for c in made)
