"""The GRPO recipe options (`grpo.optimizer`, `grpo.adam_v_warm_start`, `grpo.kl_guard`,
`grpo.cov_penalty`) on a tiny real Llama and on the embedded tiny policy: each checked against
numbers computed here by other means, not only for running."""

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
from trainers.grpo import covariance_selection, grpo_token_loss

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


# --- optimizer: radam -----------------------------------------------------------------------------


def test_radam_is_torch_radam_and_its_first_step_is_a_momentum_sgd_step(
    model: LlamaForCausalLM,
) -> None:
    """RAdam's variance rectification makes its first steps (rho_t <= 5) un-adapted: the step is
    lr * (bias-corrected momentum) = lr * g, against AdamW's sign step of size lr."""
    trajs = grouped_batch(model, 1.0)
    trainer = GRPOTrainer(copy.deepcopy(model), config(optimizer="radam", weight_decay=0.1), PAD)
    assert type(trainer.optimizer) is torch.optim.RAdam
    group = trainer.optimizer.param_groups[0]
    assert group["decoupled_weight_decay"] and group["weight_decay"] == 0.1
    assert (group["betas"], group["eps"], group["lr"]) == ((0.9, 0.999), 1e-8, LR)
    assert type(GRPOTrainer(copy.deepcopy(model), config(), PAD).optimizer) is torch.optim.AdamW

    # lr 1 so that lr * g stays far above float32 rounding of the weights (norm weights are 1).
    g = batch_gradient(model, trajs, ADV)
    _, _, radam = one_step(copy.deepcopy(model), trajs, ADV, optimizer="radam", lr=1.0)
    _, _, adamw = one_step(copy.deepcopy(model), trajs, ADV, lr=1.0)
    torch.testing.assert_close(radam, -g, atol=2e-7, rtol=1e-3)
    assert adamw[g != 0].abs().median() == pytest.approx(1.0, rel=1e-3)
    assert radam.abs().median() < 0.1 * adamw.abs().median()


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


# --- cov_penalty ----------------------------------------------------------------------------------

# Four tokens by hand: logp - mean(logp) = [0.625, -0.375, -1.375, 1.125], adv - mean = adv,
# so cov = [0.625, -0.375, 1.375, -1.125].
LOGP = torch.tensor([-1.0, -2.0, -3.0, -0.5])
ADV4 = torch.tensor([1.0, 1.0, -1.0, -1.0])


def test_covariance_selection_by_hand() -> None:
    def chosen(**options: Any) -> list[int]:
        mask = covariance_selection(LOGP, ADV4, GRPOConfig(**options))
        return torch.nonzero(mask).flatten().tolist()

    assert chosen() == []
    assert chosen(cov_penalty="kl_cov", kl_cov_ratio=0.5) == [0, 2]  # the two largest
    assert chosen(cov_penalty="kl_cov", kl_cov_ratio=1e-6) == [2]  # at least one
    # Only cov 0.625 lies in (0.5, 1.0): however large the ratio, one token.
    assert chosen(cov_penalty="clip_cov", clip_cov_lb=0.5, clip_cov_ub=1.0,
                  clip_cov_ratio=1.0) == [0]
    # Two in (0, 2); a quarter of four tokens is one of them, drawn at random.
    draws = set()
    for seed in range(12):
        torch.manual_seed(seed)
        pick = chosen(cov_penalty="clip_cov", clip_cov_lb=0.0, clip_cov_ub=2.0,
                      clip_cov_ratio=0.25)
        assert pick in ([0], [2])
        draws.add(pick[0])
    assert draws == {0, 2}
    assert chosen(cov_penalty="clip_cov", clip_cov_lb=2.0, clip_cov_ub=3.0) == []


def test_cov_penalties_in_the_token_loss_by_hand() -> None:
    """clip_cov: the chosen tokens' surrogate and its gradient are exactly 0, the others' as
    without it. kl_cov: -r * A everywhere (no ratio clip, as verl) plus coef * |new - old| on
    the chosen tokens only."""
    old = torch.tensor([[-1.0, -2.0, -3.0, -0.5]])
    new = (old + torch.tensor([[0.5, -0.1, 0.4, 0.2]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    chosen = torch.tensor([[True, False, True, False]])

    plain = grpo_token_loss(new, old, adv, mask, GRPOConfig())
    (plain_grad,) = torch.autograd.grad(plain.sum(), new)
    clip = grpo_token_loss(new, old, adv, mask, GRPOConfig(cov_penalty="clip_cov"), cov_mask=chosen)
    (clip_grad,) = torch.autograd.grad(clip.sum(), new)
    assert torch.equal(clip[chosen], torch.zeros(2))
    assert torch.equal(clip_grad[chosen], torch.zeros(2))
    assert torch.equal(clip[~chosen], plain[~chosen].detach())
    assert torch.equal(clip_grad[~chosen], plain_grad[~chosen])
    assert (clip_grad[~chosen] != 0).all()

    cfg = GRPOConfig(cov_penalty="kl_cov", kl_cov_coef=0.3)
    kl = grpo_token_loss(new, old, adv, mask, cfg, cov_mask=chosen)
    ratio = (new - old).exp()
    expected = -ratio * adv + 0.3 * (new - old).abs() * chosen
    torch.testing.assert_close(kl, expected)
    # Token 0 has ratio e^0.5 > 1.2 with A > 0: the clip would hold it; KL-Cov does not.
    assert plain[0, 0] != -ratio[0, 0] * adv[0, 0]


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


def test_clip_cov_gives_the_chosen_tokens_logits_exactly_zero_gradient(
    model: LlamaForCausalLM,
) -> None:
    # All trained tokens are in the band, so 30% of them are drawn; one plain forward (no
    # shared prefix) so the hook sees every logit.
    cfg = config(cov_penalty="clip_cov", clip_cov_lb=-1e9, clip_cov_ub=1e9, clip_cov_ratio=0.3,
                 share_prefix=False)
    # On-policy log-probs: no ratio clip holds a token, so only the chosen ones lose gradient.
    trajs = grouped_batch(model, 1.0)
    trainer = GRPOTrainer(model, cfg, PAD)
    torch.manual_seed(0)
    selection = trainer.select_cov_tokens(trajs, ADV)
    n_tokens = sum(sum(t.loss_mask) for t in trajs)
    n_chosen = sum(int(s.sum()) for s in selection)
    assert n_chosen == int(0.3 * n_tokens)
    captured: list[torch.Tensor] = []

    def keep_logits(_module: torch.nn.Module, _inp: object, out: torch.Tensor) -> None:
        out.retain_grad()
        captured.append(out)

    handle = model.lm_head.register_forward_hook(keep_logits)
    try:
        stats = trainer.accumulate_gradients(trajs, ADV, selection=selection)
    finally:
        handle.remove()
    assert stats["cov/share"] == pytest.approx(n_chosen / n_tokens)
    (logits,) = captured
    # One micro-batch, rows sorted by length (stable), as the trainer cuts them.
    order = sorted(range(len(trajs)), key=lambda i: len(trajs[i].token_ids))
    for row, i in enumerate(order):
        for pos in range(1, len(trajs[i].token_ids)):
            grad = logits.grad[row, pos - 1]  # the logits that predict token `pos`
            if selection[i][pos]:
                assert torch.equal(grad, torch.zeros_like(grad))
            elif trajs[i].loss_mask[pos]:
                assert grad.abs().sum() > 0


def test_kl_cov_penalises_only_the_top_covariance_tokens(model: LlamaForCausalLM) -> None:
    """Through the trainer: the chosen tokens are the top 20% by the covariance of stored
    log-prob and advantage, and the loss exceeds the unclipped surrogate by exactly
    coef * sum over them of |logp_now - logp_old| / n_tokens."""
    trajs = off_policy(grouped_batch(model, 1.0))
    trainer = GRPOTrainer(model, config(cov_penalty="kl_cov", kl_cov_ratio=0.2,
                                        kl_cov_coef=0.5), PAD)
    selection = trainer.select_cov_tokens(trajs, ADV)
    logp = torch.tensor([x for t in trajs for x, m in zip(t.logprobs, t.loss_mask, strict=True)
                         if m])
    adv = torch.tensor([a for t, a in zip(trajs, ADV, strict=True) for m in t.loss_mask if m])
    cov = (logp - logp.mean()) * (adv - adv.mean())
    k = int(0.2 * len(cov))
    top = set(torch.topk(cov, k).indices.tolist())
    flat_chosen = torch.cat([s[torch.tensor(t.loss_mask, dtype=torch.bool)]
                             for s, t in zip(selection, trajs, strict=True)])
    assert set(torch.nonzero(flat_chosen).flatten().tolist()) == top

    penalty = 0.0
    for s, t in zip(selection, trajs, strict=True):
        now = current_logprobs(model, t.token_ids, 1.0)
        penalty += sum(abs(now[i] - t.logprobs[i]) for i in range(len(now)) if s[i])
    n_tokens = len(cov)
    with_kl = trainer.accumulate_gradients(trajs, ADV, selection=selection)
    # The surrogate without a clip: epsilons wide enough that no ratio here reaches them.
    wide = GRPOTrainer(model, config(epsilon_low=0.99, epsilon_high=100.0), PAD)
    plain = wide.accumulate_gradients(trajs, ADV)
    assert plain["clip_ratio"] == 0.0
    assert with_kl["loss"] - plain["loss"] == pytest.approx(0.5 * penalty / n_tokens, rel=1e-4)
    assert with_kl["cov/share"] == pytest.approx(k / n_tokens)


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
        adam_v_warm_start=True, kl_guard=1.0, kl_guard_action="halve", cov_penalty="clip_cov",
        clip_cov_lb=-1e9, clip_cov_ub=1e9, clip_cov_ratio=0.1), tokenizer.pad_token_id)
    metrics = trainer.update(trajs)
    n_tokens = sum(sum(t.loss_mask) for t in trajs)
    assert metrics["cov/share"] == pytest.approx(int(0.1 * n_tokens) / n_tokens)
    assert (metrics["guard/undone"], metrics["guard/halved"]) == (0.0, 0.0)
    assert 0 < metrics["guard/kl"] < 1.0
    assert metrics["learning_rate"] == GRPOConfig().lr
    moved = flat(model.parameters()) - before
    assert moved.abs().max() <= GRPOConfig().lr * (1 + 1e-4)  # warm start: at most lr
    assert moved.abs().max() > 0


# --- config -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("override", "key"), [
    ("grpo.clip_cov_lb=6", "grpo"),
    ("grpo.optimizer=sgd", "grpo.optimizer"),
    ("grpo.kl_guard=0", "grpo.kl_guard"),
    ("grpo.kl_guard_action=retry", "grpo.kl_guard_action"),
    ("grpo.cov_penalty=entropy", "grpo.cov_penalty"),
    ("grpo.clip_cov_ratio=0", "grpo.clip_cov_ratio"),
    ("grpo.kl_cov_ratio=1.5", "grpo.kl_cov_ratio"),
    ("grpo.kl_cov_coef=-1", "grpo.kl_cov_coef"),
    ("grpo.adam_v_warm_start=maybe", "grpo.adam_v_warm_start"),
])
def test_bad_recipe_values_name_their_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data={"rounds": 1}, overrides=[override])
    assert f"config key '{key}'" in str(info.value)
    assert override.split("=")[0].removeprefix("grpo.") in str(info.value)


def test_recipe_rules_across_keys_name_them() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"clip_cov_lb \(5.0\) must be below "
                                                      r"clip_cov_ub \(1.0\)"):
        GRPOConfig(clip_cov_lb=5.0, clip_cov_ub=1.0)
    with pytest.raises(pydantic.ValidationError, match=r"adam_v_warm_start .*'radam'"):
        GRPOConfig(optimizer="radam", adam_v_warm_start=True)
    with pytest.raises(pydantic.ValidationError, match="adam_v_warm_start needs adam_beta2 > 0"):
        GRPOConfig(adam_v_warm_start=True, adam_beta2=0.0)
    defaults = GRPOConfig()
    assert (defaults.optimizer, defaults.adam_v_warm_start, defaults.kl_guard,
            defaults.cov_penalty) == ("adamw", False, None, "none")


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
