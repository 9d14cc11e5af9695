"""Supervised fine-tuning on masked token sequences (the warm-start before RL).

Design: each example is `(token_ids, loss_mask)` in the same token-in/token-out form as a
`Trajectory`; the loss is next-token cross-entropy on the positions whose mask is 1, averaged over
all such tokens in the batch (a token mean, so long answers weigh more than short ones, as in
nanochat/trl). Batches are drawn by shuffling the dataset once per epoch with a seeded
`torch.Generator`, so a run is reproducible. AdamW with linear warm-up then cosine decay to
`min_lr_ratio * lr` (0 by default), and gradient-norm clipping.

Packing (`pack`, on by default): a step's examples are packed into rows of up to `max_seq_len`
tokens (`trainers.common.pack_batch`) with position ids restarting per example and no attention
across examples, instead of each being right-padded to the longest one. The loss of a step is the
same either way (the test checks it to 1e-5); packing only removes padding work. The batch is
still `batch_size` examples, so packing changes the speed, not the optimisation.

`bf16`: the forward under bfloat16 autocast (weights and AdamW float32). Left out: gradient
accumulation, evaluation, checkpointing and length bucketing;
`train()` is one self-contained run (a fresh optimizer and schedule per call).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from trainers.common import autocast, lr_multiplier, model_device, pack_batch, pad_batch
from trainers.config import SFTConfig  # re-exported: the config lives there

__all__ = ["SFTConfig", "SFTTrainer", "batch_loss", "sft_loss"]


def sft_loss(
    logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """Token-mean next-token cross-entropy over positions with `loss_mask == 1`.

    `loss_mask` is aligned with `input_ids` (1 = this token is a target), so logit row `t` is
    scored against token `t + 1` with weight `loss_mask[:, t + 1]`; a mask on token 0 is ignored
    because nothing predicts it. Returns `(loss, n_target_tokens)`; the loss is 0 (with a zero
    gradient) when there are no targets.
    """
    targets = input_ids[:, 1:]
    scored = loss_mask[:, 1:].bool()
    n = int(scored.sum().item())
    # Only the scored rows of the logits are made float32 and soft-maxed (a [B, T, V] float32
    # copy costs ~0.8 GB for 8 x 512 tokens of a 49k vocabulary); the others get no gradient.
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1][scored].float(), targets[scored], reduction="sum")
    loss = ce / max(n, 1)
    return loss, n


def batch_loss(
    model: torch.nn.Module,
    examples: list[tuple[list[int], list[int]]],
    pad_token_id: int,
    pack: bool,
    max_seq_len: int,
    autocast_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, dict[str, int]]:
    """Forward `examples` (packed or right-padded) and return `(sft_loss, counts)`.

    `counts` has `targets` (scored tokens), `tokens` (real tokens) and `positions` (the rows'
    total width, padding included). The loss is the same packed or not.
    """
    device = model_device(model)
    with autocast(device, autocast_dtype):
        return _batch_loss(model, examples, pad_token_id, pack, max_seq_len, device)


def _batch_loss(model: torch.nn.Module, examples: list[tuple[list[int], list[int]]],
                pad_token_id: int, pack: bool, max_seq_len: int,
                device: torch.device) -> tuple[torch.Tensor, dict[str, int]]:
    seqs = [ids for ids, _ in examples]
    masks = [mask for _, mask in examples]
    if pack:
        batch = pack_batch(seqs, masks, pad_token_id, max_seq_len)
        input_ids = batch["input_ids"].to(device)
        # No attention_mask and no cache: only then does transformers derive the block-diagonal
        # mask from the position ids (with a cache it silently falls back to plain causal).
        out = model(
            input_ids=input_ids, position_ids=batch["position_ids"].to(device), use_cache=False
        )
    else:
        batch = pad_batch(seqs, pad_token_id, masks=masks)
        input_ids = batch["input_ids"].to(device)
        out = model(
            input_ids=input_ids, attention_mask=batch["attention_mask"].to(device), use_cache=False
        )
    loss, n_targets = sft_loss(out.logits, input_ids, batch["loss_mask"].to(device))
    counts = {
        "targets": n_targets,
        "tokens": int(batch["attention_mask"].sum().item()),
        "positions": int(batch["attention_mask"].numel()),
    }
    return loss, counts


class SFTTrainer:
    """Masked-token SFT of a Hugging Face causal LM (updated in place)."""

    def __init__(self, model: torch.nn.Module, config: SFTConfig, pad_token_id: int) -> None:
        self.model = model
        self.config = config
        self.pad_token_id = pad_token_id

    def _batches(self, n: int) -> Iterator[list[int]]:
        """Endless stream of index batches: a fresh seeded permutation per epoch.

        A batch never spans two epochs; when `batch_size > n` every batch is the whole dataset.
        """
        gen = torch.Generator().manual_seed(self.config.seed)
        size = min(self.config.batch_size, n)
        while True:
            perm = torch.randperm(n, generator=gen).tolist()
            for start in range(0, n - size + 1, size):
                yield perm[start : start + size]

    def train(
        self,
        examples: list[tuple[list[int], list[int]]],
        on_step: Callable[[int, dict[str, float]], None] | None = None,
    ) -> dict[str, float]:
        """Run `config.steps` optimizer steps on `examples` (`(token_ids, loss_mask)` pairs).

        `on_step(step, metrics)` is called after every step (1-based `step`) with `loss` (the
        batch's masked token-mean CE before the update), `lr`, `grad_norm` (before clipping),
        `n_tokens` (targets in the batch), `pad_fraction` (share of the batch's positions that are
        padding) and `tokens_per_s` (non-pad tokens processed per second so far). Returns the last
        step's metrics plus `steps` and `seconds`; with `steps == 0` the model is untouched and
        `loss` is NaN. The model's train/eval mode is restored.
        """
        cfg = self.config
        if not examples:
            raise ValueError("SFTTrainer.train needs at least one example")
        for i, (ids, mask) in enumerate(examples):
            if len(ids) != len(mask):
                raise ValueError(
                    f"example {i}: token_ids has {len(ids)} tokens but loss_mask has {len(mask)}"
                )
        if not any(any(mask[1:]) for _, mask in examples):
            raise ValueError(
                "no example has a loss_mask == 1 token after position 0: nothing to learn"
            )

        metrics: dict[str, float] = {"loss": float("nan"), "tokens_per_s": 0.0}
        if cfg.steps == 0:
            return {**metrics, "steps": 0.0, "seconds": 0.0}

        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda s: lr_multiplier(s, "cosine", cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio),
        )
        was_training = self.model.training
        self.model.train()
        batches = self._batches(len(examples))
        start = time.perf_counter()
        seen_tokens = 0
        try:
            for step in range(1, cfg.steps + 1):
                idx = next(batches)
                loss, counts = batch_loss(
                    self.model,
                    [examples[i] for i in idx],
                    self.pad_token_id,
                    cfg.pack,
                    cfg.max_seq_len,
                    cfg.autocast_dtype(model_device(self.model)),
                )
                lr = optimizer.param_groups[0]["lr"]
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                optimizer.step()
                schedule.step()
                seen_tokens += counts["tokens"]
                elapsed = time.perf_counter() - start
                metrics = {
                    "loss": float(loss.item()),
                    "lr": float(lr),
                    "grad_norm": float(grad_norm.item()),
                    "n_tokens": float(counts["targets"]),
                    "pad_fraction": 1.0 - counts["tokens"] / counts["positions"],
                    "tokens_per_s": seen_tokens / max(elapsed, 1e-9),
                }
                if on_step is not None:
                    on_step(step, metrics)
        finally:
            self.model.train(was_training)
        return {**metrics, "steps": float(cfg.steps), "seconds": time.perf_counter() - start}
