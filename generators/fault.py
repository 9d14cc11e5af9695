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

`clean_too: true` also turns failed *clean* tasks into fault tasks (a type from `types`, or the
family's own fault types), for runs whose base distribution holds few faults.

`shorten: true` makes the new task the sub-problem at the fault's call (`family.decompose` of the
perturbed spec at that call; the spec itself when the family offers no decomposition), carrying
the fault at its only call: a group's outcome then turns on the remedy, not on the copy-sensitive
steps around it (measured: full-length fault tasks mined from failures were solved in 0.9 % of
training rollouts, docs/results.md).
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import Field

from generators.base import (
    BaseGenerator,
    GenerationContext,
    GeneratorConfig,
    claim,
    failed_tasks,
)
from sentinel.tasks import SpecError
from sentinel.types import Candidate, Task, canonical_json


class FaultGeneratorConfig(GeneratorConfig):
    type: str = Field("fault", description="the generator: fault")
    per_failure: int = Field(2, ge=1, description="tasks proposed per failed fault task")
    clean_too: bool = Field(False, description="also give failed clean tasks a fault (a type of "
                            "`types`, or the family's)")
    types: list[str] | None = Field(None, description="fault types for clean_too (null: the "
                                    "family's fault_types)")
    shorten: bool = Field(False, description="propose the sub-problem at the fault's call "
                          "(family.decompose), so the remedy decides the outcome")


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

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        order = [(task, failures, types) for task, failures in failed_tasks(ctx)
                 if (types := self._types(ctx, task))]
        proposed = {canonical_json([task.family, task.spec]) for task, _, _ in order}
        made = 0
        for i in range(self.config.per_failure):
            for task, failures, types in order:
                if made >= ctx.budget:
                    return
                family = ctx.families[task.family]
                fault_type = types[i % len(types)]
                try:
                    clean = family.perturb(family.without_faults(task.spec), ctx.rng)
                    if self.config.shorten:
                        calls = [f["call"] for f in family.faults_of(task.spec)] or [0]
                        clean = family.decompose(clean, calls[0]) or clean
                except SpecError:
                    continue
                spec = family.with_fault(clean, fault_type, ctx.rng)
                if spec is None or not claim(proposed, task.family, spec):
                    continue
                made += 1
                yield Candidate(family=task.family, spec=spec, parent_task_id=task.task_id,
                                failure_ids=[f.failure_id for f in failures])
