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

from collections import Counter, defaultdict
from collections.abc import Iterator

from pydantic import Field

from generators.base import BaseGenerator, GenerationContext, GeneratorConfig
from sentinel.tasks import SpecError
from sentinel.types import Candidate, Failure, canonical_json


class MutateConfig(GeneratorConfig):
    type: str = "mutate"
    per_failure: int = Field(2, ge=1, description="variants proposed per failed task")


def _cluster(failure: Failure) -> tuple[str, tuple[str, ...], str]:
    # Same key as `sentinel.analyzer.cluster_key`, which generators may not import.
    return failure.family, tuple(sorted(failure.skills)), failure.mode


class MutateGenerator(BaseGenerator):
    name = "mutate"
    config_model = MutateConfig
    config: MutateConfig

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        by_task: dict[str, list[Failure]] = defaultdict(list)
        for failure in ctx.failures:
            task = ctx.tasks.get(failure.task_id)
            if task is not None and task.family in ctx.families:
                by_task[failure.task_id].append(failure)
        cluster_size = Counter(_cluster(f) for fs in by_task.values() for f in fs)
        order = sorted(
            by_task,
            key=lambda tid: (
                -max(cluster_size[_cluster(f)] for f in by_task[tid]),
                -len(by_task[tid]),
                tid,
            ),
        )
        limit = min(self.config.max_candidates, ctx.budget)
        proposed = {canonical_json([ctx.tasks[tid].family, ctx.tasks[tid].spec]) for tid in order}
        exhausted: set[str] = set()
        made = 0
        for _ in range(self.config.per_failure):
            for task_id in order:
                if made >= limit:
                    return
                if task_id in exhausted:
                    continue
                task = ctx.tasks[task_id]
                try:
                    spec = ctx.families[task.family].perturb(task.spec, ctx.rng)
                except SpecError:
                    exhausted.add(task_id)
                    continue
                key = canonical_json([task.family, spec])
                if key in proposed:  # the family repeated itself; validation would drop it
                    continue
                proposed.add(key)
                made += 1
                yield Candidate(
                    family=task.family,
                    spec=spec,
                    answer=None,
                    parent_task_id=task_id,
                    failure_ids=[f.failure_id for f in by_task[task_id]],
                    generator=self.name,
                )
