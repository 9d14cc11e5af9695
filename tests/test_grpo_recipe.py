"""The GRPO recipe options (`grpo.adam_v_warm_start`, `grpo.kl_guard`, `grpo.rollout_correction`)
on a tiny real Llama and on the embedded tiny policy: each checked against numbers computed here by
other means, not only for running."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch
from transformers import LlamaForCausalLM

from sentinel.config import ConfigError, load_config
from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig
from sentinel.env.parser import HermesParser
from sentinel.tasks.arith import ArithFamily
from sentinel.types import Trajectory
from tests.test_trainers import PAD, current_logprobs, grouped_batch, tiny_llama, varied_batch
from trainers import GRPOConfig, GRPOTrainer, load_checkpoint, save_checkpoint

LR = 1e-3
# Twelve trajectories in three groups, and one advantage each (none zero).
ADV = [1.0, -1.0, 0.5, -0.5, 0.8, -0.2, -0.3, -0.3, 0.6, 0.4, -0.7, -0.3]


@pytest.fixture
def model() -> LlamaForCausalLM:
    return tiny_llama()


def config(**options: Any) -> GRPOConfig:
    # Grad-norm clipping off (a huge bound) so a step can be predicted from the raw gradient.
    return GRPOConfig(**{"lr": LR, "temperature": 1.0, "max_grad_norm": 1e9, **options})


def flat(tensors: Any) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in tensors])


def one_step(model: torch.nn.Module, trajs: list[Trajectory], adv: list[float],
             **options: Any) -> tuple[GRPOTrainer, dict[str, float], torch.Tensor]:
    """A fresh trainer's first step on `model` (changed in place): trainer, metrics, and the
    parameter change."""
    before = flat(model.parameters()).clone()
    trainer = GRPOTrainer(model, config(**options), PAD)
    metrics = trainer.step(trajs, adv)
    return trainer, metrics, flat(model.parameters()) - before


def batch_gradient(model: torch.nn.Module, trajs: list[Trajectory],
                   adv: list[float]) -> torch.Tensor:
    """The full-batch gradient of the plain loss (nothing is stepped)."""
    m = copy.deepcopy(model)
    trainer = GRPOTrainer(m, config(), PAD)
    trainer.accumulate_gradients(trajs, adv)
    return flat(p.grad for p in m.parameters())


# --- the optimizer -------------------------------------------------------------------------------


def test_the_optimizer_is_adamw_with_the_configured_betas_eps_and_decay(
    model: LlamaForCausalLM,
) -> None:
    """AdamW, the one optimizer (RAdam was removed, docs/architecture.md): the grpo keys reach it,
    and its first step is the sign step of size lr the recipe options below tame."""
    trainer = GRPOTrainer(copy.deepcopy(model), config(weight_decay=0.1, adam_beta1=0.8,
                                                      adam_epsilon=1e-6), PAD)
    assert type(trainer.optimizer) is torch.optim.AdamW
    group = trainer.optimizer.param_groups[0]
    assert (group["betas"], group["eps"], group["lr"], group["weight_decay"]) == (
        (0.8, 0.999), 1e-6, LR, 0.1)
    trajs = grouped_batch(model, 1.0)
    g = batch_gradient(model, trajs, ADV)
    _, _, adamw = one_step(copy.deepcopy(model), trajs, ADV, lr=1.0)
    assert adamw[g != 0].abs().median() == pytest.approx(1.0, rel=1e-3)


# --- adam_v_warm_start ----------------------------------------------------------------------------


def test_warm_second_moment_first_step_is_lr_g_over_sqrt_group_second_moment(
    model: LlamaForCausalLM,
) -> None:
    """First step = -lr * g / (sqrt(V) + eps), V = n * sum_j g_j^2 over the n groups, each g_j
    computed here as the batch gradient with the other groups' advantages set to 0."""
    trajs = grouped_batch(model, 1.0)
    groups = [t.group_id for t in trajs]
    names = sorted(set(groups))
    g = batch_gradient(model, trajs, ADV)
    per_group = [batch_gradient(model, trajs, [a if gid == name else 0.0
                                               for a, gid in zip(ADV, groups, strict=True)])
                 for name in names]
    torch.testing.assert_close(sum(per_group), g, atol=1e-7, rtol=0)
    second = len(names) * sum(gj**2 for gj in per_group)

    trainer, _, warm = one_step(copy.deepcopy(model), trajs, ADV, adam_v_warm_start=True)
    torch.testing.assert_close(warm, -LR * g / (second.sqrt() + 1e-8), atol=2e-7, rtol=1e-3)
    # Not a sign step: at most lr, and well below it where the groups disagree.
    _, _, plain = one_step(copy.deepcopy(model), trajs, ADV)
    moved = g != 0
    assert plain[moved].abs().median() == pytest.approx(LR, rel=1e-3)
    assert warm.abs().max() <= LR * (1 + 1e-4)
    assert warm[moved].abs().median() < 0.8 * LR
    # The step count is 1, as after any first step: Adam's bias corrections go on as usual.
    assert all(int(s["step"]) == 1 for s in trainer.optimizer.state.values())


def test_warm_second_moment_survives_a_checkpoint(model: LlamaForCausalLM,
                                                  tmp_path: Path) -> None:
    """The warm start is optimizer state: a trainer resumed after the first step continues as the
    uninterrupted one, and does not warm again (its optimizer state is not empty)."""
    first, second = grouped_batch(model, 1.0), varied_batch(model, 1.0, n=8)
    adv2 = ADV[:8]
    m = copy.deepcopy(model)
    trainer = GRPOTrainer(m, config(adam_v_warm_start=True), PAD)
    trainer.step(first, ADV)
    path = save_checkpoint(tmp_path / "state.pt", m, trainer)
    trainer.step(second, adv2)

    resumed = tiny_llama(seed=5)
    resumed_trainer = GRPOTrainer(resumed, config(adam_v_warm_start=True), PAD)
    load_checkpoint(path, resumed, resumed_trainer)
    resumed_trainer.step(second, adv2)
    for a, b in zip(m.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


# --- kl_guard -------------------------------------------------------------------------------------


def test_kl_guard_measures_the_step_as_k3_between_the_policies_before_and_after(
    model: LlamaForCausalLM,
) -> None:
    """guard/kl = mean over the trained tokens of exp(d) - d - 1, d = logp_after - logp_before;
    with a threshold above it the guarded step is bit for bit the unguarded one."""
    trajs = grouped_batch(model, 1.0)
    before = [current_logprobs(model, t.token_ids, 1.0) for t in trajs]
    guarded = copy.deepcopy(model)
    trainer, metrics, _ = one_step(guarded, trajs, ADV, kl_guard=1e6)
    after = [current_logprobs(guarded, t.token_ids, 1.0) for t in trajs]
    d = torch.tensor([a - b for t, bs, as_ in zip(trajs, before, after, strict=True)
                      for a, b, m in zip(as_, bs, t.loss_mask, strict=True) if m])
    assert metrics["guard/kl"] == pytest.approx(float((d.exp() - d - 1).mean()), rel=1e-3)
    assert metrics["guard/kl"] > 0
    assert (metrics["guard/undone"], metrics["guard/halved"]) == (0.0, 0.0)

    plain = copy.deepcopy(model)
    plain_trainer, plain_metrics, _ = one_step(plain, trajs, ADV)
    for a, b in zip(guarded.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)
    # A second step from there: the optimizer states were equal too.
    trainer.step(trajs, ADV)
    plain_trainer.step(trajs, ADV)
    for a, b in zip(guarded.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)
    assert "guard/kl" not in plain_metrics
    assert {k: v for k, v in metrics.items() if not k.startswith("guard/") and k != "seconds"} \
        == {k: v for k, v in plain_metrics.items() if k != "seconds"}


@pytest.mark.parametrize("action", ["undo", "halve"])
def test_kl_guard_undoes_a_step_bit_for_bit(model: LlamaForCausalLM, action: str) -> None:
    """A tiny threshold: the step (and with `halve` its half-size retake) is undone; parameters
    and optimizer state are those from before, bit for bit. The schedule still advances."""
    trajs = grouped_batch(model, 1.0)
    m = copy.deepcopy(model)
    plain = GRPOTrainer(m, config(), PAD)
    plain.step(trajs, ADV)  # so there are Adam moments to restore
    params = [p.detach().clone() for p in m.parameters()]
    guarded = GRPOTrainer(m, config(kl_guard=1e-12, kl_guard_action=action), PAD)
    guarded.load_state_dict(plain.state_dict())
    state = copy.deepcopy(guarded.optimizer.state_dict()["state"])
    metrics = guarded.step(trajs, ADV)
    assert (metrics["guard/undone"], metrics["guard/halved"]) == (1.0, 0.0)
    assert metrics["guard/kl"] > 1e-12
    for p, saved in zip(m.parameters(), params, strict=True):
        assert torch.equal(p, saved)
    restored = guarded.optimizer.state_dict()["state"]
    assert restored.keys() == state.keys()
    for k, s in state.items():
        assert all(torch.equal(restored[k][name], s[name]) for name in s)
    assert guarded.optimizer_steps == 2


def test_kl_guard_halve_keeps_a_step_of_half_the_size(model: LlamaForCausalLM) -> None:
    """A threshold between the full step's KL and the half step's (KL grows about as the square
    of the step): the step is retaken at lr / 2, half the full step's size in every coordinate."""
    trajs = grouped_batch(model, 1.0)
    _, full_metrics, full = one_step(copy.deepcopy(model), trajs, ADV, kl_guard=1e6)
    threshold = full_metrics["guard/kl"] / 2
    trainer, metrics, half = one_step(copy.deepcopy(model), trajs, ADV, kl_guard=threshold,
                                      kl_guard_action="halve")
    assert (metrics["guard/undone"], metrics["guard/halved"]) == (0.0, 1.0)
    assert metrics["guard/kl"] == pytest.approx(full_metrics["guard/kl"])
    torch.testing.assert_close(half, full / 2, atol=1e-8, rtol=1e-3)
    # The learning rate is the schedule's again for the next step.
    assert trainer.optimizer.param_groups[0]["lr"] == LR
    # `undo` with the same threshold keeps nothing.
    _, undo_metrics, undone = one_step(copy.deepcopy(model), trajs, ADV, kl_guard=threshold)
    assert undo_metrics["guard/undone"] == 1.0
    assert not undone.any()


def off_policy(trajs: list[Trajectory], seed: int = 3) -> list[Trajectory]:
    """The same trajectories with their stored log-probs moved, as after an earlier update."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in trajs:
        noise = (0.3 * torch.randn(len(t.logprobs), generator=g)).tolist()
        moved = copy.copy(t)
        moved.logprobs = [x + e if m else 0.0
                          for x, e, m in zip(t.logprobs, noise, t.loss_mask, strict=True)]
        out.append(moved)
    return out


# --- the options together, through update(), on the embedded tiny policy ------------------------


def test_update_on_the_embedded_policy_with_every_option(
    tiny_model: Any, tokenizer: Any, chat: ChatFormat, arith: ArithFamily
) -> None:
    """Reference trajectories of real arith tasks through the real environment, rewarded 1/0 in
    groups of two tasks: update() reports every option's metric and the policy moves."""
    model = copy.deepcopy(tiny_model)
    env = EnvConfig(max_turns=10, max_tokens=2048, max_turn_tokens=64)
    rng = random.Random(0)
    trajs = []
    for k in range(8):
        traj = arith.reference_trajectory(arith.sample_task(rng), chat, HermesParser(), env)
        traj.logprobs = [x if m else 0.0 for x, m in zip(
            current_logprobs(model, traj.token_ids, 0.7), traj.loss_mask, strict=True)]
        traj.group_id, traj.reward = f"g{k // 2}", float(k % 2)
        trajs.append(traj)
    before = flat(model.parameters()).clone()
    trainer = GRPOTrainer(model, GRPOConfig(
        adam_v_warm_start=True, kl_guard=1.0, kl_guard_action="halve"), tokenizer.pad_token_id)
    metrics = trainer.update(trajs)
    assert (metrics["guard/undone"], metrics["guard/halved"]) == (0.0, 0.0)
    assert 0 < metrics["guard/kl"] < 1.0
    assert metrics["learning_rate"] == GRPOConfig().lr
    moved = flat(model.parameters()) - before
    assert moved.abs().max() <= GRPOConfig().lr * (1 + 1e-4)  # warm start: at most lr
    assert moved.abs().max() > 0


# --- config -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("override", "key"), [
    ("grpo.kl_guard=0", "grpo.kl_guard"),
    ("grpo.kl_guard_action=retry", "grpo.kl_guard_action"),
    ("grpo.adam_v_warm_start=maybe", "grpo.adam_v_warm_start"),
])
def test_bad_recipe_values_name_their_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data={"rounds": 1}, overrides=[override])
    assert f"config key '{key}'" in str(info.value)
    assert override.split("=")[0].removeprefix("grpo.") in str(info.value)


def test_recipe_rules_across_keys_name_them() -> None:
    with pytest.raises(pydantic.ValidationError, match="adam_v_warm_start needs adam_beta2 > 0"):
        GRPOConfig(adam_v_warm_start=True, adam_beta2=0.0)
    defaults = GRPOConfig()
    assert (defaults.adam_v_warm_start, defaults.kl_guard, defaults.rollout_correction) == (
        False, None, "none")


# --- rollout_correction: recompute, tis -----------------------------------------------------------


def shifted(trajs: list[Trajectory], delta: float) -> list[Trajectory]:
    """The same trajectories with every stored (engine) log-prob lower by `delta`: an engine whose
    log-probs disagree with the trainer's by exp(delta) in probability on every sampled token."""
    out = []
    for t in trajs:
        moved = copy.copy(t)
        moved.logprobs = [x - delta if m else 0.0
                          for x, m in zip(t.logprobs, t.loss_mask, strict=True)]
        out.append(moved)
    return out


def test_recompute_trains_as_if_the_engine_had_the_trainers_logprobs(
    model: LlamaForCausalLM,
) -> None:
    """With `recompute` the engine's log-probs do not enter the step: a batch whose stored
    log-probs are off (random noise) takes exactly the step of the batch with the trainer's own;
    without it the step differs."""
    trajs = grouped_batch(model, 1.0)
    _, exact_metrics, exact = one_step(copy.deepcopy(model), trajs, ADV, num_iterations=2)
    _, metrics, fixed = one_step(copy.deepcopy(model), off_policy(trajs), ADV,
                                 rollout_correction="recompute", num_iterations=2)
    _, _, plain = one_step(copy.deepcopy(model), off_policy(trajs), ADV, num_iterations=2)
    torch.testing.assert_close(fixed, exact, rtol=0, atol=1e-6)  # float noise of the recompute
    assert (plain - exact).abs().max() > 1e-4
    assert 0.1 < metrics["rollout/logprob_diff"] < 0.5  # |N(0, 0.3)| averages 0.24
    assert "rollout/logprob_diff" not in exact_metrics


@pytest.mark.parametrize(("delta", "weight"),
                         [(0.5, math.exp(0.5)), (2.0, 3.0), (-0.7, math.exp(-0.7))])
def test_tis_scales_each_tokens_surrogate_by_the_truncated_ratio(
    model: LlamaForCausalLM, delta: float, weight: float,
) -> None:
    """tis: trainer-over-engine ratio exp(delta) on every token, truncated at the cap (3.0): the
    gradient is the exact-log-prob gradient times min(exp(delta), 3), the metrics say so."""
    trajs = grouped_batch(model, 1.0)
    reference = batch_gradient(model, trajs, ADV)
    m = copy.deepcopy(model)
    trainer = GRPOTrainer(m, config(rollout_correction="tis"), PAD)
    moved = shifted(trajs, delta)
    info = trainer._rollout_correction(moved, ADV, trainer.loss_masks(moved))
    trainer.accumulate_gradients(moved, ADV)
    trainer._correction = None
    torch.testing.assert_close(flat(p.grad for p in m.parameters()), weight * reference,
                               rtol=1e-4, atol=1e-7)
    assert info["rollout/is_weight"] == pytest.approx(weight, rel=1e-4)
    assert info["rollout/is_capped"] == (1.0 if delta == 2.0 else 0.0)
    assert info["rollout/logprob_diff"] == pytest.approx(abs(delta), rel=1e-4)
