"""The run configuration: YAML in, typed and validated models out.

Every section is a pydantic model with `extra="forbid"`, so a misspelt key is an error, and every
error names the dotted key and says what was expected (`ConfigError`). `--set a.b=value` overrides
any key before validation; values are parsed as YAML scalars (`--set grpo.lr=1e-5`,
`--set eval.greedy=false`, `--set generators.0.per_failure=3`).

Sections owned by a component reuse that component's own config model (`trainers.grpo.GRPOConfig`,
`trainers.sft.SFTConfig`, `sentinel.rewards.RewardConfig`, `sentinel.env.environment.EnvConfig`),
so the rules live next to the code they protect.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sentinel.env.environment import EnvConfig
from sentinel.env.parser import PARSERS
from sentinel.logging import LoggingConfig
from sentinel.policy import TinyPolicyConfig
from sentinel.rewards import RewardConfig
from trainers.grpo import GRPOConfig
from trainers.sft import SFTConfig


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key and the rule."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PolicyConfig(Section):
    model: str = Field("tiny", description="'tiny' (embedded) or a local path / hub id")
    tiny: TinyPolicyConfig = Field(default_factory=TinyPolicyConfig)
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class FamilyEntry(Section):
    name: str = Field(description="built-in family name or module:Class")
    weight: float = Field(1.0, gt=0, description="share of the base distribution")
    config: dict[str, Any] = Field(default_factory=dict)

    # Both checked at load, not when the loop first builds the family: a typo must not cost a run.
    @field_validator("name")
    @classmethod
    def _known_family(cls, v: str) -> str:
        from sentinel.tasks import family_class

        try:
            family_class(v)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        except (ImportError, AttributeError, TypeError) as exc:
            raise ValueError(f"cannot load task family {v!r}: {exc}") from None
        return v

    @field_validator("config")
    @classmethod
    def _family_config(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "name" not in info.data:  # the name's own error is already reported
            return v
        from sentinel.tasks import family_class

        try:
            family_class(info.data["name"]).config_model.model_validate(v)
        except ValidationError as exc:
            raise ValueError("; ".join(
                f"unknown key '{'.'.join(map(str, e['loc']))}'" if e["type"] == "extra_forbidden"
                else ".".join(map(str, e["loc"])) + ": " * bool(e["loc"])
                + e["msg"].removeprefix("Value error, ")
                for e in exc.errors())) from None
        return v


class RolloutConfig(Section):
    backend: Literal["hf", "vllm"] = "hf"
    temperature: float = Field(0.7, gt=0, description="sampling temperature of training rollouts")
    batch_size: int = Field(128, ge=1, description="sequences per sampling call")
    engine: Literal["auto", "static", "generate"] = Field(
        "auto", description="hf backend: the static-cache sampler (Llama-family models) or "
        "transformers' generate; auto picks static where the model supports it")


class ColdStartConfig(SFTConfig):
    num_examples: int = Field(512, ge=1, description="reference trajectories to train on")
    enabled: bool = True


class BatchConfig(Section):
    steps_per_round: int = Field(8, ge=1, description="GRPO updates per round")
    tasks_per_step: int = Field(16, ge=1, description="distinct tasks per update")
    group_size: int = Field(8, description="samples per task (the GRPO group)")

    @field_validator("group_size")
    @classmethod
    def _group(cls, v: int) -> int:
        if v < 2:
            raise ValueError("group_size must be at least 2: GRPO compares samples within a group")
        return v


class EvalConfig(Section):
    num_tasks: int = Field(64, ge=1, description="held-out tasks, fixed for the run")
    samples: int = Field(4, ge=1, description="samples per held-out task at rollout temperature")
    greedy: bool = Field(True, description="also report greedy success")
    seed: int = Field(1234, description="seed of the held-out set")
    families: list[FamilyEntry] | None = Field(
        None, description="held-out distribution (default: the training families)"
    )


class CurriculumConfig(Section):
    mined_fraction: float = Field(0.5, ge=0, le=1, description="share of failure-mined tasks")
    replay_fraction: float = Field(0.0, ge=0, le=1, description="share of replayed failed tasks")
    mastery_threshold: float = Field(
        0.9, gt=0, le=1, description="tasks passing at least this often are skipped"
    )
    mastery_min_samples: int = Field(8, ge=1, description="samples before a task can be mastered")
    drop_zero_variance: bool = Field(
        False, description="drop groups whose rewards are all equal (DAPO dynamic sampling)"
    )
    zero_variance_on: Literal["reward", "success"] = Field(
        "reward", description="what must be all equal for a group to count as zero-variance: "
        "the total reward (zero advantage) or the verifier's success (DAPO's accuracy 0 or 1)")

    @model_validator(mode="after")
    def _fractions(self) -> CurriculumConfig:
        if self.mined_fraction + self.replay_fraction > 1:
            raise ValueError("mined_fraction + replay_fraction must not exceed 1")
        return self


class GenerationConfig(Section):
    time_limit_s: float = Field(30.0, gt=0, description="per generator, per round")
    budget: int = Field(64, ge=0, description="candidates per generator per round")
    probe: bool = Field(False, description="difficulty-probe accepted tasks with the policy")
    probe_samples: int = Field(4, ge=1, description="policy attempts per probed task")
    probe_band: tuple[float, float] = Field(
        (0.05, 0.75), description="kept pass rates, bounds included: [lo, hi]"
    )
    probe_budget: int = Field(64, ge=0, description="most tasks probed per round, all generators")

    @field_validator("probe_band")
    @classmethod
    def _band(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0.0 <= v[0] <= v[1] <= 1.0:
            raise ValueError(f"probe_band must be [lo, hi] with 0 <= lo <= hi <= 1, got {list(v)}")
        return v


def _check_builtin_generator(i: int, spec: dict[str, Any]) -> None:
    """Validate a built-in generator's options now, so a typo fails at config load; plugins are
    validated when the loop loads them."""
    from generators.registry import BUILTIN

    cls = BUILTIN.get(spec["type"])
    if cls is None:
        return
    try:
        cls.config_model.model_validate(spec)
    except ValidationError as exc:
        problems = "; ".join(
            f"generators.{i}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"generator {spec['type']!r}: {problems}") from None


class SentinelConfig(Section):
    seed: int = 0
    rounds: int = Field(4, ge=0, description="GRPO rounds after the round-0 cold start")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    families: list[FamilyEntry] = Field(default_factory=lambda: [FamilyEntry(name="arith")])
    env: EnvConfig = Field(default_factory=EnvConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    sft: ColdStartConfig = Field(default_factory=ColdStartConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    generators: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"type": "mutate"}],
        description="generator specs: {type: name | module:Class, ...its config}",
    )

    @field_validator("families")
    @classmethod
    def _families(cls, v: list[FamilyEntry]) -> list[FamilyEntry]:
        if not v:
            raise ValueError("at least one task family is needed")
        return v

    @field_validator("generators")
    @classmethod
    def _generators(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, spec in enumerate(v):
            if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
                raise ValueError(f"entry {i} needs a string 'type' (generators.{i}.type: a "
                                 "built-in or module:Class)")
            _check_builtin_generator(i, spec)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> SentinelConfig:
        if self.grpo.temperature != self.rollout.temperature:
            raise ValueError(
                f"grpo.temperature ({self.grpo.temperature}) must equal rollout.temperature "
                f"({self.rollout.temperature}): the importance ratio compares log-probs under the "
                "sampling distribution"
            )
        if self.env.max_turn_tokens > self.env.max_tokens:
            raise ValueError(
                f"env.max_turn_tokens ({self.env.max_turn_tokens}) must not exceed env.max_tokens "
                f"({self.env.max_tokens}): one turn cannot be longer than the whole episode"
            )
        if self.env.parser not in PARSERS:
            raise ValueError(f"env.parser {self.env.parser!r} is not one of {', '.join(PARSERS)}")
        return self


def _format_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"unknown config key '{key}'")
            continue
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
        # A cross-field rule (no location of its own) names its keys in the message.
        lines.append(f"config key '{key}': {msg}{shown}" if err["loc"] else f"config: {msg}")
    return "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key.path=value, got {item!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML: {exc}") from exc
    return key.strip().split("."), value


def apply_override(data: dict[str, Any], path: list[str], value: Any) -> None:
    node: Any = data
    for i, part in enumerate(path[:-1]):
        nxt = path[i + 1]
        if not isinstance(node, dict | list):
            raise ConfigError(f"--set {'.'.join(path)}: {'.'.join(path[:i])} is not a mapping")
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--set {'.'.join(path)}: no list index {part}")
            node = node[int(part)]
            continue
        if part not in node or node[part] is None:
            node[part] = [] if nxt.isdigit() else {}
        node = node[part]
    last = path[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError(f"--set {'.'.join(path)}: no list index {last}")
        node[int(last)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"--set {'.'.join(path)}: {'.'.join(path[:-1])} is not a mapping")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> SentinelConfig:
    """Load YAML (or take `data`), apply `key.path=value` overrides, validate."""
    raw: Any = copy.deepcopy(data or {})
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError("the config must be a mapping of keys to values at the top level")
    for item in overrides or []:
        apply_override(raw, *parse_override(item))
    try:
        return SentinelConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None
