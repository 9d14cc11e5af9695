"""The trainer seam (`trainers.base.PolicyTrainer`): `GRPOTrainer.update(trajectories)` is the
GRPO step on the batch's group advantages; an empty batch takes no step."""

from __future__ import annotations

import torch

from tests.test_trainers import PAD, tiny_llama, varied_batch
from trainers.grpo import GRPOConfig, GRPOTrainer, group_advantages


def test_update_is_the_step_on_group_advantages_of_the_rewards() -> None:
    cfg = GRPOConfig(lr=1e-2, scale_rewards="batch")
    via_update, via_step = tiny_llama(), tiny_llama()
    batch = varied_batch(via_update, cfg.temperature)
    for i, t in enumerate(batch):
        t.reward = float(i % 3)
    a = GRPOTrainer(via_update, cfg, PAD).update(batch)
    adv = group_advantages([t.reward for t in batch], [t.group_id for t in batch], scale="batch")
    b = GRPOTrainer(via_step, cfg, PAD).step(batch, adv)
    assert a["loss"] == b["loss"]
    for p, q in zip(via_update.parameters(), via_step.parameters(), strict=True):
        assert torch.equal(p, q)
    assert a["learning_rate"] == cfg.lr


def test_update_on_an_empty_batch_changes_nothing() -> None:
    model = tiny_llama()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = GRPOTrainer(model, GRPOConfig(lr=1e-2), PAD)
    metrics = trainer.update([])
    assert metrics == {"learning_rate": 1e-2}
    assert trainer.optimizer_steps == 0
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
