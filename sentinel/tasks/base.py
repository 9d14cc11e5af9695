"""The `TaskFamily` interface: where tasks come from and how they are checked.

A family owns everything specific to one kind of problem:

- `sample_spec(rng)`: draw a spec (the family's parameters, JSON-serialisable) from the base
  distribution;
- `validate_spec(spec)`: the schema check every candidate passes (raises `SpecError`);
- `render(spec)`: the prompt messages; `skills(spec)` and `difficulty(spec)`;
- `solve(spec, tools)`: the reference solution, made by really calling the tools; its answer is
  the canonical answer, so a task is only ever stored with an answer its tools produce;
- `verify(task, answer)`: the outcome check;
- spec edits used by generators: `perturb` (same skills, new values), and optionally `decompose`
  (the sub-problem at a step) and `escalate` (a harder variant);
- `locate_error(task, steps)`: the first step that went wrong in a failed attempt.

`make_task` ties these together and is the only way a `Task` is built from a spec.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from sentinel.env.parser import format_answer, format_call
from sentinel.env.tools import Tool
from sentinel.types import Origin, Step, Task


class SpecError(ValueError):
    """A spec that the family cannot turn into a task; the message says why."""


class FamilyConfig(BaseModel):
    """Base of every family's config model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class ReferenceCall:
    tool: str
    arguments: dict[str, Any]
    observation: str


@dataclass
class ReferenceSolution:
    calls: list[ReferenceCall] = field(default_factory=list)
    answer: str = ""

    def assistant_turns(self) -> list[str]:
        """The assistant messages of the reference trajectory, one per turn."""
        turns = [format_call(c.tool, c.arguments) for c in self.calls]
        return [*turns, format_answer(self.answer)]


class TaskFamily(ABC):
    name: ClassVar[str]
    config_model: ClassVar[type[FamilyConfig]] = FamilyConfig

    def __init__(self, config: FamilyConfig | None = None) -> None:
        self.config = config if config is not None else self.config_model()

    # -- what the environment needs --------------------------------------------------------
    @abstractmethod
    def tools(self) -> list[Tool]:
        """The tools this family's tasks may use (fresh instances, stateless or per-episode)."""

    def tool_map(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools()}

    # -- the base distribution and rendering ---------------------------------------------------
    @abstractmethod
    def sample_spec(self, rng: random.Random) -> dict[str, Any]: ...

    @abstractmethod
    def validate_spec(self, spec: Any) -> dict[str, Any]:
        """Return the canonical form of `spec`, or raise `SpecError` saying what is wrong."""

    @abstractmethod
    def render(self, spec: dict[str, Any]) -> list[dict[str, str]]: ...

    @abstractmethod
    def skills(self, spec: dict[str, Any]) -> list[str]: ...

    @abstractmethod
    def difficulty(self, spec: dict[str, Any]) -> float: ...

    @abstractmethod
    def solve(self, spec: dict[str, Any], tools: dict[str, Tool]) -> ReferenceSolution:
        """Solve by calling the tools; raises `SpecError` if the spec turns out unsolvable."""

    def verify(self, task: Task, answer: str | None) -> bool:
        return answer is not None and answer.strip() == task.answer.strip()

    # -- edits that generators use -------------------------------------------------------------
    @abstractmethod
    def perturb(self, spec: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        """Same structure and skills, new values."""

    def decompose(self, spec: dict[str, Any], step: int) -> dict[str, Any] | None:
        """The sub-problem a solver faces at reference step `step`; None if not offered."""
        return None

    def escalate(self, spec: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
        """A harder variant; None if not offered."""
        return None

    def locate_error(self, task: Task, steps: list[Step]) -> int | None:
        """Index of the first step that went wrong in a failed attempt (None: unknown)."""
        return None

    # -- construction --------------------------------------------------------------------------
    def make_task(
        self,
        spec: Any,
        *,
        origin: Origin = "seed",
        created_round: int = 0,
        parent_task_id: str | None = None,
        failure_ids: list[str] | None = None,
        generator: str | None = None,
    ) -> Task:
        """Validate, solve with the real tools, and build the `Task` (answer = tools' answer)."""
        spec = self.validate_spec(spec)
        solution = self.solve(spec, self.tool_map())
        return Task(
            family=self.name,
            spec=spec,
            prompt=self.render(spec),
            answer=solution.answer,
            skills=sorted(self.skills(spec)),
            difficulty=self.difficulty(spec),
            origin=origin,
            created_round=created_round,
            parent_task_id=parent_task_id,
            failure_ids=list(failure_ids or []),
            generator=generator,
        )

    def sample_task(self, rng: random.Random, **lineage: Any) -> Task:
        return self.make_task(self.sample_spec(rng), **lineage)
