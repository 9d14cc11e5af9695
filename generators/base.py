"""The generator protocol: what a task generator is and what it is given.

A generator is any object with a `name` and `generate(ctx) -> Iterable[Candidate]`. It reads the
round's failures (and the tasks they failed on) from a `GenerationContext` and proposes
`Candidate`s; it never builds `Task`s itself. Everything it yields goes through the validation
pipeline (`generators.validate`) before it can reach training, and `generators.run` isolates it:
an exception, garbage or a slow generator costs only its own candidates.

`GeneratorConfig` is the config every generator is built from (one pydantic model per generator,
chosen by the `type` field, as prime-rl does); `BaseGenerator` is the small base class the
built-ins use. Plugins may use it or just satisfy `TaskGenerator`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field

from sentinel.tasks import TaskFamily
from sentinel.types import Candidate, Failure, Task


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
    """

    round: int
    failures: list[Failure]
    tasks: dict[str, Task]
    families: dict[str, TaskFamily]
    rng: random.Random
    budget: int


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
