"""`mutate`: same skills, new values, around the tasks the policy failed.

For each failed task the family's `perturb` draws a spec with the same structure and skills and
fresh values, so the policy practises exactly what it got wrong without memorising the instance.

Order: failed tasks are visited most frequent failure cluster first (family, skills, mode), then
most failures first, and round-robin (one variant of every task before a second of any), so a
small budget still covers many distinct tasks. Each task yields at most `per_failure` variants,
each carrying the parent task id and the ids of all failures on that task in `ctx.failures`.
A task whose family has no valid perturbation (`SpecError`) is skipped; anything else `perturb`
raises is a bug and propagates (the runner records it as a `generator_error`).
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
from sentinel.types import Candidate, canonical_json


class MutateConfig(GeneratorConfig):
    type: str = Field("mutate", description="the generator: mutate")
    per_failure: int = Field(2, ge=1, description="variants proposed per failed task")


class MutateGenerator(BaseGenerator):
    name = "mutate"
    config_model = MutateConfig
    config: MutateConfig

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        order = failed_tasks(ctx)
        proposed = {canonical_json([task.family, task.spec]) for task, _ in order}
        exhausted: set[str] = set()
        made = 0
        for _ in range(self.config.per_failure):
            for task, failures in order:
                if made >= ctx.budget:
                    return
                if task.task_id in exhausted:
                    continue
                try:
                    spec = ctx.families[task.family].perturb(task.spec, ctx.rng)
                except SpecError:
                    exhausted.add(task.task_id)
                    continue
                if not claim(proposed, task.family, spec):  # the family repeated itself
                    continue
                made += 1
                yield Candidate(
                    family=task.family,
                    spec=spec,
                    answer=None,
                    parent_task_id=task.task_id,
                    failure_ids=[f.failure_id for f in failures],
                )
