"""Tests for `trainers` on a tiny real Llama (no mocks): maths checked by hand, then behaviour."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path

import numpy as np
import pydantic
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sentinel.types import Trajectory
from trainers import (
    GRPOConfig,
    GRPOTrainer,
    SFTConfig,
    SFTTrainer,
    aggregate_loss,
    batch_loss,
    group_advantages,
    grpo_token_loss,
    load_checkpoint,
    logprobs_from_logits,
    lr_multiplier,
    pack_batch,
    pad_batch,
    save_checkpoint,
    sft_loss,
    token_logprobs,
)
from trainers.common import prefix_lengths, shared_prefix_logprobs

PAD = 0
VOCAB = 64


def tiny_llama(seed: int = 0, attn: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def model() -> LlamaForCausalLM:
    return tiny_llama()


def current_logprobs(model: torch.nn.Module, ids: list[int], temperature: float) -> list[float]:
    """Sampling-style log-probs of `ids` under `model` now (what a rollout would have stored)."""
    with torch.no_grad():
        lp = token_logprobs(
            model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), temperature
        )
    return lp[0].tolist()


def make_traj(
    model: torch.nn.Module,
    ids: list[int],
    mask: list[int],
    temperature: float,
    group_id: str = "g",
    finish_reason: str = "answer",
) -> Trajectory:
    lp = current_logprobs(model, ids, temperature)
    return Trajectory(
        task_id="t",
        messages=[],
        token_ids=ids,
        loss_mask=mask,
        logprobs=[x if m else 0.0 for x, m in zip(lp, mask, strict=True)],
        steps=[],
        finish_reason=finish_reason,
        group_id=group_id,
    )


def varied_batch(model: torch.nn.Module, temperature: float, n: int = 8) -> list[Trajectory]:
    """`n` two-turn trajectories of different lengths: prompt, turn, observation, turn."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        parts = [(3 + i % 3, 0), (2 + i % 2, 1), (3, 0), (1 + i % 4, 1)]
        ids: list[int] = []
        mask: list[int] = []
        for length, m in parts:
            ids += torch.randint(1, VOCAB, (length,), generator=g).tolist()
            mask += [m] * length
        out.append(make_traj(model, ids, mask, temperature, group_id=f"g{i // 4}"))
    return out


# --- group_advantages -------------------------------------------------------------------------


def test_group_advantages_each_scale_mode() -> None:
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    groups = ["a", "a", "a", "b", "b", "b"]
    third = 1 / 3
    centred = [2 * third, -third, -third, -2 * third, third, third]
    assert group_advantages(rewards, groups, scale="none") == pytest.approx(centred)
    # Group [1, 0, 0]: sample variance ((2/3)^2 + 2 * (1/3)^2) / 2 = 1/3 (same for [0, 1, 1]).
    group_std = math.sqrt(1 / 3)
    assert group_advantages(rewards, groups, scale="group") == pytest.approx(
        [a / (group_std + 1e-4) for a in centred]
    )
    # Whole batch: mean 0.5, sample variance 6 * 0.25 / 5 = 0.3.
    batch_std = math.sqrt(0.3)
    assert group_advantages(rewards, groups, scale="batch") == pytest.approx(
        [a / (batch_std + 1e-4) for a in centred]
    )


def test_group_advantages_zero_variance_and_interleaved_groups() -> None:
    for scale in ("group", "batch", "none"):
        assert group_advantages([0.7, 0.7, 0.7], ["x", "x", "x"], scale=scale) == [0.0] * 3
    # Non-contiguous groups; group "b" has zero variance while "a" does not.
    adv = group_advantages([1.0, 0.5, 0.0, 0.5], ["a", "b", "a", "b"])
    assert adv[1] == 0.0
    assert adv[3] == 0.0
    assert adv[0] == pytest.approx(-adv[2])
    assert adv[0] > 0
    with pytest.raises(ValueError, match="group ids"):
        group_advantages([1.0], ["a", "b"])


# --- common -----------------------------------------------------------------------------------


def test_pad_batch_right_pads_and_aligns() -> None:
    b = pad_batch([[5, 6, 7], [8]], PAD, masks=[[0, 1, 1], [1]], logprobs=[[0, -1, -2], [-3]])
    assert b["input_ids"].tolist() == [[5, 6, 7], [8, PAD, PAD]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert b["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert b["old_logprobs"].dtype == torch.float32
    assert b["old_logprobs"].tolist() == [[0, -1, -2], [-3, 0, 0]]
    with pytest.raises(ValueError, match="aligned"):
        pad_batch([[1, 2]], PAD, masks=[[1]])


def test_token_logprobs_matches_hand_computation(model: LlamaForCausalLM) -> None:
    seqs = [[1, 5, 9, 3, 7], [2, 4, 6]]
    batch = pad_batch(seqs, PAD)
    temperature = 0.7
    with torch.no_grad():
        logp, ent = token_logprobs(
            model, batch["input_ids"], batch["attention_mask"], temperature, with_entropy=True
        )
        for b, seq in enumerate(seqs):
            logits = model(torch.tensor([seq])).logits[0]
            for i in range(1, len(seq)):
                dist = torch.log_softmax(logits[i - 1] / temperature, dim=-1)
                assert logp[b, i].item() == pytest.approx(dist[seq[i]].item(), abs=1e-5)
                hand_ent = -(dist.exp() * dist).sum().item()
                assert ent[b, i].item() == pytest.approx(hand_ent, abs=1e-5)
    assert logp[:, 0].tolist() == [0.0, 0.0]
    assert logp[1, 3:].tolist() == [0.0, 0.0]  # padding
    assert (logp[0, 1:] < 0).all()


# --- GRPO maths -------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "dr_grpo"])
def test_grpo_loss_at_ratio_one_is_minus_mean_advantage(
    model: LlamaForCausalLM, loss_agg: str
) -> None:
    cfg = GRPOConfig(lr=1e-3, loss_agg=loss_agg, max_completion_tokens=16)
    trajs = varied_batch(model, cfg.temperature, n=4)
    adv = [1.0, -0.5, 0.25, 0.0]
    n = [t.n_policy_tokens for t in trajs]
    if loss_agg == "token-mean":
        expected = -sum(a * k for a, k in zip(adv, n, strict=True)) / sum(n)
    elif loss_agg == "seq-mean-token-mean":
        expected = -sum(adv) / len(adv)
    else:
        expected = -sum(a * k for a, k in zip(adv, n, strict=True)) / (len(adv) * 16)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = GRPOTrainer(model, cfg, PAD).step(trajs, adv)
    assert metrics["loss"] == pytest.approx(expected, abs=1e-5)
    assert metrics["clip_ratio"] == 0.0
    assert metrics["n_tokens"] == sum(n)
    assert metrics["entropy"] > 0
    assert metrics["grad_norm"] > 0
    assert "kl" not in metrics
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not model.training  # put back in eval mode for the next rollouts


def test_grpo_token_loss_clipping_by_hand() -> None:
    cfg = GRPOConfig(epsilon_low=0.2, epsilon_high=0.3)
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.0, 1.5, 0.5, 1.5]]))  # ratios 1, 1.5, 0.5, 1.5
    mask = torch.tensor([[0, 1, 1, 1]])
    pos = grpo_token_loss(new, old, torch.tensor([2.0]), mask, cfg)
    # A > 0: ratio 1.5 is clipped to 1.3; ratio 0.5 is not clipped (min picks 0.5 * A).
    assert pos[0].tolist() == pytest.approx([0.0, -2.6, -1.0, -2.6])
    neg = grpo_token_loss(new, old, torch.tensor([-2.0]), mask, cfg)
    # A < 0: ratio 0.5 is clipped to 0.8; ratio 1.5 is not (min picks 1.5 * A).
    assert neg[0].tolist() == pytest.approx([0.0, 3.0, 1.6, 3.0])
    per_seq = aggregate_loss(pos, mask, "seq-mean-token-mean", 3, 2, 8)
    assert per_seq.item() == pytest.approx((-6.2 / 3) / 2)


def test_observation_tokens_get_exactly_zero_gradient_pure() -> None:
    torch.manual_seed(0)
    ids = torch.tensor([[1, 2, 3, 10, 11, 20, 21, 22, 12, 13]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 0, 0, 0, 1, 1]])
    logits = torch.randn(1, ids.shape[1], VOCAB, requires_grad=True)
    cfg = GRPOConfig(beta=0.1)
    new = logprobs_from_logits(logits, ids, cfg.temperature)
    old = torch.where(mask.bool(), new.detach() + 0.3 * torch.randn_like(new), 0.0)
    ref = new.detach() + 0.1
    per_token = grpo_token_loss(new, old, torch.tensor([1.5]), mask, cfg, ref_logp=ref)
    aggregate_loss(per_token, mask, "token-mean", int(mask.sum()), 1, 256).backward()
    grad = logits.grad[0]
    for i in range(1, ids.shape[1]):  # logit row i - 1 predicts token i
        if mask[0, i]:
            assert grad[i - 1].abs().sum() > 0
        else:
            assert torch.equal(grad[i - 1], torch.zeros(VOCAB))
    assert torch.equal(grad[-1], torch.zeros(VOCAB))  # the last row predicts nothing


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_observation_tokens_get_exactly_zero_gradient_in_trainer(
    model: LlamaForCausalLM, beta: float
) -> None:
    # One plain forward, so the hook below sees every logit; the shared-prefix pass is checked
    # against this one in test_shared_prefix_pass_equals_the_plain_one.
    cfg = GRPOConfig(beta=beta, share_prefix=False)
    ids = [1, 2, 3, 10, 11, 20, 21, 22, 12, 13]
    mask = [0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    trainer = GRPOTrainer(model, cfg, PAD)
    if beta > 0:
        # Move the policy away from its reference so the KL term has a gradient everywhere.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
    short = make_traj(model, [4, 5, 6, 7], [0, 0, 1, 1], cfg.temperature)
    traj = make_traj(model, ids, mask, cfg.temperature)
    captured: list[torch.Tensor] = []

    def keep_logits(_module: torch.nn.Module, _inp: object, out: torch.Tensor) -> None:
        out.retain_grad()
        captured.append(out)

    handle = model.lm_head.register_forward_hook(keep_logits)
    try:
        # Advantage 0 on the long row: with beta > 0 its gradient is the KL term's alone.
        stats = trainer.accumulate_gradients([traj, short], [0.0 if beta else 1.0, -1.0])
    finally:
        handle.remove()
    assert (stats["kl"] > 0) == (beta > 0)
    (logits,) = captured
    # The trainer orders a micro-batch by length: the short row first, then the long one.
    grad = logits.grad[1]
    for i in range(1, len(ids)):
        if mask[i]:
            assert grad[i - 1].abs().sum() > 0
        else:
            assert torch.equal(grad[i - 1], torch.zeros(VOCAB))
    # The shorter row is padded: rows past its last policy token get nothing either.
    assert torch.equal(logits.grad[0, 3:], torch.zeros_like(logits.grad[0, 3:]))


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "dr_grpo"])
def test_micro_batching_gives_full_batch_gradients(model: LlamaForCausalLM, loss_agg: str) -> None:
    cfg = GRPOConfig(loss_agg=loss_agg, micro_batch_size=8)
    trajs = varied_batch(model, cfg.temperature, n=8)
    # Move old log-probs off-policy so ratios differ from 1 and some tokens are clipped.
    g = torch.Generator().manual_seed(2)
    for t in trajs:
        noise = (0.5 * torch.randn(len(t.logprobs), generator=g)).tolist()
        t.logprobs = [
            x + e if m else 0.0 for x, e, m in zip(t.logprobs, noise, t.loss_mask, strict=True)
        ]
    adv = group_advantages([1, 0, 0, 1, 0, 0, 0, 1], [t.group_id for t in trajs])
    grads = {}
    stats = {}
    for mbs in (2, 8):
        m = copy.deepcopy(model)
        trainer = GRPOTrainer(m, cfg.model_copy(update={"micro_batch_size": mbs}), PAD)
        stats[mbs] = trainer.accumulate_gradients(trajs, adv)
        grads[mbs] = [p.grad.clone() for p in m.parameters()]
    assert stats[2]["clip_ratio"] > 0
    assert stats[2]["loss"] == pytest.approx(stats[8]["loss"], abs=1e-6)
    for a, b in zip(grads[2], grads[8], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_reference_model_exists_only_with_kl(model: LlamaForCausalLM) -> None:
    assert GRPOTrainer(model, GRPOConfig(beta=0.0), PAD).ref_model is None
    model.train()
    trainer = GRPOTrainer(model, GRPOConfig(beta=0.1, lr=1e-2, num_iterations=2), PAD)
    ref = trainer.ref_model
    assert ref is not None and ref is not model
    assert not ref.training
    assert all(not p.requires_grad for p in ref.parameters())
    frozen = [p.detach().clone() for p in ref.parameters()]
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    trajs = varied_batch(model, trainer.config.temperature, n=4)
    metrics = trainer.step(trajs, [1.0, -1.0, 0.5, -0.5])
    # Pass 1 is at the reference (k3 = 0), pass 2 after one step away from it (k3 > 0).
    assert metrics["kl"] > 0
    for a, b in zip(ref.parameters(), frozen, strict=True):
        assert torch.equal(a, b)  # the policy moved, the reference did not
    assert any(
        not torch.equal(a, b) for a, b in zip(ref.parameters(), model.parameters(), strict=True)
    )


def test_reference_logprobs_are_computed_once_per_batch(model: LlamaForCausalLM) -> None:
    """`num_iterations` passes over one batch run the frozen reference once per micro-batch (as
    trl, once per generation batch), and the update equals recomputing it on every pass."""
    cfg = GRPOConfig(beta=0.2, lr=1e-2, num_iterations=3, micro_batch_size=3)
    twin = copy.deepcopy(model)
    trajs = varied_batch(model, cfg.temperature, n=8)
    adv = [1.0, -1.0, 0.5, -0.5, 0.2, -0.2, 0.0, 0.3]
    cached = GRPOTrainer(model, cfg, PAD)
    calls: list[int] = []
    cached.ref_model.register_forward_hook(lambda *_: calls.append(1))
    metrics = cached.step(trajs, adv)
    assert len(cached.micro_batches(len(trajs))) == 3

    plain = GRPOTrainer(twin, cfg, PAD)
    plain_calls: list[int] = []
    plain.ref_model.register_forward_hook(lambda *_: plain_calls.append(1))
    twin.train()
    kls = []
    for _ in range(cfg.num_iterations):  # the uncached path: the reference runs on every pass
        kls.append(plain.accumulate_gradients(trajs, adv)["kl"])
        torch.nn.utils.clip_grad_norm_(plain.params, cfg.max_grad_norm)
        plain.optimizer.step()
        plain.scheduler.step()
    assert len(calls) > 0 and len(plain_calls) == cfg.num_iterations * len(calls)
    assert metrics["kl"] == pytest.approx(sum(kls) / len(kls), rel=1e-5)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_kl_ratio_correction_scales_k3_by_the_ratio() -> None:
    new = torch.log(torch.tensor([[1.0, 0.5, 0.25]]))
    old = torch.log(torch.tensor([[1.0, 0.25, 0.25]]))  # ratios 1, 2, 1 (unclipped 2 here)
    ref = torch.log(torch.tensor([[1.0, 0.5, 0.5]]))
    mask = torch.tensor([[0, 1, 1]])
    zero_adv = torch.tensor([0.0])
    diff = ref - new
    k3 = torch.exp(diff) - diff - 1
    plain = grpo_token_loss(new, old, zero_adv, mask, GRPOConfig(beta=0.5), ref)
    corrected = grpo_token_loss(
        new, old, zero_adv, mask, GRPOConfig(beta=0.5, kl_ratio_correction=True), ref
    )
    assert plain[0].tolist() == pytest.approx([0.0, 0.5 * k3[0, 1].item(), 0.5 * k3[0, 2].item()])
    assert corrected[0].tolist() == pytest.approx([0.0, 0.0, 0.5 * k3[0, 2].item()])
    assert k3[0, 1].item() == 0.0  # same log-prob as the reference at token 1


def test_later_iterations_use_the_stored_sampling_logprobs(model: LlamaForCausalLM) -> None:
    cfg = GRPOConfig(lr=5e-2, epsilon_low=0.1, epsilon_high=0.1)
    trajs = varied_batch(model, cfg.temperature, n=4)
    adv = [1.0, -1.0, 0.5, -0.5]
    trainer = GRPOTrainer(model, cfg, PAD)
    trainer.step(trajs, adv)
    # After one update the fresh log-probs differ from the stored ones: the ratio is theirs.
    batch = pad_batch(
        [t.token_ids for t in trajs], PAD, [t.loss_mask for t in trajs], [t.logprobs for t in trajs]
    )
    with torch.no_grad():
        fresh = token_logprobs(model, batch["input_ids"], batch["attention_mask"], cfg.temperature)
    mask = batch["loss_mask"].bool()
    ratio = torch.exp(fresh - batch["old_logprobs"])[mask]
    a = torch.tensor(adv)[:, None].expand_as(fresh)[mask]
    expected = -torch.min(ratio * a, ratio.clamp(0.9, 1.1) * a).mean()
    stats = trainer.accumulate_gradients(trajs, adv)
    assert stats["loss"] == pytest.approx(expected.item(), abs=1e-5)
    assert stats["clip_ratio"] > 0
    # With two iterations the second pass is off-policy w.r.t. the stored log-probs.
    two = GRPOTrainer(tiny_llama(), cfg.model_copy(update={"num_iterations": 2}), PAD)
    assert two.step(varied_batch(two.model, cfg.temperature, n=4), adv)["clip_ratio"] > 0


def test_mask_truncated_completions_drops_cut_trajectories(model: LlamaForCausalLM) -> None:
    cfg = GRPOConfig(mask_truncated_completions=True, loss_agg="token-mean")
    trajs = varied_batch(model, cfg.temperature, n=4)
    trajs[1].finish_reason = "max_tokens"
    trajs[2].finish_reason = "max_turns"
    trajs[3].finish_reason = "stop"
    adv = [1.0, -0.5, 0.25, 0.5]
    kept = [trajs[0], trajs[3]]
    m_all, m_kept = copy.deepcopy(model), copy.deepcopy(model)
    masked = GRPOTrainer(m_all, cfg, PAD)
    stats = masked.accumulate_gradients(trajs, adv)
    ref_stats = GRPOTrainer(m_kept, cfg, PAD).accumulate_gradients(kept, [adv[0], adv[3]])
    # Token-mean over the kept trajectories only: the same loss and gradient as without the rest.
    assert stats["n_tokens"] == ref_stats["n_tokens"] == sum(t.n_policy_tokens for t in kept)
    assert stats["loss"] == pytest.approx(
        -(1.0 * kept[0].n_policy_tokens + 0.5 * kept[1].n_policy_tokens) / stats["n_tokens"],
        abs=1e-5,
    )
    for a, b in zip(m_all.parameters(), m_kept.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=0)
    assert masked.step(trajs, adv)["n_masked_truncated"] == 2
    off = GRPOTrainer(
        copy.deepcopy(model), cfg.model_copy(update={"mask_truncated_completions": False}), PAD
    )
    assert off.accumulate_gradients(trajs, adv)["n_tokens"] == sum(t.n_policy_tokens for t in trajs)


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "dr_grpo"])
def test_gradient_accumulation_steps_split_without_changing_gradients(
    model: LlamaForCausalLM, loss_agg: str
) -> None:
    trajs = varied_batch(model, 0.7, n=7)
    adv = group_advantages([1, 0, 0, 1, 0, 1, 1], [t.group_id for t in trajs])
    base = GRPOConfig(loss_agg=loss_agg)
    split = GRPOTrainer(model, base.model_copy(update={"gradient_accumulation_steps": 3}), PAD)
    assert [list(r) for r in split.micro_batches(7)] == [[0, 1], [2, 3], [4, 5, 6]]
    capped = base.model_copy(update={"gradient_accumulation_steps": 2, "micro_batch_size": 2})
    assert [list(r) for r in GRPOTrainer(model, capped, PAD).micro_batches(7)] == [
        [0, 1],
        [2],
        [3, 4],
        [5, 6],
    ]
    assert len(split.micro_batches(2)) == 2  # never more parts than trajectories
    grads = []
    for g in (1, 3, 7):
        m = copy.deepcopy(model)
        cfg = base.model_copy(update={"gradient_accumulation_steps": g})
        GRPOTrainer(m, cfg, PAD).accumulate_gradients(trajs, adv)
        grads.append([p.grad.clone() for p in m.parameters()])
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_lr_schedule_warms_up_and_persists_across_steps(model: LlamaForCausalLM) -> None:
    assert [lr_multiplier(s, "linear", 2, 6) for s in range(7)] == pytest.approx(
        [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    )
    assert [lr_multiplier(s, "linear", 0, 4, min_lr_ratio=0.2) for s in range(6)] == pytest.approx(
        [1.0, 0.8, 0.6, 0.4, 0.2, 0.2]
    )
    with pytest.raises(ValueError, match="min_lr_ratio"):
        lr_multiplier(0, "cosine", 0, 4, min_lr_ratio=1.5)
    floored = GRPOTrainer(model, GRPOConfig(lr=1e-3, lr_scheduler="linear", min_lr_ratio=0.5),
                          PAD, total_steps=2)
    for _ in range(3):
        floored.scheduler.step()
    assert floored.optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-3)
    with pytest.raises(ValueError, match="total_steps"):
        GRPOTrainer(model, GRPOConfig(lr_scheduler="cosine"), PAD)
    cfg = GRPOConfig(lr=1e-3, lr_scheduler="linear", warmup_steps=2, num_iterations=2)
    trainer = GRPOTrainer(model, cfg, PAD, total_steps=6)
    trajs = varied_batch(model, cfg.temperature, n=2)
    seen = []
    for _ in range(4):  # 4 calls x 2 iterations = 8 optimizer steps, past total_steps
        seen.append(trainer.step(trajs, [1.0, -1.0])["lr"])
        assert trainer.optimizer_steps == 2 * len(seen)
    assert seen == pytest.approx([5e-4, 1e-3, 5e-4, 0.0])
    # The config's own total_steps wins over the constructor's.
    own = GRPOTrainer(model, cfg.model_copy(update={"total_steps": 10}), PAD, total_steps=6)
    assert own.total_steps == 10


def test_bf16_autocast_switch(model: LlamaForCausalLM) -> None:
    cpu = torch.device("cpu")
    assert GRPOConfig().autocast_dtype(cpu) is None  # auto: only on CUDA
    assert GRPOConfig(bf16=True).autocast_dtype(cpu) == torch.bfloat16
    assert GRPOConfig(bf16=False).autocast_dtype(cpu) is None
    trajs = varied_batch(model, 0.7, n=4)
    adv = [1.0, -1.0, 0.5, -0.5]
    dtypes: list[torch.dtype] = []
    handle = model.lm_head.register_forward_hook(lambda _m, _i, out: dtypes.append(out.dtype))
    try:
        fp32 = GRPOTrainer(model, GRPOConfig(bf16=False), PAD).accumulate_gradients(trajs, adv)
        bf16 = GRPOTrainer(model, GRPOConfig(bf16=True), PAD).accumulate_gradients(trajs, adv)
    finally:
        handle.remove()
    # Two forwards per pass: the groups' shared prompts, then the rest of each row.
    assert dtypes == [torch.float32] * 2 + [torch.bfloat16] * 2
    assert bf16["loss"] == pytest.approx(fp32["loss"], abs=0.05)
    assert bf16["loss"] != fp32["loss"]


def test_checkpoint_resume_is_exact(tmp_path: Path) -> None:
    cfg = GRPOConfig(
        lr=1e-2, beta=0.05, num_iterations=2, lr_scheduler="cosine", warmup_steps=2, total_steps=12
    )

    def train(model: LlamaForCausalLM, trainer: GRPOTrainer, steps: int) -> None:
        """Steps whose data come from all three global RNGs, like the loop's rollouts."""
        for _ in range(steps):
            trajs = []
            for i in range(4):
                n = random.randint(2, 5)
                ids = torch.randint(1, VOCAB, (3 + n,)).tolist()
                trajs.append(
                    make_traj(model, ids, [0, 0, 0] + [1] * n, cfg.temperature, f"g{i % 2}")
                )
            rewards = np.random.rand(4).tolist()
            trainer.step(trajs, group_advantages(rewards, [t.group_id for t in trajs]))

    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    model = tiny_llama(seed=0)
    trainer = GRPOTrainer(model, cfg, PAD)
    train(model, trainer, 2)
    path = save_checkpoint(
        tmp_path / "ckpt" / "state.pt", model, trainer, {"round": 2, "note": "x"}
    )
    train(model, trainer, 2)

    # Other weights, other RNG draws since: only the checkpoint can make them agree.
    resumed = tiny_llama(seed=7)
    resumed_trainer = GRPOTrainer(resumed, cfg, PAD)
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    assert load_checkpoint(path, resumed, resumed_trainer) == {"round": 2, "note": "x"}
    assert resumed_trainer.optimizer_steps == 4
    train(resumed, resumed_trainer, 2)
    for a, b in zip(model.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    assert resumed_trainer.ref_model is not None and trainer.ref_model is not None
    for a, b in zip(
        trainer.ref_model.parameters(), resumed_trainer.ref_model.parameters(), strict=True
    ):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="reference model"):
        load_checkpoint(path, tiny_llama(), GRPOTrainer(tiny_llama(), GRPOConfig(), PAD))


def test_configs_reject_bad_values_with_reasons() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"steps\n.*greater than or equal to 0"):
        SFTConfig(steps=-1)
    with pytest.raises(pydantic.ValidationError, match=r"batch_size\n.*greater than or equal to 1"):
        SFTConfig(batch_size=0)
    with pytest.raises(pydantic.ValidationError, match=r"lr\n.*greater than 0"):
        SFTConfig(lr=0)
    with pytest.raises(pydantic.ValidationError, match="extra"):
        SFTConfig(epochs=3)
    with pytest.raises(pydantic.ValidationError, match="1 - epsilon_low must stay positive"):
        GRPOConfig(epsilon_low=1.0)
    with pytest.raises(pydantic.ValidationError, match=r"micro_batch_size\n.*or equal to 1"):
        GRPOConfig(micro_batch_size=0)
    with pytest.raises(pydantic.ValidationError):
        GRPOConfig(loss_agg="sum")
    with pytest.raises(pydantic.ValidationError,
                       match=r"gradient_accumulation_steps\n.*greater than or equal to 1"):
        GRPOConfig(gradient_accumulation_steps=0)
    with pytest.raises(pydantic.ValidationError, match="schedule would end before the warm-up"):
        GRPOConfig(warmup_steps=10, total_steps=5)
    with pytest.raises(pydantic.ValidationError):
        GRPOConfig(lr_scheduler="step")
    with pytest.raises(pydantic.ValidationError):
        GRPOConfig(bf16="maybe")
    with pytest.raises(pydantic.ValidationError,
                       match=r"max_seq_len\n.*2: one target token needs a context token"):
        SFTConfig(max_seq_len=1)


# --- behaviour --------------------------------------------------------------------------------


def test_sft_cosine_decays_to_its_floor(model: LlamaForCausalLM) -> None:
    examples = [([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 1, 1])] * 2
    seen: list[float] = []
    cfg = SFTConfig(steps=5, batch_size=2, lr=1e-3, warmup_steps=0, min_lr_ratio=0.25)
    SFTTrainer(model, cfg, PAD).train(examples, on_step=lambda s, m: seen.append(m["lr"]))
    expected = [1e-3 * (0.25 + 0.75 * 0.5 * (1 + math.cos(math.pi * s / 5))) for s in range(5)]
    assert seen == pytest.approx(expected)
    assert min(seen) > 0.25e-3 - 1e-12
    with pytest.raises(pydantic.ValidationError, match="min_lr_ratio"):
        SFTConfig(min_lr_ratio=-0.1)


def test_sft_memorises_and_trains_only_masked_tokens(model: LlamaForCausalLM) -> None:
    g = torch.Generator().manual_seed(3)
    examples = []
    for _ in range(4):
        ids = torch.randint(1, VOCAB, (10,), generator=g).tolist()
        examples.append((ids, [0] * 4 + [1] * 6))

    # The loss is the CE over mask-1 targets only, and mask-0 targets get exactly no gradient.
    batch = pad_batch([e[0] for e in examples], PAD, masks=[e[1] for e in examples])
    logits = model(batch["input_ids"]).logits.detach().requires_grad_(True)
    loss, n = sft_loss(logits, batch["input_ids"], batch["loss_mask"])
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    assert n == 24
    assert loss.item() == pytest.approx(-logp[:, 3:].mean().item(), abs=1e-5)
    loss.backward()
    assert torch.equal(logits.grad[:, :3], torch.zeros_like(logits.grad[:, :3]))
    assert (logits.grad[:, 3:9].abs().sum(-1) > 0).all()

    seen: list[tuple[int, dict[str, float]]] = []
    cfg = SFTConfig(steps=60, batch_size=4, lr=1e-2, warmup_steps=5)
    final = SFTTrainer(model, cfg, PAD).train(examples, on_step=lambda s, m: seen.append((s, m)))
    assert [s for s, _ in seen] == list(range(1, 61))
    first = seen[0][1]["loss"]
    assert final["loss"] < 0.1 * first
    assert final["tokens_per_s"] > 0
    assert final["steps"] == 60

    with torch.no_grad():
        logits = model(batch["input_ids"]).logits
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    # Answers are memorised; the never-trained prompt tokens stay unpredictable.
    assert -logp[:, 3:].mean().item() < 0.5
    assert -logp[:, :3].mean().item() > 2.0


def sft_examples(n: int, seed: int = 4) -> list[tuple[list[int], list[int]]]:
    """Examples of varied lengths (5..40 tokens): a prompt (mask 0), then an answer (mask 1)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        prompt, answer = (int(x) for x in torch.randint(2, 20, (2,), generator=g))
        ids = torch.randint(1, VOCAB, (prompt + answer,), generator=g).tolist()
        out.append((ids, [0] * prompt + [1] * answer))
    return out


def test_pack_batch_layout() -> None:
    seqs = [[1] * 5, [2] * 3, [3] * 4, [4] * 9]
    masks = [[0, 0, 1, 1, 1], [0, 1, 1], [1, 1, 1, 1], [1] * 9]
    b = pack_batch(seqs, masks, PAD, max_seq_len=8)
    # Longest first, first fit: [9] alone (longer than a row), [5, 3], [4].
    assert b["input_ids"].tolist() == [
        [4] * 9,
        [1] * 5 + [2] * 3 + [PAD],
        [3] * 4 + [PAD] * 5,
    ]
    assert b["position_ids"].tolist() == [
        list(range(9)),
        [0, 1, 2, 3, 4, 0, 1, 2, 0],
        [0, 1, 2, 3, 0, 1, 2, 3, 4],
    ]
    # The first token of each example is never a target (its predecessor is another example).
    assert b["loss_mask"].tolist() == [
        [0] + [1] * 8,
        [0, 0, 1, 1, 1, 0, 1, 1, 0],
        [0, 1, 1, 1, 0, 0, 0, 0, 0],
    ]
    assert b["attention_mask"].sum().item() == 21


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_sft_loss_equals_unpacked(attn: str) -> None:
    model = tiny_llama(attn=attn).train()
    examples = sft_examples(12)
    grads = {}
    losses = {}
    counts = {}
    for pack in (False, True):
        model.zero_grad()
        loss, counts[pack] = batch_loss(model, examples, PAD, pack=pack, max_seq_len=128)
        loss.backward()
        losses[pack] = loss.item()
        grads[pack] = [p.grad.clone() for p in model.parameters()]
    assert losses[True] == pytest.approx(losses[False], abs=1e-5)
    for a, b in zip(grads[False], grads[True], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert counts[True]["targets"] == counts[False]["targets"]
    assert counts[True]["tokens"] == counts[False]["tokens"]
    # Packing removes padding: fewer positions for the same tokens.
    assert counts[True]["positions"] < 0.8 * counts[False]["positions"]


def test_packed_examples_do_not_see_each_other(model: LlamaForCausalLM) -> None:
    a, b = [5, 6, 7, 8], [9, 10, 11]
    other_a = [40, 41, 42, 43]
    with torch.no_grad():
        outs = []
        for first in (a, other_a):
            batch = pack_batch([first, b], [[1] * 4, [1] * 3], PAD, max_seq_len=16)
            assert batch["input_ids"].shape[0] == 1  # one row
            logits = model(
                input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
            ).logits
            outs.append(logits[0, 4:7])
        alone = model(input_ids=torch.tensor([b])).logits[0]
    assert torch.equal(outs[0], outs[1])  # changing example a does not touch example b
    torch.testing.assert_close(outs[0], alone, atol=1e-5, rtol=0)


def test_grpo_raises_probability_of_rewarded_continuation(model: LlamaForCausalLM) -> None:
    prompt = [1, 2, 3]
    cfg = GRPOConfig(lr=1e-2, temperature=1.0)
    trainer = GRPOTrainer(model, cfg, PAD)

    def p_next(token: int) -> float:
        return math.exp(current_logprobs(model, [*prompt, token], 1.0)[-1])

    p5, p7 = p_next(5), p_next(7)
    for _ in range(20):
        # Fresh on-policy log-probs each round, as a rollout would store them.
        trajs = [make_traj(model, [*prompt, tok], [0, 0, 0, 1], 1.0) for tok in (5, 5, 7, 7)]
        rewards = [1.0, 1.0, 0.0, 0.0]
        trainer.step(trajs, group_advantages(rewards, [t.group_id for t in trajs]))
    assert p_next(5) > max(0.5, 10 * p5)
    assert p_next(7) < p7


# --- shared-prefix pass ---------------------------------------------------------------------------


def grouped_batch(model: torch.nn.Module, temperature: float) -> list[Trajectory]:
    """Three groups of four two-turn trajectories; a group's members share their prompt."""
    g = torch.Generator().manual_seed(7)
    out = []
    for group in range(3):
        prompt = torch.randint(1, VOCAB, (4 + 2 * group,), generator=g).tolist()
        for k in range(4):
            ids, mask = list(prompt), [0] * len(prompt)
            for length, m in [(1 + (k + group) % 3, 1), (2 + k % 2, 0), (1 + k % 2, 1)]:
                ids += torch.randint(1, VOCAB, (length,), generator=g).tolist()
                mask += [m] * length
            out.append(make_traj(model, ids, mask, temperature, group_id=f"g{group}"))
    return out


@pytest.mark.parametrize(("beta", "micro"), [(0.0, 32), (0.04, 5)])
def test_shared_prefix_pass_equals_the_plain_one(model: LlamaForCausalLM, beta: float,
                                                 micro: int) -> None:
    """Same loss, metrics and gradient of every parameter with the prompt run once per group
    as with every row run whole; also with micro-batches that cut groups apart, and with the
    KL term (whose reference model takes the same path)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    batch = grouped_batch(model, 0.9)
    adv = [0.5, -1.0, 1.5, -0.25, 0.0, 1.0, -1.0, 0.3, -0.7, 0.2, 0.9, -1.2]
    grads, stats = [], []
    ref_state: dict[str, torch.Tensor] = {}
    for share in (False, True):
        cfg = GRPOConfig(beta=beta, share_prefix=share, micro_batch_size=micro,
                         temperature=0.9, loss_agg="seq-mean-token-mean")
        trainer = GRPOTrainer(model, cfg, PAD)
        if trainer.ref_model is not None:  # a reference unlike the policy: KL has a gradient
            if not ref_state:
                with torch.no_grad():
                    for p in trainer.ref_model.parameters():
                        p.add_(0.05 * torch.randn_like(p))
                ref_state = {k: v.clone() for k, v in trainer.ref_model.state_dict().items()}
            trainer.ref_model.load_state_dict(ref_state)
        stats.append(trainer.accumulate_gradients(batch, adv))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for key in ("loss", "entropy", "kl", "clip_ratio"):
        assert stats[1][key] == pytest.approx(stats[0][key], abs=1e-5), key
    assert (stats[0]["kl"] > 0) == (beta > 0)
    for name, g0 in grads[0].items():
        assert torch.allclose(grads[1][name], g0, atol=1e-5), name
    assert any(g.abs().sum() > 0 for g in grads[1].values())


def test_shared_prefix_logprobs_equal_token_logprobs(model: LlamaForCausalLM) -> None:
    batch = grouped_batch(model, 1.0)
    seqs, masks = [t.token_ids for t in batch], [t.loss_mask for t in batch]
    padded = pad_batch(seqs, PAD, masks=masks)
    with torch.no_grad():
        plain, plain_ent = token_logprobs(model, padded["input_ids"], padded["attention_mask"],
                                          0.8, with_entropy=True)
        shared, shared_ent = shared_prefix_logprobs(model, seqs, prefix_lengths(seqs, masks),
                                                    PAD, 0.8, with_entropy=True)
    trained = padded["loss_mask"].bool()
    assert trained.sum() > 20
    assert torch.allclose(shared[trained], plain[trained], atol=1e-5)
    assert torch.allclose(shared_ent[trained], plain_ent[trained], atol=1e-5)
    assert prefix_lengths(seqs, masks)[:4] == [4] * 4  # the group's prompt


def test_logprobs_blocks_do_not_change_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """One row at a time (a real vocabulary) and the whole batch at once (the tiny one) agree,
    values and gradients."""
    import trainers.common as common

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 7, 11, generator=g, requires_grad=True)
    ids = torch.randint(0, 11, (5, 7), generator=g)
    results = []
    for block in (1 << 24, 11 * 7 * 2, 1):  # all rows, two rows, one row per block
        monkeypatch.setattr(common, "LOGIT_BLOCK", block)
        logits.grad = None
        lp, ent = common.logprobs_from_logits(logits, ids, 0.7, with_entropy=True)
        (lp * torch.arange(7.0)).sum().backward()
        results.append((lp.detach(), ent, logits.grad.clone()))
    for lp, ent, grad in results[1:]:
        assert torch.allclose(lp, results[0][0], atol=1e-6)
        assert torch.allclose(ent, results[0][1], atol=1e-6)
        assert torch.allclose(grad, results[0][2], atol=1e-6)


def test_adam_hyperparameters_reach_the_optimizer_and_epsilon_damps_the_first_step(
    model: LlamaForCausalLM,
) -> None:
    """`adam_beta1/adam_beta2/adam_epsilon` (trl's names) configure AdamW. Adam's first step is
    lr * g / (|g| + eps): with the default eps every coordinate with a gradient moves by ~lr
    (a sign step), with an eps far above the gradients it moves by ~lr * g / eps, much less."""
    cfg = GRPOConfig(lr=1e-3, adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-4)
    group = GRPOTrainer(model, cfg, PAD).optimizer.param_groups[0]
    assert (group["betas"], group["eps"]) == ((0.8, 0.99), 1e-4)
    with pytest.raises(pydantic.ValidationError, match="adam_beta2"):
        GRPOConfig(adam_beta2=1.0)
    with pytest.raises(pydantic.ValidationError, match="adam_epsilon"):
        GRPOConfig(adam_epsilon=0.0)
    trajs = varied_batch(model, 1.0, n=4)
    moved = {}
    for eps in (1e-8, 1.0):
        m = copy.deepcopy(model)
        before = [p.detach().clone() for p in m.parameters()]
        trainer = GRPOTrainer(m, GRPOConfig(lr=1e-3, temperature=1.0, adam_epsilon=eps), PAD)
        trainer.step(trajs, [1.0, -1.0, 0.5, -0.5])
        deltas = torch.cat([(p.detach() - b).abs().flatten()
                            for p, b in zip(m.parameters(), before, strict=True)])
        moved[eps] = deltas[deltas > 0]
    # default eps: a sign step, every moved coordinate by lr (to float rounding)
    torch.testing.assert_close(moved[1e-8].median(), torch.tensor(1e-3), atol=1e-5, rtol=0)
    assert moved[1.0].max() < 1e-4  # gradients are far below 1, so the step is damped


@pytest.mark.parametrize("guarded", [False, True])
def test_zero_advantage_rows_run_forward_only_and_change_nothing(
        model: LlamaForCausalLM, guarded: bool) -> None:
    """A group whose rewards are all equal has exactly zero gradient (beta = 0, no covariance
    penalty): its rows run forward only (`n_inert`), and the step (parameters, Adam state, every
    metric) is the full backward's, with the warm-started second moment, two passes and, when
    `guarded`, the KL guard (whose batch KL reads those rows' log-probs)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    batch = grouped_batch(model, 0.9)
    g = torch.Generator().manual_seed(3)
    for t in batch:  # off-policy old log-probs: ratios differ from 1, some tokens are clipped
        t.logprobs = [x + float(0.4 * torch.randn(1, generator=g)) if m else 0.0
                      for x, m in zip(t.logprobs, t.loss_mask, strict=True)]
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 0.2, 1.0, 0.0]  # g1: no signal
    for t, r in zip(batch, rewards, strict=True):
        t.reward = r
    cfg = GRPOConfig(temperature=0.9, micro_batch_size=3, num_iterations=2, lr=1e-3,
                     adam_v_warm_start=True, kl_guard=1e-3 if guarded else None,
                     kl_guard_action="halve", loss_agg="seq-mean-token-mean")
    out, params = {}, {}
    for skip in (False, True):
        m = copy.deepcopy(model)
        trainer = GRPOTrainer(m, cfg, PAD)
        trainer.skip_inert = skip
        out[skip] = trainer.update(batch)
        params[skip] = {n: p.detach().clone() for n, p in m.named_parameters()}
    assert out[True]["n_inert"] == 4 and out[False]["n_inert"] == 0
    assert out[True]["clip_ratio"] > 0
    if guarded:
        assert out[True]["guard/halved"] > 0
    for key, value in out[False].items():
        if key not in ("seconds", "n_inert"):
            assert out[True][key] == pytest.approx(value, abs=1e-6), key
    moved = 0.0
    for name, p in params[False].items():
        torch.testing.assert_close(params[True][name], p, atol=1e-6, rtol=0)
        moved += float((p - model.state_dict()[name]).abs().sum())
    assert moved > 0
    # With a KL term every row has a gradient: nothing is skipped.
    kl = GRPOTrainer(copy.deepcopy(model), cfg.model_copy(update={"beta": 0.04}), PAD)
    assert kl.update(batch)["n_inert"] == 0
