"""GRPO: group-relative policy optimisation on multi-turn, token-in/token-out trajectories.

Design (DeepSeekMath GRPO as implemented by trl, with DAPO's asymmetric clip and Dr. GRPO's
constant normaliser as options; `tests/test_trl_crosscheck.py` checks loss and gradients against
trl's own `GRPOTrainer._compute_loss`):

- Advantages come from the caller (`group_advantages`): reward minus the mean of the trajectory's
  group, optionally divided by a std. One scalar per trajectory, broadcast to its tokens.
- Only tokens with `loss_mask == 1` (the policy's own turns) are trained; prompt and tool
  observation tokens are context and get exactly zero gradient, also when they sit between turns
  and also from the KL term. With `mask_truncated_completions` a trajectory cut by a limit
  (`finish_reason` `max_tokens` or `max_turns`) gets no loss at all (DAPO; trl's option of the
  same name).
- The importance ratio is `exp(new - old)` where `old` is the sampling log-prob stored in the
  trajectory at rollout time, and `new` is recomputed at the same sampling temperature. Using the
  sampler's log-probs (not a fresh no-grad pass) also corrects for sampler/trainer mismatch, and
  makes the passes after the first (`num_iterations > 1`) off-policy in the PPO sense.
- Per token: `-min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) + beta * k3`, with the k3 KL
  estimator `exp(ref - new) - (ref - new) - 1` against a frozen reference model when `beta > 0`
  (optionally times `r`, trl's `use_bias_correction_kl`). The trainer makes that reference
  itself: a deep copy of the model as it is when the trainer is built.
- Aggregation (`loss_agg`): "token-mean" (sum over all masked tokens of the batch / their count),
  "seq-mean-token-mean" (mean over trajectories of each one's token mean) or "dr_grpo"
  (sum / (n_trajectories * max_completion_tokens)). Micro-batches are backpropagated with the
  normaliser of the whole batch, so accumulated gradients equal those of the full-batch loss
  however the batch is split (`gradient_accumulation_steps`, `micro_batch_size`).
- `num_iterations` passes over the same batch, one AdamW step (after grad-norm clipping) per pass.
  The optimizer and the LR schedule (warm-up, then constant/linear/cosine) are created once and
  persist across `step` calls (rounds); `state_dict` / `load_state_dict` carry them (and the
  reference model) through a checkpoint (`trainers.checkpoint`).
- bf16 autocast of the forward passes when the model is on a GPU (`bf16: auto`); log-probs,
  ratios and the loss are float32.
- Shared prompts (`share_prefix`, on by default): the G trajectories of a group start with the
  same prompt, so each micro-batch runs every distinct prompt once, fans its key/value cache out
  to the trajectories that share it and runs only their rest on top
  (`trainers.common.shared_prefix_logprobs`); gradients flow back through the shared cache.
  Log-probs and gradients equal the unshared pass's (tested to 1e-5); the prompt's forward and
  backward cost once per group instead of G times.

- Recipe options against the early overshoot of a small policy (all off by default; see
  `docs/grpo.md`): `adam_v_warm_start` (AdamW's second moment set, before the first step, from
  the batch's per-group gradients); `kl_guard` (a step whose batch KL exceeds the threshold is
  undone, or retaken once at half the learning rate).

Micro-batches are cut from the batch sorted by length, so rows of similar length are padded
together. Left out: entropy bonus, sequence packing for the update, gradient checkpointing,
and any generation or reward logic (that belongs to the rollout side).
Trajectories with zero advantage are kept: they add nothing to the loss but count in the
normaliser, as in trl. With `beta == 0` their gradient is exactly zero, so
they are cut into micro-batches of their own that run forward only, without autograd (their
log-probs still feed `entropy`, `clip_ratio` and `kl_guard`): the gradient, the step and every
metric are those of the full backward, at a fraction of its cost when most groups carry no
signal (`n_inert`: how many rows took that path; `skip_inert = False` turns it off, for the
benchmark's baseline).
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch

from sentinel.types import Trajectory
from trainers.common import (
    lr_multiplier,
    model_device,
    pad_batch,
    prefix_lengths,
    shared_prefix_logprobs,
    token_logprobs,
)
from trainers.config import (  # re-exported: the config lives there
    GRPOConfig,
    LossAgg,
    ScaleRewards,
)

__all__ = [
    "GRPOConfig",
    "GRPOTrainer",
    "LossAgg",
    "ScaleRewards",
    "aggregate_loss",
    "group_advantages",
    "grpo_token_loss",
]

TRUNCATED = frozenset({"max_tokens", "max_turns"})


def _std(xs: Sequence[float]) -> float:
    """Sample std (Bessel, n - 1) like `torch.std`; 0.0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def group_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[str],
    scale: str = "group",
    eps: float = 1e-4,
) -> list[float]:
    """GRPO advantages: `A_i = (r_i - mean(r of i's group)) / (std + eps)`.

    `scale` picks the std: "group" (of i's group), "batch" (of all rewards, as trl's
    `scale_rewards="batch"`) or "none" (no division, Dr. GRPO). Stds are sample stds (n - 1), as
    trl's `torch.std`; a group of one has advantage 0. Groups need not be contiguous. A group
    whose rewards are all equal gets all-zero advantages.

    >>> [round(a, 3) for a in group_advantages([1, 0, 0, 0], ["a", "a", "b", "b"])]
    [0.707, -0.707, 0.0, 0.0]
    >>> group_advantages([1, 0, 2, 2], ["a", "a", "b", "b"], scale="none")
    [0.5, -0.5, 0.0, 0.0]
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards but {len(group_ids)} group ids")
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    members: dict[str, list[float]] = defaultdict(list)
    for r, g in zip(rewards, group_ids, strict=True):
        members[g].append(float(r))
    # A group of equal rewards has mean exactly that reward (a float sum could be off by an ulp),
    # so its advantages are exact zeros and such groups contribute nothing to the loss.
    means = {g: rs[0] if min(rs) == max(rs) else sum(rs) / len(rs) for g, rs in members.items()}
    centred = [float(r) - means[g] for r, g in zip(rewards, group_ids, strict=True)]
    if scale == "none":
        return centred
    if scale == "batch":
        denom = _std([float(r) for r in rewards]) + eps
        return [a / denom for a in centred]
    stds = {g: _std(rs) for g, rs in members.items()}
    return [a / (stds[g] + eps) for a, g in zip(centred, group_ids, strict=True)]


def grpo_token_loss(
    new_logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig,
    ref_logp: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token GRPO loss `[B, T]`, exactly 0 (value and gradient) where `mask` is 0.

    `new_logp`, `old_logp`, `mask` (and `ref_logp`) are `[B, T]`; `adv` is `[B]`
    (one advantage per sequence) or `[B, T]`. The loss is the negated clipped surrogate
    `-min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)` with `r = exp(new - old)`, plus
    `cfg.beta * k3(ref, new)` when `cfg.beta > 0` (then `ref_logp` is required); with
    `cfg.kl_ratio_correction` the k3 term is multiplied by the (unclipped, differentiable) ratio
    `r`, trl's `use_bias_correction_kl`, which makes its gradient the unbiased reverse-KL gradient
    off-policy.
    """
    keep = mask.bool()
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    # Mask before exp: off-policy tokens carry old_logp = 0, and where() keeps their gradient an
    # exact 0 instead of 0 * something that might be inf.
    log_ratio = torch.where(keep, new_logp - old_logp, 0.0)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high)
    loss = -torch.min(ratio * adv, clipped * adv)
    if cfg.beta > 0:
        if ref_logp is None:
            raise ValueError("cfg.beta > 0 needs ref_logp (log-probs under the reference model)")
        diff = torch.where(keep, ref_logp - new_logp, 0.0)
        k3 = torch.exp(diff) - diff - 1.0
        loss = loss + cfg.beta * (k3 * ratio if cfg.kl_ratio_correction else k3)
    return torch.where(keep, loss, 0.0)


def aggregate_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_agg: str,
    n_tokens_total: int,
    n_seqs_total: int,
    max_completion_tokens: int,
) -> torch.Tensor:
    """This micro-batch's share of the full-batch loss.

    `n_tokens_total` / `n_seqs_total` are the masked-token and sequence counts of the whole batch,
    so summing the result over micro-batches gives exactly the full-batch aggregate:
    "token-mean" = sum / n_tokens_total; "seq-mean-token-mean" = sum over sequences of (their
    token mean) / n_seqs_total (a sequence without masked tokens counts as 0);
    "dr_grpo" = sum / (n_seqs_total * max_completion_tokens).
    """
    if loss_agg == "token-mean":
        return per_token.sum() / max(n_tokens_total, 1)
    if loss_agg == "seq-mean-token-mean":
        per_seq = per_token.sum(1) / mask.float().sum(1).clamp(min=1.0)
        return per_seq.sum() / n_seqs_total
    if loss_agg == "dr_grpo":
        return per_token.sum() / (n_seqs_total * max_completion_tokens)
    raise ValueError(f"unknown loss_agg {loss_agg!r}")


class _Chunk(NamedTuple):
    """One micro-batch in `pad_batch`'s layout, on the model's device."""

    idx: list[int]  # the trajectories' positions in the batch
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor  # trained tokens (bool)
    old: torch.Tensor  # sampling log-probs
    adv: torch.Tensor  # one advantage per row
    seqs: list[list[int]]
    lead: list[int] | None  # untrained prefix lengths, for the shared-prefix pass
    is_weight: torch.Tensor | None  # rollout_correction tis: per-token IS weight [B, T]


class GRPOTrainer:
    """Applies GRPO updates to `model` in place; see the module docstring for the maths."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: GRPOConfig,
        pad_token_id: int,
        *,
        total_steps: int | None = None,
    ) -> None:
        """Set up the optimizer, the LR schedule and, when `config.beta > 0`, the reference model.

        The reference (`self.ref_model`) is a frozen deep copy of `model` as it is now, in eval
        mode; with `beta == 0` there is none (`None`) and no memory is spent on it.
        `total_steps` is the number of optimizer steps a decaying schedule spans when
        `config.total_steps` is unset; each `step` call makes `config.num_iterations` of them.
        """
        self.model = model
        self.config = config
        self.pad_token_id = pad_token_id
        self.ref_model: torch.nn.Module | None = None
        if config.beta > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.params = [p for p in model.parameters() if p.requires_grad]
        # Zero-advantage rows run forward only (see the module docstring); False: full backward.
        self.skip_inert = True
        # rollout_correction: per micro-batch (keyed by its trajectories' positions) the trainer's
        # log-probs and the tis weights, set for the duration of one `step`.
        self._correction: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor | None]] | None
        self._correction = None
        # Created once so the Adam moments and the schedule carry over from round to round.
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, weight_decay=config.weight_decay,
            betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_epsilon,
        )
        span = config.total_steps if config.total_steps is not None else total_steps
        if config.lr_scheduler != "constant" and span is None:
            raise ValueError(
                f"lr_scheduler={config.lr_scheduler!r} decays over a known number of "
                "optimizer steps: set grpo.total_steps or pass total_steps to GRPOTrainer"
            )
        self.total_steps = span
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_multiplier(
                s, config.lr_scheduler, config.warmup_steps, span, config.min_lr_ratio
            ),
        )

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken so far (the schedule's position)."""
        return int(self.scheduler.last_epoch)

    def state_dict(self) -> dict[str, Any]:
        """Optimizer and schedule state, and the reference model's weights (None without one).

        The policy's own weights are not included: they belong to the model (see
        `trainers.checkpoint.save_checkpoint`, which stores both). A warm-started second moment
        (`adam_v_warm_start`) is ordinary optimizer state, and it is the state that says the
        warm start happened, so a resumed run does not warm again.
        """
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ref_model": None if self.ref_model is None else self.ref_model.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, into a trainer built with the same config."""
        if (state["ref_model"] is None) != (self.ref_model is None):
            raise ValueError(
                "the checkpoint and this trainer disagree on the reference model (one has "
                "beta > 0, the other beta == 0); resume with the config of the checkpoint"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ref_model is not None:
            self.ref_model.load_state_dict(state["ref_model"])

    @staticmethod
    def _check(trajectories: list[Trajectory], advantages: Sequence[float]) -> None:
        if not trajectories:
            raise ValueError("GRPO step needs at least one trajectory")
        if len(advantages) != len(trajectories):
            raise ValueError(
                f"{len(advantages)} advantages for {len(trajectories)} trajectories; "
                "pass one advantage per trajectory"
            )
        for t in trajectories:
            n = len(t.token_ids)
            if len(t.loss_mask) != n or len(t.logprobs) != n:
                raise ValueError(
                    f"trajectory {t.traj_id}: token_ids ({n}), loss_mask ({len(t.loss_mask)}) "
                    f"and logprobs ({len(t.logprobs)}) must be aligned token for token"
                )

    def loss_masks(self, trajectories: list[Trajectory]) -> list[list[int]]:
        """The trained tokens of each trajectory: its `loss_mask`, or all zeros when
        `mask_truncated_completions` is on and the trajectory was cut by a limit."""
        if not self.config.mask_truncated_completions:
            return [t.loss_mask for t in trajectories]
        return [
            [0] * len(t.loss_mask) if t.finish_reason in TRUNCATED else t.loss_mask
            for t in trajectories
        ]

    def micro_batches(self, n: int) -> list[range]:
        """Index ranges of the forward/backward chunks of an `n`-trajectory batch, as positions in
        the batch sorted by length (see `accumulate_gradients`).

        The batch is cut into `gradient_accumulation_steps` contiguous parts of near-equal size
        (fewer when the batch has fewer trajectories), and a part larger than `micro_batch_size`
        is cut further. The split changes memory and speed, never the gradient.
        """
        cfg = self.config
        parts = min(cfg.gradient_accumulation_steps, n)
        bounds = [k * n // parts for k in range(parts + 1)]
        return [
            range(s, min(s + cfg.micro_batch_size, b))
            for a, b in itertools.pairwise(bounds)
            for s in range(a, b, cfg.micro_batch_size)
        ]

    def _logprobs(self, model: torch.nn.Module, seqs: list[list[int]], lead: list[int] | None,
                  input_ids: torch.Tensor, attention_mask: torch.Tensor, *, entropy: bool) -> Any:
        """Log-probs (and entropies) of a micro-batch in `pad_batch`'s layout: with `lead` (the
        untrained prefix length of each sequence) through the shared-prefix pass, else plainly."""
        amp = self.config.autocast_dtype(input_ids.device)
        if lead is not None:
            return shared_prefix_logprobs(model, seqs, lead, self.pad_token_id,
                                          self.config.temperature, with_entropy=entropy,
                                          autocast_dtype=amp)
        return token_logprobs(model, input_ids, attention_mask, self.config.temperature,
                              with_entropy=entropy, autocast_dtype=amp)

    def _skips_inert(self) -> bool:
        """Whether zero-advantage rows have an exactly zero gradient here and may skip autograd:
        no KL term (`beta == 0`)."""
        return self.skip_inert and self.config.beta == 0

    def _parts(self, trajectories: list[Trajectory],
               advantages: Sequence[float]) -> list[list[int]]:
        """The micro-batches of a pass, as lists of trajectory positions. Rows are sorted by
        length before the split, so each micro-batch pads to a similar length (multi-turn lengths
        vary several-fold); the whole-batch normalisers make the gradient independent of it.
        When `_skips_inert`, the zero-advantage rows are split apart from the others, after
        them, so that they fill forward-only micro-batches of their own."""
        by_length = sorted(range(len(trajectories)), key=lambda i: len(trajectories[i].token_ids))
        classes = [by_length]
        if self._skips_inert():
            classes = [[i for i in by_length if advantages[i] != 0.0],
                       [i for i in by_length if advantages[i] == 0.0]]
        return [[rows[k] for k in part] for rows in classes if rows
                for part in self.micro_batches(len(rows))]

    def _chunks(self, trajectories: list[Trajectory], advantages: Sequence[float],
                masks: list[list[int]], parts: list[list[int]]) -> Iterator[_Chunk]:
        """The micro-batches `parts`, padded and moved to the model's device."""
        cfg = self.config
        device = model_device(self.model)
        for idx in parts:
            chunk = [trajectories[i] for i in idx]
            seqs = [t.token_ids for t in chunk]
            batch = pad_batch(seqs, self.pad_token_id, masks=[masks[i] for i in idx],
                              logprobs=[t.logprobs for t in chunk])
            attention_mask = batch["attention_mask"].to(device)
            old = batch["old_logprobs"].to(device)
            is_weight = None
            if self._correction is not None:
                old, is_weight = self._correction[tuple(idx)]
            yield _Chunk(
                idx=idx,
                input_ids=batch["input_ids"].to(device),
                attention_mask=attention_mask,
                mask=batch["loss_mask"].to(device).bool() & attention_mask.bool(),
                old=old,
                adv=torch.tensor([float(advantages[i]) for i in idx], dtype=torch.float32,
                                 device=device),
                seqs=seqs,
                lead=(prefix_lengths(seqs, [masks[i] for i in idx])
                      if cfg.share_prefix and min(len(s) for s in seqs) >= 2 else None),
                is_weight=is_weight,
            )

    def accumulate_gradients(
        self,
        trajectories: list[Trajectory],
        advantages: Sequence[float],
        ref_cache: dict[int, torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """One pass: zero the grads, then backprop the full-batch loss micro-batch by micro-batch.

        Leaves the summed gradients in `param.grad` (no clipping, no optimizer step) and returns
        this pass's `loss`, `clip_ratio`, `entropy`, `kl`, `n_tokens` (trained tokens) and
        `n_inert` (zero-advantage rows run forward only, see the module docstring).
        Does not change the model's train/eval mode. `ref_cache` (with `beta > 0`): the frozen
        reference model's log-probs per micro-batch, filled on the first pass over a batch and
        read on the later ones (`step` passes one dict to its `num_iterations` passes, as trl
        computes them once per generation batch); the reference never changes, so reusing them
        is exact.
        """
        return self._accumulate(trajectories, advantages, ref_cache)[0]

    def _accumulate(
        self,
        trajectories: list[Trajectory],
        advantages: Sequence[float],
        ref_cache: dict[int, torch.Tensor] | None,
    ) -> tuple[dict[str, float], list[torch.Tensor]]:
        """`accumulate_gradients`, plus the pass's log-probs per micro-batch (detached)."""
        self._check(trajectories, advantages)
        masks = self.loss_masks(trajectories)
        n_tokens = sum(sum(m) for m in masks)
        self.optimizer.zero_grad(set_to_none=True)
        parts = self._parts(trajectories, advantages)
        sums, logps = self._backward(trajectories, advantages, masks, parts, n_tokens, ref_cache)
        denom = max(n_tokens, 1)
        stats = {
            "loss": sums["loss"],
            "clip_ratio": sums["clipped"] / denom,
            "entropy": sums["entropy"] / denom,
            "kl": sums["kl"] / denom,
            "n_tokens": float(n_tokens),
            "n_inert": sums["inert"],
        }
        return stats, logps

    def _backward(
        self,
        trajectories: list[Trajectory],
        advantages: Sequence[float],
        masks: list[list[int]],
        parts: list[list[int]],
        n_tokens: int,
        ref_cache: dict[int, torch.Tensor] | None,
    ) -> tuple[dict[str, float], list[torch.Tensor]]:
        """Backprop each micro-batch of `parts` with the whole batch's normalisers (`n_tokens`
        trained tokens, `len(trajectories)` sequences), adding into `param.grad`. Returns the
        sums of loss, clipped token counts, entropy and k3 to the reference, and each
        micro-batch's log-probs (detached)."""
        cfg = self.config
        sums = dict.fromkeys(("loss", "clipped", "entropy", "kl", "inert"), 0.0)
        logps = []
        skips = self._skips_inert()
        for key, c in enumerate(self._chunks(trajectories, advantages, masks, parts)):
            if skips and not bool(c.adv.any()):
                # Zero advantage, no KL: the loss and its gradient are
                # exactly zero here; the forward is kept for the metrics and the KL guard.
                with torch.no_grad():
                    new, ent = self._logprobs(self.model, c.seqs, c.lead, c.input_ids,
                                              c.attention_mask, entropy=True)
                logps.append(new.detach())
                sums["entropy"] += float(ent[c.mask].sum().item())
                sums["inert"] += len(c.idx)
                continue
            new, ent = self._logprobs(self.model, c.seqs, c.lead, c.input_ids, c.attention_mask,
                                      entropy=True)
            ref = None
            if self.ref_model is not None:
                if ref_cache is not None and key in ref_cache:
                    ref = ref_cache[key]
                else:
                    with torch.no_grad():
                        ref = self._logprobs(self.ref_model, c.seqs, c.lead, c.input_ids,
                                             c.attention_mask, entropy=False)
                    if ref_cache is not None:
                        ref_cache[key] = ref
            adv = c.adv if c.is_weight is None else c.adv.unsqueeze(1) * c.is_weight
            per_token = grpo_token_loss(new, c.old, adv, c.mask, cfg, ref)
            loss = aggregate_loss(per_token, c.mask, cfg.loss_agg, n_tokens, len(trajectories),
                                  cfg.max_completion_tokens)
            loss.backward()
            with torch.no_grad():
                logps.append(new.detach())
                sums["loss"] += float(loss.item())
                ratio = torch.exp(torch.where(c.mask, new - c.old, 0.0))
                a = c.adv.unsqueeze(1)
                # The clipped branch is the one min() picks only in these two cases (as trl).
                hit = ((ratio < 1 - cfg.epsilon_low) & (a < 0)) | (
                    (ratio > 1 + cfg.epsilon_high) & (a > 0)
                )
                sums["clipped"] += float((hit & c.mask).sum().item())
                sums["entropy"] += float(ent[c.mask].sum().item())
                if ref is not None:
                    diff = (ref - new)[c.mask]
                    sums["kl"] += float((torch.exp(diff) - diff - 1.0).sum().item())
        return sums, logps

    def group_second_moment(
        self,
        trajectories: list[Trajectory],
        advantages: Sequence[float],
    ) -> list[torch.Tensor]:
        """The warm start of Adam's second moment (`adam_v_warm_start`), one tensor per parameter.

        With the batch's `n` groups (by `group_id`) and `g_j` group j's share of the full-batch
        gradient (its trajectories' loss with the whole batch's normalisers, so the batch
        gradient is `g = sum_j g_j`), `n * g_j` is an estimate of `g` from one group, and this
        returns `V = mean_j (n * g_j)^2 = n * sum_j g_j^2`, elementwise, unclipped. `V >= g^2`
        (a mean of squares is at least the square of the mean), equal where the groups agree.
        Costs one more forward and backward of the batch, group by group; leaves no gradient.
        """
        cfg = self.config
        self._check(trajectories, advantages)
        masks = self.loss_masks(trajectories)
        n_tokens = sum(sum(m) for m in masks)
        groups: dict[str, list[int]] = defaultdict(list)
        for i, t in enumerate(trajectories):
            groups[t.group_id].append(i)
        second = [torch.zeros_like(p) for p in self.params]
        for members in groups.values():
            if self._skips_inert() and not any(advantages[i] for i in members):
                continue  # an exactly zero gradient: adds nothing to V
            members.sort(key=lambda i: len(trajectories[i].token_ids))
            parts = [members[s:s + cfg.micro_batch_size]
                     for s in range(0, len(members), cfg.micro_batch_size)]
            self.optimizer.zero_grad(set_to_none=True)
            self._backward(trajectories, advantages, masks, parts, n_tokens, None)
            for acc, p in zip(second, self.params, strict=True):
                if p.grad is not None:
                    acc.addcmul_(p.grad, p.grad)
        self.optimizer.zero_grad(set_to_none=True)
        return [acc.mul_(len(groups)) for acc in second]

    def _warm_second_moment(self, second: list[torch.Tensor], grad_norm: torch.Tensor) -> None:
        """Write AdamW's state before its first step so that the step is `lr * g / (sqrt(V) +
        eps)` (plus weight decay) with `g` the clipped gradient now in `param.grad` and `V` the
        `group_second_moment`, clipped alike.

        AdamW's first step computes `v = beta2 * v0 + (1 - beta2) * g^2` and divides by the bias
        correction `1 - beta2`; with `v0 = (1 - beta2) / beta2 * (V - g^2)` that gives exactly
        `V`. The step count stays 0 and the first moment 0, so both bias corrections go on as
        for an ordinary first step: `V` counts as the first step's observation of `g^2` and later
        gradients enter with Adam's usual weights.
        """
        b2 = self.config.adam_beta2
        # clip_grad_norm_'s factor, which the gradients in param.grad were just multiplied by.
        coef = torch.clamp(self.config.max_grad_norm / (grad_norm + 1e-6), max=1.0)
        for p, v in zip(self.params, second, strict=True):
            if p.grad is None:
                continue
            excess = (v * coef**2 - p.grad.square()).clamp_(min=0.0)
            self.optimizer.state[p] = {
                "step": torch.tensor(0.0),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": excess.mul_((1.0 - b2) / b2),
            }

    def _step_kl(self, trajectories: list[Trajectory], advantages: Sequence[float],
                 before: list[torch.Tensor]) -> float:
        """Mean k3 estimate of KL(before || now) over the batch's trained tokens: `before` holds
        each micro-batch's log-probs from before the step, `exp(d) - d - 1` with `d = now -
        before` per token (the tokens were sampled from the policy before the step)."""
        masks = self.loss_masks(trajectories)
        total = 0.0
        with torch.no_grad():
            parts = self._parts(trajectories, advantages)
            chunks = self._chunks(trajectories, advantages, masks, parts)
            for c, prev in zip(chunks, before, strict=True):
                now = self._logprobs(self.model, c.seqs, c.lead, c.input_ids, c.attention_mask,
                                     entropy=False)
                d = (now - prev)[c.mask]
                total += float((torch.exp(d) - d - 1.0).sum().item())
        return total / max(sum(sum(m) for m in masks), 1)

    def _guarded_step(self, take: Callable[[float], None], kl_of_step: Callable[[], float],
                      threshold: float) -> tuple[float, str]:
        """`take(lr_scale)` makes the optimizer step; `kl_of_step()` measures it. Returns the
        first attempt's KL and what was kept: "taken", "halved" or "undone". Undoing restores the
        parameters and the optimizer state (moments and step counts) bit for bit."""
        params = [p.detach().clone() for p in self.params]
        state = copy.deepcopy(self.optimizer.state_dict())

        def restore() -> None:
            with torch.no_grad():
                for p, saved in zip(self.params, params, strict=True):
                    p.copy_(saved)
            # A copy each time: load_state_dict keeps the tensors it is given, and the retaken
            # step updates them in place.
            self.optimizer.load_state_dict(copy.deepcopy(state))

        take(1.0)
        kl = kl_of_step()
        if kl <= threshold:
            return kl, "taken"
        restore()
        if self.config.kl_guard_action == "halve":
            take(0.5)
            if kl_of_step() <= threshold:
                return kl, "halved"
            restore()
        return kl, "undone"

    def update(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """The loop's entry point (`trainers.base.PolicyTrainer`): group-normalised advantages
        of the batch's rewards (`scale_rewards`), then `step`; an empty batch takes no step.
        `learning_rate` is the rate the next step will use."""
        metrics: dict[str, float] = {}
        if trajectories:
            advantages = group_advantages([t.reward for t in trajectories],
                                          [t.group_id for t in trajectories],
                                          scale=self.config.scale_rewards)
            metrics = self.step(trajectories, advantages)
        metrics["learning_rate"] = float(self.scheduler.get_last_lr()[0])
        return metrics

    def _rollout_correction(self, trajectories: list[Trajectory], advantages: Sequence[float],
                            masks: list[list[int]]) -> dict[str, float]:
        """Recompute the batch's 'old' log-probs with the trainer (no grad, the model as it is
        before the step) and, for `tis`, the truncated IS weights; sets `self._correction` for
        `_chunks`. Returns `rollout/logprob_diff` (mean |trainer - engine| over trained tokens)
        and, for `tis`, `rollout/is_weight` (mean weight) and `rollout/is_capped` (share of
        trained tokens at the cap)."""
        cfg = self.config
        correction: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor | None]] = {}
        diff = capped = weight = 0.0
        n = 0
        with torch.no_grad():
            parts = self._parts(trajectories, advantages)
            for c in self._chunks(trajectories, advantages, masks, parts):
                new = self._logprobs(self.model, c.seqs, c.lead, c.input_ids, c.attention_mask,
                                     entropy=False).float()
                new = torch.where(c.mask, new, 0.0)
                gap = torch.where(c.mask, new - c.old, 0.0)
                w = None
                if cfg.rollout_correction == "tis":
                    w = torch.clamp(torch.exp(gap), max=cfg.rollout_is_cap)
                    weight += float(w[c.mask].sum().item())
                    capped += float((w[c.mask] >= cfg.rollout_is_cap).sum().item())
                diff += float(gap[c.mask].abs().sum().item())
                n += int(c.mask.sum().item())
                correction[tuple(c.idx)] = (new, w)
        self._correction = correction
        out = {"rollout/logprob_diff": diff / max(n, 1)}
        if cfg.rollout_correction == "tis":
            out.update({"rollout/is_weight": weight / max(n, 1),
                        "rollout/is_capped": capped / max(n, 1)})
        return out

    def step(self, trajectories: list[Trajectory], advantages: Sequence[float]) -> dict[str, float]:
        """One GRPO update on a batch: `num_iterations` passes, one optimizer step per pass.

        `advantages[i]` belongs to `trajectories[i]` (see `group_advantages`). Returns the mean
        over passes of `loss`, `clip_ratio`, `entropy` (over trained tokens) and `grad_norm`
        (before clipping), `kl` when `beta > 0`, plus `lr` (of the first pass), `n_tokens`
        (trained tokens in the batch), `n_masked_truncated` (trajectories dropped by
        `mask_truncated_completions`), `n_inert` (zero-advantage trajectories that ran forward
        only, see the module docstring) and `seconds`. A batch without any trained token changes
        nothing, the schedule included. The model is in train mode during the update and is put
        back in the mode it was in (eval, for rollouts).

        Options: with `adam_v_warm_start`, the first optimizer step of the optimizer's life (its
        state empty) is warm-started (`group_second_moment`). With `kl_guard`, each optimizer
        step is followed by a no-grad forward of the batch; `guard/kl` (mean over passes of the
        first attempt's KL), `guard/undone` and `guard/halved` (steps undone or kept at half the
        learning rate) are added. An undone step still advances the LR schedule, which counts
        passes.
        """
        cfg = self.config
        self._check(trajectories, advantages)
        t0 = time.perf_counter()
        masks = self.loss_masks(trajectories)
        n_tokens = sum(sum(m) for m in masks)
        dropped = sum(
            1
            for t in trajectories
            if cfg.mask_truncated_completions and t.finish_reason in TRUNCATED
        )
        info = {
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "n_tokens": float(n_tokens),
            "n_masked_truncated": float(dropped),
            "n_inert": 0.0,
        }
        totals = {"loss": 0.0, "clip_ratio": 0.0, "entropy": 0.0, "kl": 0.0, "grad_norm": 0.0}
        guard = {"guard/kl": 0.0, "guard/undone": 0.0, "guard/halved": 0.0}
        if n_tokens == 0:
            out = {k: v for k, v in totals.items() if k != "kl" or cfg.beta > 0}
            if cfg.kl_guard is not None:
                out.update(guard)
            return {**out, **info, "seconds": time.perf_counter() - t0}
        was_training = self.model.training
        self.model.train()
        ref_cache: dict[int, torch.Tensor] = {}
        try:
            if cfg.rollout_correction != "none":
                info.update(self._rollout_correction(trajectories, advantages, masks))
            for _ in range(cfg.num_iterations):
                second = None
                if cfg.adam_v_warm_start and not any(self.optimizer.state.values()):
                    second = self.group_second_moment(trajectories, advantages)
                stats, before = self._accumulate(trajectories, advantages, ref_cache)
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)

                def take(lr_scale: float, second: list[torch.Tensor] | None = second,
                         grad_norm: torch.Tensor = grad_norm) -> None:
                    if second is not None:
                        self._warm_second_moment(second, grad_norm)
                    lrs = [g["lr"] for g in self.optimizer.param_groups]
                    for g in self.optimizer.param_groups:
                        g["lr"] = g["lr"] * lr_scale
                    self.optimizer.step()
                    for g, lr in zip(self.optimizer.param_groups, lrs, strict=True):
                        g["lr"] = lr

                if cfg.kl_guard is None:
                    take(1.0)
                else:
                    kl, kept = self._guarded_step(
                        take, functools.partial(self._step_kl, trajectories, advantages, before),
                        cfg.kl_guard)
                    guard["guard/kl"] += kl / cfg.num_iterations
                    guard["guard/undone"] += kept == "undone"
                    guard["guard/halved"] += kept == "halved"
                self.scheduler.step()
                for k in totals:
                    if k != "grad_norm":
                        totals[k] += stats[k]
                totals["grad_norm"] += float(grad_norm.item())
                info["n_inert"] = stats["n_inert"]
        finally:
            self._correction = None
            self.optimizer.zero_grad(set_to_none=True)
            self.model.train(was_training)
        metrics = {k: v / cfg.num_iterations for k, v in totals.items()}
        if cfg.beta == 0:
            del metrics["kl"]
        if cfg.kl_guard is not None:
            metrics.update(guard)
        return {**metrics, **info, "seconds": time.perf_counter() - t0}
