"""Batching and log-prob helpers shared by the SFT and GRPO trainers.

Design: sequences are token-in/token-out lists (see `sentinel.types.Trajectory`), so batching is
plain right-padding, and every per-token quantity is aligned with `input_ids`: column `i` is about
token `i` (its log-prob given the prefix `[:i]`), never about the logit row that predicts it. That
keeps masks, stored sampling log-probs and fresh log-probs in one coordinate system and avoids
off-by-one shifts at the call sites.

Left out: left-padding, packing several sequences into one row, and chunking along the sequence
(the full `[B, T, V]` logits of one forward pass are materialised; only the softmax work after it
is done row by row to keep temporaries small).
"""

from __future__ import annotations

from typing import Literal, overload

import torch


def pad_batch(
    seqs: list[list[int]],
    pad_id: int,
    masks: list[list[int]] | None = None,
    logprobs: list[list[float]] | None = None,
) -> dict[str, torch.Tensor]:
    """Right-pad `seqs` to the longest one.

    Returns `input_ids` and `attention_mask` (int64, `[B, T]`), plus `loss_mask` (int64, 0 on
    padding) when `masks` is given and `old_logprobs` (float32, 0.0 on padding) when `logprobs`
    is given. `masks[b]` and `logprobs[b]` must have the same length as `seqs[b]`.
    """
    if not seqs:
        raise ValueError("pad_batch needs at least one sequence")
    for name, rows in (("masks", masks), ("logprobs", logprobs)):
        if rows is None:
            continue
        if len(rows) != len(seqs):
            raise ValueError(f"{name} has {len(rows)} rows but there are {len(seqs)} sequences")
        for b, (row, seq) in enumerate(zip(rows, seqs, strict=True)):
            if len(row) != len(seq):
                raise ValueError(
                    f"{name}[{b}] has length {len(row)} but seqs[{b}] has length {len(seq)}; "
                    "they must be aligned token for token"
                )
    width = max(len(s) for s in seqs)
    if width == 0:
        raise ValueError("pad_batch got only empty sequences")

    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, seq in enumerate(seqs):
        input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[b, : len(seq)] = 1
    out = {"input_ids": input_ids, "attention_mask": attention_mask}
    if masks is not None:
        loss_mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for b, row in enumerate(masks):
            loss_mask[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        out["loss_mask"] = loss_mask
    if logprobs is not None:
        old = torch.zeros((len(seqs), width), dtype=torch.float32)
        for b, row in enumerate(logprobs):
            old[b, : len(row)] = torch.tensor(row, dtype=torch.float32)
        out["old_logprobs"] = old
    return out


@overload
def logprobs_from_logits(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: float = ...,
    with_entropy: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def logprobs_from_logits(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: float = ...,
    *,
    with_entropy: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor]: ...


def logprobs_from_logits(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of `input_ids` under `softmax(logits / temperature)`.

    `logits` is `[B, T, V]` as returned by a causal LM on `input_ids` (`[B, T]`): row `t`
    predicts token `t + 1`. The result is `[B, T]` float32 with column `i` equal to
    `log p(input_ids[:, i] | input_ids[:, :i])` and column 0 equal to 0 (nothing predicts it).
    Differentiable w.r.t. `logits`.

    With `with_entropy=True` also returns the `[B, T]` entropy of the distribution that predicted
    token `i` (column 0 is 0). The entropy is a detached metric, not a loss term.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    batch, _, _ = logits.shape
    targets = input_ids[:, 1:]
    logp_rows: list[torch.Tensor] = []
    ent_rows: list[torch.Tensor] = []
    # The target's log-prob is `logit - logsumexp`, which never materialises a [T, V] log_softmax;
    # going row by row bounds the temporaries (under no_grad, one float32 [T, V] copy at a time).
    for b in range(batch):
        row = logits[b, :-1].float() / temperature
        lse = torch.logsumexp(row, dim=-1)
        logp_rows.append(row.gather(-1, targets[b].unsqueeze(-1)).squeeze(-1) - lse)
        if with_entropy:
            with torch.no_grad():
                probs = torch.softmax(row, dim=-1)
                ent_rows.append(lse - (probs * row).sum(-1))
    zero = torch.zeros((batch, 1), dtype=torch.float32, device=logits.device)
    logp = torch.cat([zero, torch.stack(logp_rows)], dim=1)
    if not with_entropy:
        return logp
    return logp, torch.cat([zero, torch.stack(ent_rows)], dim=1)


@overload
def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = ...,
    with_entropy: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = ...,
    *,
    with_entropy: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor]: ...


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Run `model` and return `[B, T]` log-probs of `input_ids` (see `logprobs_from_logits`).

    `model` is a Hugging Face causal LM (anything whose output has `.logits`). Columns where
    `attention_mask` is 0 (right padding) are set to 0, as is column 0. Gradients flow unless the
    caller wraps the call in `torch.no_grad()`.
    """
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    valid = attention_mask.bool()
    if with_entropy:
        logp, ent = logprobs_from_logits(out.logits, input_ids, temperature, with_entropy=True)
        return torch.where(valid, logp, 0.0), torch.where(valid, ent, 0.0)
    logp = logprobs_from_logits(out.logits, input_ids, temperature)
    return torch.where(valid, logp, 0.0)


def model_device(model: torch.nn.Module) -> torch.device:
    """Device of the model's first parameter (where batches must be moved)."""
    return next(model.parameters()).device
