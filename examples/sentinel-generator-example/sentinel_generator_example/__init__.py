"""`example`: skill-matched draws from the base distribution, as a separately installed plugin.

For each failed task (most failures first), up to `tries` specs are drawn from the family's base
distribution with `ctx.rng`; those whose skills equal the failed task's skills become candidates
(at most `per_failure` per task), carrying the parent task and its failures. Families whose base
distribution never produces those skills simply yield nothing for that task.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from pydantic import Field

from generators import GenerationContext, GeneratorConfig
from sentinel.types import Candidate, Failure, canonical_json


class ExampleConfig(GeneratorConfig):
    type: str = Field("example", description="the generator: example")
    per_failure: int = Field(2, ge=1, description="candidates per failed task")
    tries: int = Field(200, ge=1, description="base-distribution draws per failed task")


class ExampleGenerator:
    name = "example"
    config_model = ExampleConfig

    def __init__(self, config: ExampleConfig) -> None:
        self.config = config

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        by_task: dict[str, list[Failure]] = defaultdict(list)
        for failure in ctx.failures:
            if failure.task_id in ctx.tasks:
                by_task[failure.task_id].append(failure)
        seen: set[str] = set()
        for task_id in sorted(by_task, key=lambda t: (-len(by_task[t]), t)):
            task = ctx.tasks[task_id]
            family = ctx.families.get(task.family)
            if family is None:
                continue
            made = 0
            for _ in range(self.config.tries):
                if made >= self.config.per_failure:
                    break
                spec = family.sample_spec(ctx.rng)
                key = canonical_json([task.family, spec])
                if key in seen or sorted(family.skills(spec)) != sorted(task.skills):
                    continue
                seen.add(key)
                made += 1
                yield Candidate(
                    family=task.family,
                    spec=spec,
                    parent_task_id=task.task_id,
                    failure_ids=[f.failure_id for f in by_task[task_id]],
                )
