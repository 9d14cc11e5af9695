"""Policy updates for Sentinel: masked-token SFT (warm start) and GRPO (agentic RL).

Both trainers work on token-in/token-out sequences (`token_ids` with a `loss_mask` that is 1 only
on tokens the policy produced), update a Hugging Face causal LM in place, and import nothing from
Sentinel but `sentinel.types`. `trainers.checkpoint` saves and restores a GRPO run exactly.
Importing this package imports torch; callers that must stay light import it lazily.
"""

from trainers.checkpoint import load_checkpoint, save_checkpoint
from trainers.common import (
    logprobs_from_logits,
    lr_multiplier,
    pack_batch,
    pad_batch,
    token_logprobs,
)
from trainers.grpo import (
    GRPOConfig,
    GRPOTrainer,
    aggregate_loss,
    group_advantages,
    grpo_token_loss,
)
from trainers.sft import SFTConfig, SFTTrainer, batch_loss, sft_loss

__all__ = [
    "GRPOConfig",
    "GRPOTrainer",
    "SFTConfig",
    "SFTTrainer",
    "aggregate_loss",
    "batch_loss",
    "group_advantages",
    "grpo_token_loss",
    "load_checkpoint",
    "logprobs_from_logits",
    "lr_multiplier",
    "pack_batch",
    "pad_batch",
    "save_checkpoint",
    "sft_loss",
    "token_logprobs",
]
