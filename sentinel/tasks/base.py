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
- `locate_error(task, steps)`: the first step that went wrong in a failed attempt;
- fault schedules (`sentinel.env.faults`), for families whose tasks can carry them:
  `fault_types()`, `faults_of(spec)`, `without_faults(spec)`, `with_fault(spec, type, rng)`.

Hooks with defaults, for families whose episodes are more than one prompt and one answer:

- `tool_map(spec)`: the tools of one episode of `spec` (fresh instances; stateful tools such as
  BFCL's API classes start from the spec's initial state). The default ignores `spec`.
- `follow_up_turns(spec)`: the user turns after the prompt (passed to `Episode(follow_ups=...)`).
- `verify_trajectory(task, trajectory)`: the outcome check of a whole episode; the default checks
  the final answer with `verify`. A family whose success is the tools' end state overrides it.

`make_task` ties these together and is the only way a `Task` is built from a spec. See
docs/families.md.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from sentinel.env.parser import format_answer, format_call
from sentinel.env.tools import Tool, ToolFailure
from sentinel.types import Origin, Step, Task, Trajectory


class SpecError(ValueError):
    """A spec that the family cannot turn into a task; the message says why."""


# Longest `instruction` (a family's system message) a family config takes: a prompt, not a
# document; millions of characters would stall the cold start's tokenizer in silence.
MAX_INSTRUCTION_CHARS = 4_000


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
    """The calls, in order, and the final answer. `turn_sizes` (multi-turn tasks only) is the
    number of calls in each user turn; each user turn is then closed with the answer."""

    calls: list[ReferenceCall] = field(default_factory=list)
    answer: str = ""
    turn_sizes: list[int] | None = None

    def assistant_turns(self) -> list[str]:
        """The assistant messages of the reference trajectory, one per turn."""
        turns = [format_call(c.tool, c.arguments) for c in self.calls]
        if self.turn_sizes is None:
            return [*turns, format_answer(self.answer)]
        if sum(self.turn_sizes) != len(turns):
            raise ValueError(f"turn_sizes {self.turn_sizes} do not add up to {len(turns)} calls")
        out: list[str] = []
        for size in self.turn_sizes:
            out += [*turns[:size], format_answer(self.answer)]
            turns = turns[size:]
        return out


class FailFirstCall:
    """A tool wrapper whose first call fails transiently (`ToolFailure`, with the message of the
    environment's injected fault); wrappers sharing `state` share that one failure. Made by
    `fail_first_call`."""

    def __init__(self, tool: Tool, state: dict[str, bool]) -> None:
        self.tool, self.state = tool, state
        self.name, self.description, self.parameters = tool.name, tool.description, tool.parameters

    def __call__(self, **arguments: Any) -> str:
        if not self.state["failed"]:
            self.state["failed"] = True
            raise ToolFailure(f"{self.name} is temporarily unavailable; try again")
        return self.tool(**arguments)


def fail_first_call(tools: dict[str, Tool]) -> dict[str, Tool]:
    """`tools` such that the episode's first call fails transiently, whichever tool it goes to.

    A task-level, deterministic fault: recovering from a tool error is then part of the reference
    solution (SFT sees the retry) and the task can carry the skill tag `recover:tool_error`,
    unlike the environment's random faults (`env.faults`), which hit any task untagged."""
    state = {"failed": False}
    return {name: FailFirstCall(tool, state) for name, tool in tools.items()}


class TaskFamily(ABC):
    name: ClassVar[str]
    config_model: ClassVar[type[FamilyConfig]] = FamilyConfig

    def __init__(self, config: FamilyConfig | None = None) -> None:
        self.config = config if config is not None else self.config_model()

    # -- what the environment needs --------------------------------------------------------
    @abstractmethod
    def tools(self) -> list[Tool]:
        """The tools this family's tasks may use (fresh instances, stateless or per-episode)."""

    def tool_map(self, spec: dict[str, Any] | None = None) -> dict[str, Tool]:
        """The tools of one episode of `spec`, by name (fresh instances on every call). The
        default ignores `spec`; a family whose tools hold per-task state overrides this and may
        require `spec`."""
        return {t.name: t for t in self.tools()}

    def follow_up_turns(self, spec: dict[str, Any]) -> list[list[dict[str, str]]]:
        """The user turns that come after the prompt, one message list per turn (default none)."""
        return []

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

    def verify_trajectory(self, task: Task, trajectory: Trajectory) -> bool:
        """Whether a whole episode succeeded; by default, whether its final answer verifies."""
        return self.verify(task, trajectory.answer)

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

    # -- fault schedules (`sentinel.env.faults`); the default family carries none ---------------
    def fault_types(self) -> tuple[str, ...]:
        """The scheduled fault types this family's tasks can carry."""
        return ()

    def faults_of(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        """The fault schedule `spec` carries (`[{"type", "call"}]`, empty for a clean task)."""
        return []

    def without_faults(self, spec: dict[str, Any]) -> dict[str, Any]:
        """`spec` with its fault schedule removed."""
        return spec

    def with_fault(self, spec: dict[str, Any], fault_type: str,
                   rng: random.Random) -> dict[str, Any] | None:
        """`spec`, its faults removed, carrying one `fault_type` fault at a random call where it
        can happen; None when it cannot carry that type."""
        return None

    # -- construction --------------------------------------------------------------------------
    def reference_trajectory(self, task: Task, chat: Any, parser: Any, env: Any) -> Trajectory:
        """The reference solution of `task` replayed through the real environment (no faults):
        exactly the tokens a policy would have produced; the SFT cold start trains on them.
        `chat`, `parser`, `env`: a `ChatFormat`, a tool-call parser and an `EnvConfig`.
        A task with a prefix: the prefix replayed (mask 0), then the reference continuation from
        the state it reached (mask 1; the rule: `sentinel.tasks.prefix`). With a hint, the
        continuation's first turn must start with it: the hint is context (mask 0), the rest of
        that turn the first trained tokens."""
        from sentinel.env.environment import replay
        from sentinel.tasks.prefix import reference_continuation

        turns = (reference_continuation(self, task, chat, parser, env) if task.prefix
                 else self.solve(task.spec, self.tool_map(task.spec)).assistant_turns())
        if task.hint:  # revealed already: the policy's first turn is the rest of the reference's
            if not turns or not turns[0].startswith(task.hint):
                raise ValueError(f"the hint {task.hint!r} is not the start of the reference's "
                                 f"next turn {turns[0] if turns else None!r}")
            turns = [turns[0][len(task.hint):], *turns[1:]]
        return replay(task, turns, self.tool_map(task.spec), chat, parser, env,
                      follow_ups=self.follow_up_turns(task.spec))

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
        solution = self.solve(spec, self.tool_map(spec))
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
