"""Policy updates for Sentinel: masked-token SFT (warm start) and GRPO (agentic RL).

Both trainers work on token-in/token-out sequences (`token_ids` with a `loss_mask` that is 1 only
on tokens the policy produced), update a Hugging Face causal LM in place, and import nothing from
Sentinel but `sentinel.types`. Importing this package imports torch; callers that must stay light
import it lazily.
"""

from trainers.common import logprobs_from_logits, pad_batch, token_logprobs
from trainers.grpo import (
    GRPOConfig,
    GRPOTrainer,
    aggregate_loss,
    group_advantages,
    grpo_token_loss,
)
from trainers.sft import SFTConfig, SFTTrainer, sft_loss, warmup_cosine

__all__ = [
    "GRPOConfig",
    "GRPOTrainer",
    "SFTConfig",
    "SFTTrainer",
    "aggregate_loss",
    "group_advantages",
    "grpo_token_loss",
    "logprobs_from_logits",
    "pad_batch",
    "sft_loss",
    "token_logprobs",
    "warmup_cosine",
]
