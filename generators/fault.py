"""`fault`: more of the fault the policy did not recover from, at new operands and new calls.

A failure on a task that carries a scheduled fault (`sentinel.env.faults`; the task's family
reports it with `faults_of(spec)`) is a failure to recover from that fault type, whatever the
analyzer named its mode (`tool_error_unrecovered` after a timeout, `unknown_tool` after a rename,
`premature_answer` after a truncated result, ...). For each such failed task this generator
proposes `per_failure` new tasks with the same fault type: the family's `perturb` of the clean
spec (same structure and skills, new values), then `with_fault` of the same type at a random call
where it can happen, so the policy meets the fault it failed on at new positions instead of
memorising one instance. Failed tasks are visited most frequent failure cluster first and
round-robin, as `mutate` does; every candidate goes through the validation pipeline.

Only failures that did not get past their fault are mined (`recovered_too: false`, the default): a
rollout that met the fault (a tool's error, not a parse error, or a truncated result) and then
made a successful call (not `wait`) before its first erroneous step recovered, and failed later
(a copy error after the remedy, docs/results.md, "The third run"): that is for `restart`, not
more of the fault. A failure that went wrong before it met its fault is mined: for `notation`,
a fault of the task's text, the failure is misreading `3x11*20` (calling `3*20`), never an
error from the tool. A failure whose trajectory is not in the context counts as unrecovered.

`clean_too: true` also turns failed *clean* tasks into fault tasks (a type from `types`, or the
family's own fault types), for runs whose base distribution holds few faults.

`fresh: true` proposes a new draw of the family instead (`family.sample_spec`, its faults removed,
then `with_fault` of the failed type): the failure picks only the fault type, never the instance.
It separates what mining chooses (which faults) from what it trains on (variations of the failed
instances; docs/results.md, "The fifth run" and "The sixth run"). A fresh draw that cannot carry
the type (a `colon` needs a division, a `notation` a `*`) is drawn again, up to `FRESH_TRIES`
times, before the candidate is given up (docs/results.md, "The seventh run").

`shorten: true` makes the new task the sub-problem at the fault's call (`family.decompose` of the
perturbed spec at that call; the spec itself when the family offers no decomposition), carrying
the fault at its only call: a group's outcome then turns on the remedy, not on the copy-sensitive
steps around it (docs/results.md, "GRPO on fault tasks: no rise yet").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from pydantic import Field

from generators.base import (
    BaseGenerator,
    GenerationContext,
    GeneratorConfig,
    claim,
    failed_tasks,
)
from sentinel.tasks import SpecError
from sentinel.tasks.arith import TRUNCATED
from sentinel.types import Candidate, Failure, Task, Trajectory, canonical_json

FRESH_TRIES = 20  # fresh draws tried for one candidate before giving it up


class FaultGeneratorConfig(GeneratorConfig):
    type: str = Field("fault", description="the generator: fault")
    per_failure: int = Field(2, ge=1, description="tasks proposed per failed fault task")
    clean_too: bool = Field(False, description="also give failed clean tasks a fault (a type of "
                            "`types`, or the family's)")
    types: list[str] | None = Field(None, description="fault types for clean_too (null: the "
                                    "family's fault_types)")
    shorten: bool = Field(False, description="propose the sub-problem at the fault's call "
                          "(family.decompose), so the remedy decides the outcome")
    fresh: bool = Field(False, description="propose a new draw of the family (faults removed) "
                        "with the failed fault type, instead of a perturbation of the failed task")
    recovered_too: bool = Field(False, description="also mine failures whose rollout got past "
                                "its fault (a successful call after it, before the first error)")


def recovered(trajectory: Trajectory, failure: Failure) -> bool:
    """Whether the failed rollout got past its fault before failing (module docstring): it met
    the fault (a non-parse tool error or a truncated result) and a successful call (not `wait`)
    followed before the first erroneous step."""
    first = failure.first_error_step
    met = False
    for step in trajectory.steps:
        if first is not None and step.index >= first:
            return False
        fault = ((step.error is not None and step.error_kind != "parse")
                 or (step.observation or "").endswith(TRUNCATED))
        if met and not fault and step.kind == "tool_call" and step.tool != "wait":
            return True
        met = met or fault
    return False


class FaultGenerator(BaseGenerator):
    name = "fault"
    config_model = FaultGeneratorConfig
    config: FaultGeneratorConfig

    def _types(self, ctx: GenerationContext, task: Task) -> list[str]:
        family = ctx.families[task.family]
        faults = family.faults_of(task.spec)
        if faults:
            return sorted({f["type"] for f in faults})
        if not self.config.clean_too:
            return []
        return list(self.config.types or family.fault_types())

    def _keep(self, ctx: GenerationContext) -> Callable[[Failure], bool]:
        def keep(failure: Failure) -> bool:
            task, trajectory = ctx.tasks.get(failure.task_id), ctx.trajectories.get(failure.traj_id)
            if self.config.recovered_too or trajectory is None or task is None:
                return True
            if task.family in ctx.families and not ctx.families[task.family].faults_of(task.spec):
                return True  # a clean task: `clean_too` decides
            return not recovered(trajectory, failure)
        return keep

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        order = [(task, failures, types) for task, failures in failed_tasks(ctx, self._keep(ctx))
                 if (types := self._types(ctx, task))]
        proposed = {canonical_json([task.family, task.spec]) for task, _, _ in order}
        made = 0
        for i in range(self.config.per_failure):
            for task, failures, types in order:
                if made >= ctx.budget:
                    return
                family = ctx.families[task.family]
                fault_type = types[i % len(types)]
                # A fresh draw that cannot carry the type (a `colon` needs a division) is drawn
                # again, as the base distribution does, so types needing an operator keep their
                # share of the candidates; a perturbation keeps the failed task's operations.
                spec = None
                for _ in range(FRESH_TRIES if self.config.fresh else 1):
                    try:
                        if self.config.fresh:
                            clean = family.without_faults(family.sample_spec(ctx.rng))
                        else:
                            clean = family.perturb(family.without_faults(task.spec), ctx.rng)
                        if self.config.shorten:
                            calls = [f["call"] for f in family.faults_of(task.spec)] or [0]
                            clean = family.decompose(clean, calls[0]) or clean
                    except SpecError:
                        continue
                    if (spec := family.with_fault(clean, fault_type, ctx.rng)) is not None:
                        break
                if spec is None or not claim(proposed, task.family, spec):
                    continue
                made += 1
                yield Candidate(family=task.family, spec=spec, parent_task_id=task.task_id,
                                failure_ids=[f.failure_id for f in failures])
