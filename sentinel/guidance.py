"""Off-policy reference guidance (`curriculum.reference_guidance`; LUFFY, Yan et al. 2025).

A GRPO group whose rollouts all failed carries no outcome signal: the update either drops it
(`drop_zero_variance`) or pushes it around on format and process rewards alone. Every task in
Sentinel has a verified reference solution (that is what validation checks), so such a group can
be given one success to move toward: the task's reference, replayed through the real environment
(`TaskFamily.reference_trajectory`, the same tokens the SFT cold start trains on), takes the place
of the group's first rollout, and the group's advantages are computed as usual. LUFFY mixes
off-policy reasoning traces into on-policy groups the same way; here the traces are the verified
references the generators already produced, and only groups with no success get one.

The reference's "old" log-probs are the policy's own (one no-grad forward at the sampling
temperature), so its importance ratio starts at 1 and the clipped surrogate treats it like a
sample the policy might have drawn; its gradient is then `A * grad log pi(reference)`.

The policy's own rollouts are what the store keeps and what the curriculum's pass rates count;
the reference only enters the trained batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from sentinel.rewards import RewardConfig, score
from sentinel.tasks.base import TaskFamily
from sentinel.types import Task, Trajectory, new_id

Guidance = Literal["off", "mined", "all"]


def eligible(task: Task, mode: Guidance) -> bool:
    """Whether `task`'s all-failed groups get its reference: every task for 'all', generated
    (failure-mined) ones for 'mined', none for 'off'."""
    return mode == "all" or (mode == "mined" and task.origin == "generated")


def policy_logprobs(model: Any, token_ids: list[int], loss_mask: list[int],
                    temperature: float) -> list[float]:
    """The log-prob of each trained token of `token_ids` under `model` at `temperature` (0.0
    where `loss_mask` is 0), as a rollout would have recorded them."""
    import torch

    from trainers.common import model_device, token_logprobs

    ids = torch.tensor([token_ids], device=model_device(model))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logp = token_logprobs(model, ids, torch.ones_like(ids), temperature)[0].float()
    finally:
        model.train(was_training)
    return [float(v) if m else 0.0 for v, m in zip(logp.tolist(), loss_mask, strict=True)]


def guide(trajectories: Sequence[Trajectory], admitted: Sequence[Trajectory],
          tasks: Mapping[str, Task], families: Mapping[str, TaskFamily], *, chat: Any,
          parser: Any, env: Any, reward: RewardConfig, model: Any, temperature: float,
          mode: Guidance) -> tuple[list[Trajectory], int]:
    """The batch to train on: `admitted` (the groups the curriculum's gate let through), with
    every group of `trajectories` that has no success and an `eligible` task given the task's
    reference in place of its first rollout; such a group is trained on even if the gate
    dropped it (with the reference it has outcome variance). A reference that does not verify
    (it always should) leaves its group as it was. Returns the batch and the number of groups
    guided. `trajectories` are not modified."""
    if mode == "off":
        return list(admitted), 0
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.group_id].append(t)
    in_batch = {t.group_id for t in admitted}
    guided: dict[str, list[Trajectory]] = {}
    for group_id, group in groups.items():
        task = tasks.get(group[0].task_id)
        if task is None or any(t.success for t in group) or not eligible(task, mode):
            continue
        family = families[task.family]
        ref = family.reference_trajectory(task, chat, parser, env)
        ref.reward, ref.reward_terms, ref.success = score(task, ref, family, reward)
        if not ref.success:
            continue
        first = min(group, key=lambda t: t.sample_idx)
        ref = replace(ref, task_id=task.task_id, round=first.round, split=first.split,
                      group_id=group_id, sample_idx=first.sample_idx, traj_id=new_id("ref"),
                      logprobs=policy_logprobs(model, ref.token_ids, ref.loss_mask, temperature))
        guided[group_id] = [ref if t is first else t for t in group]
    batch: list[Trajectory] = []
    emitted: set[str] = set()
    for t in admitted:  # admitted groups keep their place, guided ones with the reference
        if t.group_id not in guided:
            batch.append(t)
        elif t.group_id not in emitted:
            batch += guided[t.group_id]
            emitted.add(t.group_id)
    batch += [t for g, group in guided.items() if g not in in_batch for t in group]
    return batch, len(guided)
