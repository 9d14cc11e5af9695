"""Policy updates for Sentinel: masked-token SFT (warm start) and GRPO (agentic RL).

Both trainers work on token-in/token-out sequences (`token_ids` with a `loss_mask` that is 1 only
on tokens the policy produced), update a Hugging Face causal LM in place, and import nothing from
Sentinel but `sentinel.types`. `trainers.checkpoint` saves and restores a GRPO run exactly.
The hyper-parameter models live in `trainers.config`, which does not import torch; the names
below are imported on first use (PEP 562), so `import trainers.config` stays cheap while
`from trainers import GRPOTrainer` works as before.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "load_checkpoint": "trainers.checkpoint",
    "save_checkpoint": "trainers.checkpoint",
    "logprobs_from_logits": "trainers.common",
    "lr_multiplier": "trainers.common",
    "pack_batch": "trainers.common",
    "pad_batch": "trainers.common",
    "token_logprobs": "trainers.common",
    "GRPOConfig": "trainers.config",
    "GRPOUpdateConfig": "trainers.config",
    "SFTConfig": "trainers.config",
    "GRPOTrainer": "trainers.grpo",
    "aggregate_loss": "trainers.grpo",
    "group_advantages": "trainers.grpo",
    "grpo_token_loss": "trainers.grpo",
    "SFTTrainer": "trainers.sft",
    "batch_loss": "trainers.sft",
    "sft_loss": "trainers.sft",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'trainers' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
