"""`restart`: start again right before the mistake (R^3 "reverse curriculum" restarts, AdaBack's
per-sample reveal).

A failed rollout is a demonstration of everything up to its first erroneous step. The generator
turns it into a task that starts there: the same spec with a `prefix` (`Task.prefix`), the
failed trajectory's assistant turns before its first erroneous step, which the environment
replays (never trained on) before the policy continues. The group then samples G on-policy
continuations from that state, so the learning signal sits on the step that went wrong instead of
being diluted over a long episode the policy mostly gets right.

Mining, per failure (`Failure.first_error_step`, the trajectory from `ctx.trajectories`):

- the prefix is the text of every assistant turn before the turn of the first erroneous step;
- when that step is a fault observation (an error from a tool, not a parse error, on a task
  carrying a `recover:` skill), the turn that met the fault is included too: the start state is
  "right after the fault", and the continuation is the recovery;
- a failure whose prefix would reveal nothing new (its first error is in the first turn the
  policy wrote: turn 0 of a plain task, the first turn after the prefix of a restart task) is
  skipped, unless it met a fault there (`mutate` and `fault` cover the rest); so is one without a
  first error step or trajectory, or one whose prefix is longer than `max_prefix_turns`.

Partial reveals (`reveal` > 0, AdaBack): each mined task also carries a hint, the first `reveal`
share of the reference's next turn from its start state (`sentinel.tasks.prefix`), which the
environment appends as context and the policy's first turn continues; the group's signal then sits
on the rest of that one turn (the arguments of a remedy call, the operands of a re-issued call).
A solved task with a hint is proposed again with the hint halved, and without one once it would
be shorter than `min_hint`; then the prefix shrinks as above.

Failed tasks are visited as `mutate` visits them (biggest failure cluster first, round-robin), at
most `per_failure` distinct prefixes per task, each carrying the ids of the failures that gave it.

Backtracking (AdaBack's shrinking): a task with a prefix that the policy now solves, because the
curriculum counts it as mastered (`ctx.mastered`) or its pass rate in this round's training
rollouts (`ctx.trajectories`) is above `shrink_above`, is proposed again with its prefix one turn
shorter, so the revealed part shrinks back towards the task's beginning (the empty prefix is the
plain task, usually already stored: a `duplicate`). Only tasks rolled out this round are
considered, so a task is shrunk once, when it is solved, not in every later round. A restart task
solved in every rollout of the round yet not mastered is not in `ctx.tasks` (it has no failure),
so it waits for the curriculum to master it. The probe rate measured when a task was accepted is
not used: it lies inside the probe band by construction. Shrunk candidates come first (they are
few), then mined ones.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterator

from pydantic import Field

from generators.base import (
    BaseGenerator,
    GenerationContext,
    GeneratorConfig,
    claim,
    failed_tasks,
    round_robin,
)
from sentinel.types import Candidate, Failure, Step, Task, Trajectory

RECOVER_SKILL = "recover:"


class RestartConfig(GeneratorConfig):
    type: str = Field("restart", description="the generator: restart")
    per_failure: int = Field(1, ge=1, description="distinct prefixes proposed per failed task")
    shrink_above: float = Field(
        0.75, ge=0.0, le=1.0,
        description="a task with a prefix whose pass rate in this round's training rollouts is "
                    "above this (or that is mastered) is proposed with its prefix a turn shorter")
    max_prefix_turns: int = Field(
        8, ge=1, description="longest prefix proposed, in assistant turns; failures whose first "
                             "error comes later are skipped")
    reveal: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="AdaBack's partial reveal: the share of the reference's next turn (from the "
                    "start state) given as the task's hint, the revealed start of the policy's "
                    "turn; a solved task is proposed again with its hint halved (shorter than "
                    "min_hint: none). 0: whole turns only")
    min_hint: int = Field(8, ge=1, description="shortest hint proposed, in characters")


def met_fault(step: Step, task: Task) -> bool:
    """Whether `step` is a fault observation: a tool's error (not a parse error) on a task that
    carries a `recover:` skill, i.e. whose fault schedule the step met."""
    return (step.error is not None and step.error_kind != "parse"
            and any(s.startswith(RECOVER_SKILL) for s in task.skills))


def start_state(task: Task, trajectory: Trajectory, failure: Failure) -> list[str] | None:
    """The prefix to restart `failure` from (see the module docstring), or None when it reveals
    nothing beyond `task.prefix` (or the failure has no first error step in `trajectory`)."""
    step = next((s for s in trajectory.steps if s.index == failure.first_error_step), None)
    if failure.first_error_step is None or step is None:
        return None
    end = step.turn + 1 if met_fault(step, task) else step.turn
    texts: dict[int, str] = {}
    for s in trajectory.steps:
        texts.setdefault(s.turn, s.text)
    if end <= len(task.prefix) or any(t not in texts for t in range(end)):
        return None
    return [texts[t] for t in range(end)]


def pass_rates(trajectories: dict[str, Trajectory]) -> dict[str, float]:
    """Each task's share of successful trajectories among `trajectories`."""
    outcomes: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories.values():
        outcomes[t.task_id].append(t.success)
    return {task_id: sum(v) / len(v) for task_id, v in outcomes.items()}


class RestartGenerator(BaseGenerator):
    name = "restart"
    config_model = RestartConfig
    config: RestartConfig

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        proposed: set[str] = set()
        shrunk = list(self._shrunk(ctx, proposed))
        yield from shrunk[: ctx.budget]
        yield from round_robin(self._mined(ctx, proposed), ctx.budget - len(shrunk))

    def _shrunk(self, ctx: GenerationContext, proposed: set[str]) -> Iterator[Candidate]:
        rates = pass_rates(ctx.trajectories)
        mastered = {t.task_id for t in ctx.mastered}
        pool = {t.task_id: t for t in [*ctx.mastered, *ctx.tasks.values()]}
        for task_id in sorted(pool):
            task = pool[task_id]
            solved = task_id in mastered or rates.get(task_id, 0.0) > self.config.shrink_above
            if not ((task.prefix or task.hint) and task.family in ctx.families
                    and task_id in rates and solved):
                continue
            # A hint shrinks first (halved, then gone), then the prefix, a turn at a time.
            if task.hint:
                prefix, hint = task.prefix, self._halved(task.hint)
            else:
                prefix, hint = task.prefix[:-1], ""
            if claim(proposed, task.family, {"spec": task.spec, "prefix": prefix, "hint": hint}):
                yield Candidate(family=task.family, spec=task.spec, prefix=prefix, hint=hint,
                                parent_task_id=task.task_id, failure_ids=list(task.failure_ids))

    def _halved(self, hint: str) -> str:
        half = hint[: len(hint) // 2]
        return half if len(half) >= self.config.min_hint else ""

    def _hint(self, ctx: GenerationContext, task: Task, prefix: list[str]) -> str:
        """The first `reveal` share of the reference's next turn from the state `prefix`
        reaches ("" when reveal is off, too short, or there is no reference from there)."""
        if self.config.reveal <= 0 or ctx.replay is None or task.family not in ctx.families:
            return ""
        from sentinel.tasks.prefix import reference_continuation

        start = dataclasses.replace(task, prefix=list(prefix), hint="", task_id="")
        try:
            turns = reference_continuation(ctx.families[task.family], start, ctx.replay.chat,
                                           ctx.replay.parser, ctx.replay.env)
        except Exception:  # no reference from this state: whole turns only
            return ""
        hint = turns[0][: int(len(turns[0]) * self.config.reveal)] if turns else ""
        return hint if len(hint) >= self.config.min_hint else ""

    def _mined(self, ctx: GenerationContext, proposed: set[str]) -> list[list[Candidate]]:
        """Per failed task (in `failed_tasks` order), its candidates: distinct prefixes in the
        order of the failures, at most `per_failure`."""
        queues = []
        for task, failures in failed_tasks(ctx):
            by_prefix: dict[tuple[str, ...], list[str]] = {}
            for failure in failures:
                trajectory = ctx.trajectories.get(failure.traj_id)
                prefix = None if trajectory is None else start_state(task, trajectory, failure)
                if prefix is not None and len(prefix) <= self.config.max_prefix_turns:
                    by_prefix.setdefault(tuple(prefix), []).append(failure.failure_id)
            queue: list[Candidate] = []
            for prefix, ids in by_prefix.items():
                if len(queue) >= self.config.per_failure:
                    break
                hint = self._hint(ctx, task, list(prefix))
                if claim(proposed, task.family,
                         {"spec": task.spec, "prefix": list(prefix), "hint": hint}):
                    queue.append(Candidate(family=task.family, spec=task.spec,
                                           prefix=list(prefix), hint=hint,
                                           parent_task_id=task.task_id, failure_ids=ids))
            queues.append(queue)
        return queues
