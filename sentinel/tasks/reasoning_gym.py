"""`reasoning_gym`: any dataset of the `reasoning-gym` package (extra `reasoning-gym`).

A spec names one generated item:

    {"dataset": "chain_sum", "config": {"max_terms": 3}, "seed": 12345, "index": 4}

`config` holds the dataset's difficulty parameters (keys of its config dataclass other than `seed`
and `size`); the item is `create_dataset(dataset, seed=seed, size=index + 1, **config)[index]`, so a
stored spec regenerates the same question. The family config lists which datasets to sample, with
weights and their difficulty configs.

Checking is the dataset's own `score_answer`; only a score of exactly 1.0 counts as success
(several datasets give partial credit, e.g. countdown's 0.01 for a well-formed wrong answer, which
must not pass).

Simplifications: the reference solution answers directly with the dataset's answer, with no tool
calls (reasoning-gym ships answers, not solution procedures), so SFT on it teaches answers, not
tool use. Tools are optional (`tools: [calculator]`, or `python` where `sentinel.env.tools`
provides it) and only offered, never required. Edits: `perturb` draws a new seed;
`escalate` raises one difficulty attribute to the next level of the dataset's reasoning-gym
curriculum (None for datasets without a curriculum or already at the top); `decompose` is not
offered (an item has no sub-steps to cut out).

Skills: `dataset:<name>` and `tool:<name>` per offered tool. Difficulty: 1 + the sum, over the
dataset's curriculum attributes, of the level index reached by the config's upper value.
"""

from __future__ import annotations

import dataclasses
import json
import random
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sentinel.env.tools import Calculator, Tool
from sentinel.tasks.base import (
    MAX_INSTRUCTION_CHARS,
    FamilyConfig,
    ReferenceSolution,
    SpecError,
    TaskFamily,
)
from sentinel.types import Step, Task

RESERVED_KEYS = ("seed", "size")
MAX_INDEX = 64


class DatasetEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="reasoning-gym dataset name, e.g. chain_sum")
    weight: float = Field(1.0, gt=0, description="share among this family's datasets")
    config: dict[str, Any] = Field(default_factory=dict, description="difficulty parameters")


class ReasoningGymConfig(FamilyConfig):
    datasets: list[DatasetEntry] = Field(
        default_factory=lambda: [DatasetEntry(name="chain_sum",
                                              config={"max_terms": 3, "max_digits": 2})],
        description="datasets to sample from",
    )
    tools: list[str] = Field(default_factory=list, description="tools offered: calculator, python")
    instruction: str = Field("Think, then end with <answer>...</answer>.",
                             max_length=MAX_INSTRUCTION_CHARS,
                             description="system message shown before each task")

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, v: list[DatasetEntry]) -> list[DatasetEntry]:
        if not v:
            raise ValueError("at least one dataset is needed")
        return v

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list[str]) -> list[str]:
        for name in v:
            _tool_class(name)
        return v


def _tool_class(name: str) -> type:
    """The class of an offered tool; `python` only where sentinel.env.tools has `Python`."""
    if name == "calculator":
        return Calculator
    if name == "python":
        from sentinel.env import tools

        if not hasattr(tools, "Python"):
            raise ValueError("the python tool is not available in this version of Sentinel")
        return tools.Python
    raise ValueError(f"unknown tool {name!r} for reasoning_gym; known: calculator, python")


def _import_reasoning_gym() -> Any:
    try:
        import reasoning_gym.factory as factory
    except ImportError as exc:
        raise ImportError("the reasoning_gym family needs the reasoning-gym package: "
                          "pip install 'sentinel-rl[reasoning-gym]'") from exc
    return factory


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if hasattr(value, "value") and not isinstance(value, int | float | str | bool):
        return value.value  # enums
    return value


@lru_cache(maxsize=256)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    return _import_reasoning_gym().create_dataset(name, seed=seed, size=size,
                                                  **json.loads(config_json))


def _entry(spec: dict[str, Any]) -> dict[str, Any]:
    ds = _dataset(spec["dataset"], json.dumps(spec["config"], sort_keys=True), spec["seed"],
                  spec["index"] + 1)
    return ds[spec["index"]]


def _score(spec: dict[str, Any], answer: str) -> float:
    ds = _dataset(spec["dataset"], json.dumps(spec["config"], sort_keys=True), spec["seed"],
                  spec["index"] + 1)
    return float(ds.score_answer(answer, _entry(spec)))


def _curriculum(name: str) -> Any | None:
    factory = _import_reasoning_gym()
    return factory.create_curriculum(name) if factory.has_curriculum(name) else None


def _effective(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """Every difficulty parameter: the dataset's defaults overridden by `config`."""
    ds = _dataset(name, json.dumps(config, sort_keys=True), 0, 1)
    return {f.name: getattr(ds.config, f.name) for f in dataclasses.fields(ds.config)}


def _attribute_fields(attribute: Any) -> tuple[str | None, str]:
    """(lower field or None, upper field) that a curriculum attribute sets."""
    upper = getattr(attribute, "upper_field_name", None)
    if upper is not None:
        return attribute.lower_field_name, upper
    return None, attribute.field_name


class ReasoningGymFamily(TaskFamily):
    name = "reasoning_gym"
    config_model = ReasoningGymConfig
    config: ReasoningGymConfig

    def tools(self) -> list[Tool]:
        return [_tool_class(name)() for name in self.config.tools]

    # -- validation ----------------------------------------------------------------------------
    def validate_spec(self, spec: Any) -> dict[str, Any]:
        shape = ('reasoning_gym spec must be {"dataset": str, "config": {...}, "seed": int, '
                 '"index": int}')
        if not isinstance(spec, dict) or set(spec) != {"dataset", "config", "seed", "index"}:
            raise SpecError(shape)
        dataset, config, seed, index = spec["dataset"], spec["config"], spec["seed"], spec["index"]
        ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (seed, index))
        if not isinstance(dataset, str) or not isinstance(config, dict) or not ints:
            raise SpecError(shape)
        if not 0 <= index < MAX_INDEX or seed < 0:
            raise SpecError(f"index must be in [0, {MAX_INDEX}) and seed non-negative")
        if reserved := [k for k in RESERVED_KEYS if k in config]:
            raise SpecError(f"config must not set {', '.join(reserved)} (the spec holds them)")
        factory = _import_reasoning_gym()
        if dataset not in factory.DATASETS:
            raise SpecError(f"unknown reasoning-gym dataset {dataset!r}")
        canonical = {k: _jsonable(v) for k, v in sorted(config.items())}
        try:
            _entry({"dataset": dataset, "config": canonical, "seed": seed, "index": index})
        except Exception as exc:  # the dataset's own config checks: TypeError, AssertionError...
            raise SpecError(f"{dataset} refuses config {canonical}: "
                            f"{type(exc).__name__}: {exc}") from exc
        return {"dataset": dataset, "config": canonical, "seed": seed, "index": index}

    # -- sampling and rendering ----------------------------------------------------------------
    def sample_spec(self, rng: random.Random) -> dict[str, Any]:
        entries = self.config.datasets
        entry = rng.choices(entries, weights=[e.weight for e in entries])[0]
        return self.validate_spec({"dataset": entry.name, "config": dict(entry.config),
                                   "seed": rng.randrange(1 << 30),
                                   "index": rng.randrange(MAX_INDEX)})

    def render(self, spec: dict[str, Any]) -> list[dict[str, str]]:
        messages = [{"role": "user", "content": _entry(spec)["question"]}]
        if self.config.instruction:
            messages.insert(0, {"role": "system", "content": self.config.instruction})
        return messages

    def skills(self, spec: dict[str, Any]) -> list[str]:
        return sorted({f"dataset:{spec['dataset']}", *(f"tool:{t}" for t in self.config.tools)})

    def difficulty(self, spec: dict[str, Any]) -> float:
        curriculum = _curriculum(spec["dataset"])
        if curriculum is None:
            return 1.0
        values = _effective(spec["dataset"], spec["config"])
        level = 0
        for attribute in curriculum.attributes.values():
            value = values.get(_attribute_fields(attribute)[1])
            if isinstance(value, int | float):
                level += sum(1 for v in attribute.levels[1:] if v <= value)
        return float(1 + level)

    # -- solving and checking ------------------------------------------------------------------
    def solve(self, spec: dict[str, Any], tools: dict[str, Tool]) -> ReferenceSolution:
        answer = _entry(spec)["answer"]
        if answer is None or _score(spec, str(answer)) != 1.0:
            raise SpecError(f"{spec['dataset']} does not accept its own answer {answer!r}")
        return ReferenceSolution(answer=str(answer))

    def verify(self, task: Task, answer: str | None) -> bool:
        return answer is not None and _score(task.spec, answer) == 1.0

    def locate_error(self, task: Task, steps: list[Step]) -> int | None:
        """The answer step if it is wrong (nothing before it is checkable)."""
        for step in steps:
            if step.kind == "answer":
                return None if self.verify(task, step.answer) else step.index
        return steps[-1].index if steps else None

    # -- edits ---------------------------------------------------------------------------------
    def perturb(self, spec: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        return self.validate_spec({**spec, "seed": rng.randrange(1 << 30)})

    def escalate(self, spec: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
        curriculum = _curriculum(spec["dataset"])
        if curriculum is None:
            return None
        values = _effective(spec["dataset"], spec["config"])
        attributes = list(curriculum.attributes.values())
        rng.shuffle(attributes)
        for attribute in attributes:
            upper = _attribute_fields(attribute)[1]
            current = values.get(upper)
            if not isinstance(current, int | float) or isinstance(current, bool):
                continue
            higher = [v for v in attribute.levels if isinstance(v, int | float) and v > current]
            if not higher:
                continue
            config = {**spec["config"], upper: higher[0]}
            try:
                return self.validate_spec({**spec, "config": config,
                                           "seed": rng.randrange(1 << 30)})
            except SpecError:
                continue
        return None

