"""Batching and log-prob helpers shared by the SFT and GRPO trainers.

Design: sequences are token-in/token-out lists (see `sentinel.types.Trajectory`), so batching is
plain right-padding, and every per-token quantity is aligned with `input_ids`: column `i` is about
token `i` (its log-prob given the prefix `[:i]`), never about the logit row that predicts it. That
keeps masks, stored sampling log-probs and fresh log-probs in one coordinate system and avoids
off-by-one shifts at the call sites.

`pack_batch` is the alternative to padding for SFT: several examples share one row, each with
position ids that restart at 0, and `attention_mask=None`, so transformers (5.x) derives a
block-diagonal causal mask from the position ids (`masking_utils.find_packed_sequence_indices`;
flash-attention reads the same position ids as `cu_seqlens`) and no token attends across examples.

`lr_multiplier` is the one learning-rate schedule (warm-up, then constant, linear or cosine decay)
both trainers use through `torch.optim.lr_scheduler.LambdaLR`.

Left out: left-padding, and chunking along the sequence (the full `[B, T, V]` logits of one forward
pass are materialised; only the softmax work after it is done in blocks of rows to keep
temporaries small).
"""

from __future__ import annotations

import contextlib
import math
from typing import Literal, overload

import torch

LOGIT_BLOCK = 1 << 24  # float32 elements of logits handled at once by logprobs_from_logits


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
    batch, width, vocab = logits.shape
    targets = input_ids[:, 1:]
    logp_rows: list[torch.Tensor] = []
    ent_rows: list[torch.Tensor] = []
    # The target's log-prob is `logit - logsumexp`, which never materialises a [T, V] log_softmax;
    # going a block of rows at a time bounds the temporaries (about `LOGIT_BLOCK` float32
    # elements: one row of a real vocabulary, the whole batch of the tiny one).
    block = max(1, LOGIT_BLOCK // max(1, width * vocab))
    for b in range(0, batch, block):
        rows = logits[b:b + block, :-1].float() / temperature
        lse = torch.logsumexp(rows, dim=-1)
        logp_rows.append(rows.gather(-1, targets[b:b + block].unsqueeze(-1)).squeeze(-1) - lse)
        if with_entropy:
            with torch.no_grad():
                probs = torch.softmax(rows, dim=-1)
                ent_rows.append(lse - (probs * rows).sum(-1))
    zero = torch.zeros((batch, 1), dtype=torch.float32, device=logits.device)
    logp = torch.cat([zero, torch.cat(logp_rows)], dim=1)
    if not with_entropy:
        return logp
    return logp, torch.cat([zero, torch.cat(ent_rows)], dim=1)


@overload
def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = ...,
    with_entropy: Literal[False] = ...,
    autocast_dtype: torch.dtype | None = ...,
) -> torch.Tensor: ...


@overload
def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = ...,
    *,
    with_entropy: Literal[True],
    autocast_dtype: torch.dtype | None = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    autocast_dtype: torch.dtype | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Run `model` and return `[B, T]` log-probs of `input_ids` (see `logprobs_from_logits`).

    `model` is a Hugging Face causal LM (anything whose output has `.logits`). Columns where
    `attention_mask` is 0 (right padding) are set to 0, as is column 0. Gradients flow unless the
    caller wraps the call in `torch.no_grad()`. With `autocast_dtype` (e.g. `torch.bfloat16`) the
    model's forward runs under `torch.autocast` on the device of `input_ids`; the softmax work
    after it is float32 either way.
    """
    with autocast(input_ids.device, autocast_dtype):
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    valid = attention_mask.bool()
    if with_entropy:
        logp, ent = logprobs_from_logits(out.logits, input_ids, temperature, with_entropy=True)
        return torch.where(valid, logp, 0.0), torch.where(valid, ent, 0.0)
    logp = logprobs_from_logits(out.logits, input_ids, temperature)
    return torch.where(valid, logp, 0.0)


def prefix_lengths(seqs: list[list[int]], masks: list[list[int]]) -> list[int]:
    """Per sequence, the length of its untrained lead: the tokens before the first trained one
    (the prompt, for a rollout), kept within [1, len - 1] (token 0 is never predicted, so never
    trained). Sequences with equal leads can share one forward over it. Needs len >= 2."""
    out = []
    for seq, mask in zip(seqs, masks, strict=True):
        if len(seq) < 2:
            raise ValueError("prefix sharing needs sequences of at least 2 tokens")
        first = next((i for i, m in enumerate(mask) if m), len(seq))
        out.append(min(max(first, 1), len(seq) - 1))
    return out


def cache_kwarg(model: torch.nn.Module) -> str:
    """The keyword `model.forward` takes its key/value cache by: `cache` (transformers >= 5.25)
    or `past_key_values` (earlier)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def shared_prefix_logprobs(
    model: torch.nn.Module,
    seqs: list[list[int]],
    prefix_lens: list[int],
    pad_id: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    autocast_dtype: torch.dtype | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs` for sequences whose first `prefix_lens[b]` tokens repeat across the batch
    (the G samples of a GRPO group share their prompt): each distinct prefix goes through the
    model once, its key/value cache is fanned out to the sequences that share it, and only the
    rest of each sequence is run on top. Gradients flow through the shared cache into the prefix
    forward, summed over the sharers, so loss and gradients equal the unshared computation's
    (tests check both to 1e-5) while the prefix costs one forward/backward instead of G.

    Returns `[B, T]` tensors in `pad_batch`'s right-padded layout: columns at or after
    `prefix_lens[b]` hold the log-probs (and entropies); columns before it, padding and column 0
    are 0 (the caller's loss mask must be 0 there, as `prefix_lens` makes it).
    """
    from transformers import DynamicCache

    device = model_device(model)
    n = len(seqs)
    keys: dict[tuple[int, ...], int] = {}
    which = [keys.setdefault(tuple(seq[:p]), len(keys)) for seq, p in zip(seqs, prefix_lens,
                                                                           strict=True)]
    prefixes = list(keys)
    width = max(len(p) for p in prefixes)
    # Prefixes left-padded (they end in the same column), the rest right-padded after them.
    pre_ids = torch.full((len(prefixes), width), pad_id, dtype=torch.long)
    pre_mask = torch.zeros((len(prefixes), width), dtype=torch.long)
    for u, prefix in enumerate(prefixes):
        pre_ids[u, width - len(prefix):] = torch.tensor(prefix, dtype=torch.long)
        pre_mask[u, width - len(prefix):] = 1
    rests = [seq[p:] for seq, p in zip(seqs, prefix_lens, strict=True)]
    rest_w = max(len(r) for r in rests)
    rest_ids = torch.full((n, rest_w), pad_id, dtype=torch.long)
    rest_mask = torch.zeros((n, rest_w), dtype=torch.long)
    for b, rest in enumerate(rests):
        rest_ids[b, : len(rest)] = torch.tensor(rest, dtype=torch.long)
        rest_mask[b, : len(rest)] = 1
    index = torch.tensor(which, dtype=torch.long, device=device)
    pre_ids, pre_mask = pre_ids.to(device), pre_mask.to(device)
    rest_ids, rest_mask = rest_ids.to(device), rest_mask.to(device)
    plen = torch.tensor(prefix_lens, dtype=torch.long, device=device)
    if min(prefix_lens) < 1:
        raise ValueError("every prefix needs at least one token (see prefix_lengths)")
    with autocast(device, autocast_dtype):
        pre_pos = (pre_mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=getattr(model, "config", None))
        # transformers 5.25 renamed `past_key_values` to `cache`; an unknown name is swallowed
        # by **kwargs (silently no cache), so ask the model which one it takes.
        kw = {cache_kwarg(model): cache}
        pre = model(input_ids=pre_ids, attention_mask=pre_mask, position_ids=pre_pos,
                    use_cache=True, logits_to_keep=1, **kw)
        cache.batch_select_indices(index)
        last = pre.logits[:, -1].index_select(0, index)  # predicts each rest's first token
        mask = torch.cat([pre_mask.index_select(0, index), rest_mask], dim=1)
        out = model(input_ids=rest_ids, attention_mask=mask,
                    position_ids=plen[:, None] + torch.arange(rest_w, device=device),
                    use_cache=True, **kw)
        logits = torch.cat([last[:, None], out.logits[:, :-1]], dim=1)
    # logits[b, j] predicts rests[b][j]: reuse logprobs_from_logits on a one-step shift.
    shifted = torch.cat([rest_ids[:, :1], rest_ids], dim=1)
    padded = torch.cat([logits, logits[:, -1:]], dim=1)
    res = logprobs_from_logits(padded, shifted, temperature, with_entropy=with_entropy)
    cols = [r[:, 1:] for r in (res if with_entropy else (res,))]
    total = max(len(seq) for seq in seqs)
    where = (plen[:, None] + torch.arange(rest_w, device=device)).clamp(max=total + rest_w - 1)
    valid = rest_mask.bool()
    placed = []
    for col in cols:
        full = torch.zeros((n, total + rest_w), dtype=col.dtype, device=device)
        full = full.scatter(1, where, torch.where(valid, col, 0.0))
        placed.append(full[:, :total])
    return (placed[0], placed[1]) if with_entropy else placed[0]


def model_device(model: torch.nn.Module) -> torch.device:
    """Device of the model's first parameter (where batches must be moved)."""
    return next(model.parameters()).device


def autocast(
    device: torch.device, dtype: torch.dtype | None
) -> contextlib.AbstractContextManager[object]:
    """`torch.autocast(device.type, dtype)`, or a no-op context when `dtype` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def lr_multiplier(
    step: int,
    schedule: str,
    warmup_steps: int,
    total_steps: int | None,
    min_lr_ratio: float = 0.0,
) -> float:
    """LR multiplier for optimizer step `step` (0-based): linear warm-up, then the schedule.

    Warm-up: `(step + 1) / warmup_steps` for the first `warmup_steps` steps. Then "constant"
    stays at 1; "linear" and "cosine" decay from 1 at step `warmup_steps` to `min_lr_ratio` at
    `total_steps` and stay there after it (they need `total_steps`); the floor is veRL's
    `min_lr_ratio` (transformers' `cosine_with_min_lr`).

    >>> [round(lr_multiplier(s, "cosine", 2, 6), 3) for s in range(7)]
    [0.5, 1.0, 1.0, 0.854, 0.5, 0.146, 0.0]
    >>> [lr_multiplier(s, "linear", 0, 4) for s in range(5)]
    [1.0, 0.75, 0.5, 0.25, 0.0]
    >>> [lr_multiplier(s, "constant", 2, None) for s in range(3)]
    [0.5, 1.0, 1.0]
    >>> [round(lr_multiplier(s, "cosine", 0, 2, min_lr_ratio=0.1), 3) for s in range(4)]
    [1.0, 0.55, 0.1, 0.1]
    """
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError(f"the {schedule!r} schedule decays until total_steps, which is unset")
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - progress)
    if schedule == "cosine":
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {schedule!r}; use constant, linear or cosine")


def pack_batch(
    seqs: list[list[int]], masks: list[list[int]], pad_id: int, max_seq_len: int
) -> dict[str, torch.Tensor]:
    """Pack examples into rows of at most `max_seq_len` tokens (first-fit, longest first).

    Returns `input_ids`, `position_ids` (restarting at 0 for each example; the right padding of a
    row counts as one more segment of its own), `loss_mask` (the example's mask, 0 on padding and
    on each example's first token, which the previous example's last logit must not be scored
    against) and `attention_mask` (1 on real tokens; for counting only: the model must get
    `attention_mask=None` and `use_cache=False`, so that it derives the block-diagonal mask from
    `position_ids`; with a cache, transformers falls back to a plain causal mask). An
    example longer than `max_seq_len` gets a row of its own, uncut. All `[R, W]` int64.
    """
    if not seqs:
        raise ValueError("pack_batch needs at least one sequence")
    if len(masks) != len(seqs) or any(len(m) != len(s) for m, s in zip(masks, seqs, strict=True)):
        raise ValueError("masks must be aligned token for token with seqs")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(seqs)), key=lambda i: -len(seqs[i])):
        n = len(seqs[i])
        slot = next((r for r, free in enumerate(room) if free >= n), None)
        if slot is None:
            rows.append([i])
            room.append(max_seq_len - n)
        else:
            rows[slot].append(i)
            room[slot] -= n
    width = max(sum(len(seqs[i]) for i in row) for row in rows)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            n = len(seqs[i])
            input_ids[r, at : at + n] = torch.tensor(seqs[i], dtype=torch.long)
            position_ids[r, at : at + n] = torch.arange(n)
            loss_mask[r, at + 1 : at + n] = torch.tensor(masks[i][1:], dtype=torch.long)
            attention_mask[r, at : at + n] = 1
            at += n
        position_ids[r, at:] = torch.arange(width - at)
    return {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "loss_mask": loss_mask,
        "attention_mask": attention_mask,
    }
