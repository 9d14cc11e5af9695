"""`escalate`: harder variants of what the policy has mastered.

Reads `ctx.mastered` (tasks the policy now solves reliably; the loop fills it from the
curriculum's `mastered_tasks()`) and asks each task's family for `escalate(spec, rng)`, a harder
variant (for `arith`: one more operation). Mastered tasks are visited in the order given,
round-robin, `per_task` variants each. The candidates carry the mastered task as parent and no
failure ids (they come from a success, so they target no failure cluster). A family that offers
no escalation (None) or cannot escalate a spec (`SpecError`) is skipped; anything else it raises
propagates (recorded by the runner).
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import Field

from generators.base import (
    BaseGenerator,
    GenerationContext,
    GeneratorConfig,
    claim,
    round_robin,
)
from sentinel.tasks import SpecError
from sentinel.types import Candidate, canonical_json


class EscalateConfig(GeneratorConfig):
    type: str = Field("escalate", description="the generator: escalate")
    per_task: int = Field(1, ge=1, description="harder variants proposed per mastered task")


class EscalateGenerator(BaseGenerator):
    name = "escalate"
    config_model = EscalateConfig
    config: EscalateConfig

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        mastered = [t for t in ctx.mastered if t.family in ctx.families]
        proposed = {canonical_json([t.family, t.spec]) for t in mastered}
        queues: list[list[Candidate]] = []
        for task in mastered:
            queue: list[Candidate] = []
            for _ in range(self.config.per_task):
                try:
                    spec = ctx.families[task.family].escalate(task.spec, ctx.rng)
                except SpecError:
                    break
                if spec is None:
                    break
                if not claim(proposed, task.family, spec):
                    continue
                queue.append(
                    Candidate(
                        family=task.family,
                        spec=spec,
                        parent_task_id=task.task_id,
                    )
                )
            queues.append(queue)
        yield from round_robin(queues, ctx.budget)
