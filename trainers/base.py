"""The trainer seam: what the loop asks of whatever updates the policy.

The loop hands a trainer each step's admitted, scored trajectories (token ids, loss masks,
sampling log-probs, rewards, group ids) and gets metrics back; advantages, losses and optimizer
state are the trainer's business. Checkpoints go through `state_dict` / `load_state_dict` (the
policy's own weights are saved by the caller, beside them). `GRPOTrainer` (native) is one.

A trainer that samples for itself (trl's `GRPOTrainer` calls its `rollout_func`) takes a whole
round instead: `train_round(io)` with a `trainers.trl_backend.RoundIO` (the curriculum's draw,
Sentinel's rollouts, the observer every batch goes back through, the metric sink);
`trainers.trl_backend.TRLTrainer` is one (docs/scale-out.md). The loop calls `train_round` when a
trainer has it and `update` per step otherwise.
"""

from __future__ import annotations

from typing import Any, Protocol

from sentinel.types import Trajectory


class PolicyTrainer(Protocol):
    def update(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One policy update on a step's batch; returns its metrics (trl's names where they
        exist), `learning_rate` included. An empty batch changes nothing."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RoundTrainer(Protocol):
    def train_round(self, io: Any) -> None:
        """Run one round's updates, sampling through `io` (`trainers.trl_backend.RoundIO`)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
