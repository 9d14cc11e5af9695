"""The trainers' hyper-parameters as pydantic models, in a module that does not import torch, so
that loading a run config (`sentinel.config`) and `sentinel --help` stay cheap.

`trainers.grpo` and `trainers.sft` re-export these names. Ranges are pydantic constraints
(`Field(gt=..., ge=...)`), visible in the JSON schema; where a bound protects a rule that is not
obvious, the field's `json_schema_extra["why"]` says it, and `sentinel.config` adds that reason to
the error (as trl's config errors explain the rule they protect).

The loop's `grpo:` section is `GRPOUpdateConfig`: everything but the sampling temperature, which
has one key, `rollout.temperature`. The trainer itself takes a `GRPOConfig` (the same fields plus
`temperature`), which the loop builds from both (`SentinelConfig.grpo_trainer_config`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

if TYPE_CHECKING:
    import torch

Schedule = Literal["constant", "linear", "cosine"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "dr_grpo"]
ScaleRewards = Literal["group", "batch", "none"]
KLGuardAction = Literal["undo", "halve"]
RolloutCorrection = Literal["none", "recompute", "tis"]


_BOUNDS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def why(reason: str) -> dict[str, str]:
    """`json_schema_extra` of a constrained field: the rule its bound protects, added to errors."""
    return {"why": reason}


class ExplainedModel(BaseModel):
    """Unknown keys are errors, and a bound error of a field marked with `why(...)` says the rule:
    `Input should be greater than or equal to 2: GRPO compares samples within a group`."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="wrap")
    @classmethod
    def _explain(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        try:
            return handler(data)
        except ValidationError as exc:
            errors = exc.errors()
            reasons = [_reason(cls, e) if e["type"] in _BOUNDS else None for e in errors]
            if not any(reasons):
                raise
            raise ValidationError.from_exception_data(exc.title, [InitErrorDetails(
                type=PydanticCustomError(e["type"], e["msg"] + (f": {r}" if r else ""),
                                         e.get("ctx")),
                loc=e["loc"], input=e["input"]) for e, r in zip(errors, reasons, strict=True)],
            ) from None


def _reason(model: type[BaseModel], error: Any) -> str | None:
    """The `why` of the field an error of `model` is located at (one level: nested models
    explain their own errors)."""
    loc = error["loc"]
    field = model.model_fields.get(loc[0]) if len(loc) == 1 and isinstance(loc[0], str) else None
    extra = field.json_schema_extra if field is not None else None
    return extra.get("why") if isinstance(extra, dict) else None  # type: ignore[return-value]


class GRPOUpdateConfig(ExplainedModel):
    """Hyper-parameters of the GRPO update, without the sampling temperature (the `grpo:` section
    of a run config; the rollout side owns the temperature)."""

    lr: float = Field(3e-5, gt=0, description="AdamW peak learning rate")
    epsilon_low: float = Field(0.2, ge=0, lt=1, description="lower clip: ratio >= 1 - epsilon_low",
                               json_schema_extra=why("the lower clip bound 1 - epsilon_low must "
                                                     "stay positive"))
    epsilon_high: float = Field(0.2, ge=0, description="upper clip: ratio <= 1 + epsilon_high "
                                "(DAPO clip-higher when larger than epsilon_low)")
    beta: float = Field(0.0, ge=0, description="KL coefficient (k3) to a frozen reference model, "
                        "a copy of the policy when the trainer is built; 0 makes none")
    kl_ratio_correction: bool = Field(False, description="multiply the k3 term by the importance "
                                      "ratio (trl's use_bias_correction_kl)")
    loss_agg: LossAgg = Field("token-mean", description="loss aggregation: token-mean, "
                              "seq-mean-token-mean or dr_grpo")
    scale_rewards: ScaleRewards = Field("group", description="advantage std normalisation: "
                                        "group, batch or none")
    num_iterations: int = Field(1, ge=1, description="optimisation passes over each batch, one "
                                "optimizer step each")
    mask_truncated_completions: bool = Field(False, description="no loss for trajectories cut by "
                                             "a turn or token limit (trl's option)")
    gradient_accumulation_steps: int = Field(1, ge=1, description="micro-batches per optimizer "
                                             "step; the gradient is the full-batch one")
    micro_batch_size: int = Field(32, ge=1, description="most sequences per forward/backward")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient-norm clip")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_completion_tokens: int = Field(256, ge=1, description="the constant normaliser of dr_grpo")
    lr_scheduler: Schedule = Field("constant", description="LR schedule after the warm-up: "
                                   "constant, linear or cosine (decaying to total_steps)")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warm-up")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="where linear/cosine decay "
                                "ends, as a fraction of lr")
    total_steps: int | None = Field(None, ge=1, description="optimizer steps the decaying "
                                    "schedule spans (null: the loop's whole run)")
    bf16: bool | Literal["auto"] = Field("auto", description="bf16 autocast of the forward "
                                         "passes; auto: only on a CUDA device with bf16")
    share_prefix: bool = Field(True, description="run each distinct prompt of a micro-batch once "
                               "and share its KV cache with its group")
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1 (trl's adam_beta1)")
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0, description="AdamW beta2 (trl's adam_beta2)")
    adam_epsilon: float = Field(1e-8, gt=0.0, description="AdamW epsilon (trl's adam_epsilon)")
    adam_v_warm_start: bool = Field(False, description="before the first optimizer step, set "
                                    "AdamW's second moment to the mean over the batch's groups of "
                                    "each group's squared gradient estimate, so the first step is "
                                    "lr * g / sqrt(v), at most lr, instead of lr * sign(g)")
    kl_guard: float | None = Field(None, gt=0.0, description="after each optimizer step, the "
                                   "batch's mean k3 KL(before || after) on its trained tokens; "
                                   "above this the step is undone or halved (kl_guard_action). "
                                   "null: no guard, no extra forward pass")
    kl_guard_action: KLGuardAction = Field("undo", description="undo: restore the parameters and "
                                           "optimizer state (the step is skipped); halve: retake "
                                           "it once at half the learning rate, undo if that "
                                           "still exceeds kl_guard")
    rollout_correction: RolloutCorrection = Field(
        "none", description="the 'old' log-probs of the ratio: none uses the rollout engine's "
        "sampling log-probs; recompute replaces them by the trainer's (a no-grad forward before "
        "the first pass); tis recomputes and also multiplies each token's surrogate by "
        "min(exp(trainer - engine), rollout_is_cap), trl's vllm_importance_sampling_correction "
        "(token_truncate)")
    rollout_is_cap: float = Field(3.0, gt=0.0, description="tis: the truncation cap (trl's "
                                  "vllm_importance_sampling_clip_max)")

    @model_validator(mode="after")
    def _schedule(self) -> GRPOUpdateConfig:
        if self.total_steps is not None and self.warmup_steps > self.total_steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must not exceed total_steps "
                f"({self.total_steps}): the schedule would end before the warm-up does"
            )
        if self.adam_v_warm_start and self.adam_beta2 == 0:
            raise ValueError(
                "adam_v_warm_start needs adam_beta2 > 0: with adam_beta2 = 0 the second moment "
                "keeps no memory of the warm start"
            )
        return self

    def autocast_dtype(self, device: torch.device) -> torch.dtype | None:
        return bf16_autocast_dtype(self.bf16, device)


def bf16_autocast_dtype(bf16: bool | str, device: torch.device) -> torch.dtype | None:
    """bfloat16 when `bf16` is True, or "auto" on a CUDA device that supports it; else None.
    Under autocast the weights, their gradients and the optimizer's moments stay float32; only
    the matmuls of the forward (and so of the backward) run in bfloat16."""
    import torch

    use = (device.type == "cuda" and torch.cuda.is_bf16_supported()) if bf16 == "auto" \
        else bool(bf16)
    return torch.bfloat16 if use else None


# Native-trainer options with no counterpart in trl's GRPO loss, and their off values
# (`trainer.backend: trl` refuses the others; trainers.trl_backend).
NATIVE_ONLY = {"adam_v_warm_start": False, "kl_guard": None, "rollout_correction": "none"}


def trl_unsupported(grpo: GRPOUpdateConfig) -> list[str]:
    """The `grpo.*` keys set to something trl's trainer cannot do, as `key=value` strings."""
    return [f"grpo.{k}={getattr(grpo, k)!r}" for k, off in NATIVE_ONLY.items()
            if getattr(grpo, k) != off]


class GRPOConfig(GRPOUpdateConfig):
    """Hyper-parameters of the GRPO trainer: the update's, plus the temperature the trajectories
    were sampled at (the loss recomputes log-probs at it, as trl's `GRPOConfig.temperature`)."""

    temperature: float = Field(0.7, gt=0, description="sampling temperature of the trajectories; "
                               "the recomputed log-probs use it")


class SFTConfig(ExplainedModel):
    """Hyper-parameters of one SFT run."""

    steps: int = Field(300, ge=0, description="optimizer steps (0 trains nothing)")
    batch_size: int = Field(32, ge=1, description="examples per step")
    lr: float = Field(1e-3, gt=0, description="AdamW peak learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    warmup_steps: int = Field(20, ge=0, description="steps of linear warm-up")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="where the cosine decay ends, "
                                "as a fraction of lr")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient-norm clip")
    seed: int = Field(0, description="seed of the batch order")
    pack: bool = Field(True, description="pack several examples into one row instead of padding")
    bf16: bool | Literal["auto"] = Field("auto", description="bf16 autocast of the forward "
                                         "passes (weights and AdamW stay float32); auto: only "
                                         "on a CUDA device with bf16")
    recovery_share: float | None = Field(
        None, ge=0.0, le=1.0, description="share of cold-start examples that demonstrate "
        "recovering from a scheduled tool fault (a fault type of the family's fault_types at a "
        "random call); the rest are clean. null: examples follow the base distribution as is")
    recovery_types: dict[str, float] | None = Field(
        None, description="relative weights of the fault types among those recovery "
        "demonstrations (a type of the family's fault_types that is missing or weighted 0 gets "
        "none), so the cold start can know some remedies well and others barely. null: the "
        "family's fault_types, uniformly")
    max_seq_len: int = Field(512, ge=2, description="row length when packing",
                             json_schema_extra=why("one target token needs a context token"))

    def autocast_dtype(self, device: torch.device) -> torch.dtype | None:
        return bf16_autocast_dtype(self.bf16, device)

    @model_validator(mode="after")
    def _check_recovery_types(self) -> SFTConfig:
        # The fault-type names are checked by sentinel.config (trainers do not import env).
        weights = None if self.recovery_types is None else list(self.recovery_types.values())
        if weights is not None and (any(w < 0 for w in weights) or not any(w > 0 for w in weights)):
            raise ValueError("recovery_types: weights must be >= 0, at least one > 0")
        return self
