"""The generator protocol: what a task generator is and what it is given.

A generator is any object with a `name` and `generate(ctx) -> Iterable[Candidate]`. It reads the
round's failures (and the tasks they failed on) from a `GenerationContext` and proposes
`Candidate`s; it never builds `Task`s itself. Everything it yields goes through the validation
pipeline (`generators.validate`) before it can reach training, and `generators.run` isolates it:
an exception, garbage or a slow generator costs only its own candidates.

`GeneratorConfig` is the config every generator is built from (one pydantic model per generator,
chosen by the `type` field, as prime-rl does); `BaseGenerator` is the small base class the
built-ins use. Plugins may use it or just satisfy `TaskGenerator`.

A generator that reads free text (the `teacher`) may also yield `Unparseable` for output it could
not turn into a candidate; the pipeline stores it as a rejection (`unparseable`) instead of
dropping it silently.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from sentinel.tasks import TaskFamily
from sentinel.types import Candidate, Failure, Task, Trajectory, canonical_json

T = TypeVar("T")


class GeneratorConfig(BaseModel):
    """Base config of a generator. Unknown keys are errors, so a typo in a config file is reported
    instead of silently ignored."""

    model_config = ConfigDict(extra="forbid")
    type: str = Field(description="builtin name, entry-point name, or `module:Class`")
    max_candidates: int = Field(32, ge=0, description="most candidates taken from one call")


@dataclass
class GenerationContext:
    """What a generator sees in one round.

    `failures` are the failures to aim at; `tasks` maps the task id of every one of them to its
    `Task`; `families` holds the task families by name; `rng` is the only randomness a generator
    should use (runs are reproducible); `budget` is how many candidates each generator may propose.

    Optional, for the generators that need them: `clusters` are this round's failure clusters
    (rows of the store's `clusters` table, as `sentinel.analyzer.cluster_failures` returns them:
    `cluster_id`, `family`, `skills`, `mode`, `n_failures`, `share`, `trend`,
    `exemplar_traj_ids`, `summary`); `mastered` are tasks the policy now solves reliably (the
    curriculum's `mastered_tasks()`); `policy` is the current policy as `(model, tokenizer)`, for
    a `teacher` configured with `model: policy`; `trajectories` are the round's training rollouts
    by `traj_id` (those of `failures` among them), for a generator that reads the failed
    episodes themselves (`restart`); `replay` is how the rollouts run an episode, which the
    validation pipeline needs to check a candidate with a prefix (None: such candidates are
    rejected, `bad_prefix`); `sampler` is the loop's rollout backend (`RolloutBackend`: token
    contexts in, sampled ids and log-probs out), which a `teacher` with `model: policy` and
    `backend: vllm` samples with, sharing the loop's vLLM engine; `make_sampler(backend, model,
    tokenizer, options)` builds a rollout backend over another model (a teacher's own engine).
    """

    round: int
    failures: list[Failure]
    tasks: dict[str, Task]
    families: dict[str, TaskFamily]
    rng: random.Random
    budget: int
    clusters: list[dict[str, Any]] = field(default_factory=list)
    mastered: list[Task] = field(default_factory=list)
    policy: Any = None
    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    replay: Replay | None = None
    sampler: Any = None
    make_sampler: Any = None


@dataclass(frozen=True)
class Replay:
    """What replaying a task's prefix takes, as the rollouts have it: the `ChatFormat`, the
    tool-call parser and the `EnvConfig` (its turn and token limits are the ones checked)."""

    chat: Any
    parser: Any
    env: Any


@dataclass
class Unparseable:
    """Output a generator could not turn into a candidate: `text` (clipped when stored) and what
    was wrong with it. Stored as a rejection with reason `unparseable`."""

    text: str
    error: str
    parent_task_id: str | None = None


class TaskGenerator(Protocol):
    """Anything with a `name` and a `generate` method is a generator."""

    name: str

    def generate(self, ctx: GenerationContext) -> Iterable[Candidate]:
        """Propose candidates for this round; may be lazy (a Python generator)."""
        ...


class BaseGenerator(ABC):
    """Base of the built-in generators: a `name`, a `config_model`, and `generate`."""

    name: ClassVar[str]
    config_model: ClassVar[type[GeneratorConfig]] = GeneratorConfig

    def __init__(self, config: GeneratorConfig | None = None) -> None:
        self.config = config if config is not None else self.config_model(type=self.name)

    @abstractmethod
    def generate(self, ctx: GenerationContext) -> Iterable[Candidate]: ...


def failed_tasks(
    ctx: GenerationContext, keep: Callable[[Failure], bool] = lambda f: True
) -> list[tuple[Task, list[Failure]]]:
    """The failed tasks of `ctx` (those in `ctx.tasks`, of a family in `ctx.families`) with their
    failures that pass `keep`: most frequent failure cluster (family, skills, mode) first, then
    most failures first, then task id, so a small budget goes to what fails most."""
    by_task: dict[str, list[Failure]] = defaultdict(list)
    for failure in ctx.failures:
        task = ctx.tasks.get(failure.task_id)
        if task is not None and task.family in ctx.families and keep(failure):
            by_task[failure.task_id].append(failure)
    cluster_size = Counter(f.cluster_id for fs in by_task.values() for f in fs)
    order = sorted(
        by_task,
        key=lambda tid: (
            -max(cluster_size[f.cluster_id] for f in by_task[tid]),
            -len(by_task[tid]),
            tid,
        ),
    )
    return [(ctx.tasks[tid], by_task[tid]) for tid in order]


def claim(proposed: set[str], family: str, spec: dict[str, Any]) -> bool:
    """True the first time (family, spec) is seen in `proposed` (and record it); a generator
    skips what it already proposed, since validation would reject it as a duplicate anyway."""
    key = canonical_json([family, spec])
    if key in proposed:
        return False
    proposed.add(key)
    return True


def round_robin(queues: Sequence[Sequence[T]], limit: int) -> Iterator[T]:
    """One item of each queue in turn (then a second of each, ...), at most `limit`: how a
    generator spreads its budget over failed tasks, and how the probe budget is shared across
    generators."""
    made = 0
    for depth in range(max((len(q) for q in queues), default=0)):
        for queue in queues:
            if depth < len(queue):
                if made >= limit:
                    return
                made += 1
                yield queue[depth]
