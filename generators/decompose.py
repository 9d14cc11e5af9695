"""`decompose`: stepping stones, the sub-problems at and before the step where the policy failed.

For each failed task, the failure's `first_error_step` (an index into the trajectory's steps) is
mapped to a step of the family's reference solution: `min(first_error_step, n - 1)` for a
reference of `n` calls. That is exact when the policy makes one call per turn with no detours (the
usual case), and an approximation otherwise: a recovered slip before the error shifts it by one;
the generator sees failures, not trajectories, so it cannot do better. The family's
`decompose(spec, step)` then gives the sub-problem a solver faces at that step, and, with
`lead_up` (default), the sub-problems of the steps before it, nearest first, so the policy can
climb back up to where it fell.

Order: failed tasks as `mutate` visits them (most frequent failure cluster first), round-robin
(one stepping stone of every task before a second of any). A sub-problem equal to its parent (for
`arith`, the last step's sub-problem is the whole expression) or proposed before is skipped;
`decompose` returning None means the family offers none at that step. Failures without a
`first_error_step` (an empty episode) and tasks whose reference cannot be computed (`SpecError`)
are skipped; anything else the family raises is a bug and propagates (recorded by the runner).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from pydantic import Field, field_validator

from generators.base import (
    BaseGenerator,
    GenerationContext,
    GeneratorConfig,
    claim,
    failed_tasks,
    round_robin,
)
from sentinel.tasks import SpecError
from sentinel.types import FAILURE_MODES, Candidate, canonical_json


class DecomposeConfig(GeneratorConfig):
    type: str = Field("decompose", description="the generator: decompose")
    modes: list[str] | None = Field(
        None, description="failure modes to decompose (default: all with a first error step)"
    )
    lead_up: bool = Field(True, description="also propose the sub-problems before the failing one")
    per_failure: int = Field(3, ge=1, description="most stepping stones per failed task")

    @field_validator("modes")
    @classmethod
    def _known_modes(cls, modes: list[str] | None) -> list[str] | None:
        unknown = sorted(set(modes or ()) - set(FAILURE_MODES))
        if unknown:
            raise ValueError(f"unknown failure modes {unknown}; known: {', '.join(FAILURE_MODES)}")
        return modes


class DecomposeGenerator(BaseGenerator):
    name = "decompose"
    config_model = DecomposeConfig
    config: DecomposeConfig

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        modes = self.config.modes
        order = failed_tasks(
            ctx,
            lambda f: f.first_error_step is not None and (modes is None or f.mode in modes),
        )
        proposed = {canonical_json([task.family, task.spec]) for task, _ in order}
        queues: list[list[Candidate]] = []
        for task, failures in order:
            family = ctx.families[task.family]
            try:
                n_steps = len(family.solve(task.spec, family.tool_map(task.spec)).calls)
            except SpecError:
                continue
            if n_steps == 0:
                continue
            # Most common failing reference step first.
            failing = Counter(min(int(f.first_error_step), n_steps - 1) for f in failures)
            steps: list[int] = []
            for step, _ in sorted(failing.items(), key=lambda kv: (-kv[1], kv[0])):
                for s in range(step, -1, -1) if self.config.lead_up else [step]:
                    if s not in steps:
                        steps.append(s)
            queue: list[Candidate] = []
            for step in steps:
                if len(queue) >= self.config.per_failure:
                    break
                spec = family.decompose(task.spec, step)
                if spec is None:
                    continue
                if not claim(proposed, task.family, spec):
                    continue
                queue.append(
                    Candidate(
                        family=task.family,
                        spec=spec,
                        parent_task_id=task.task_id,
                        failure_ids=[f.failure_id for f in failures],
                    )
                )
            queues.append(queue)
        yield from round_robin(queues, ctx.budget)
