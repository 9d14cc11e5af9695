"""Sentinel's GRPO loss and gradients against trl's own code path, on identical inputs.

A real `trl.GRPOTrainer` is built on the tiny policy (CPU, no reporting) and its
`_compute_loss(model, inputs)` is called on an `inputs` dict built by hand: the same token ids,
completion masks (and a `tool_mask` for a multi-turn case), advantages, old (sampling) log-probs
and reference log-probs that Sentinel's `GRPOTrainer.accumulate_gradients` sees as trajectories.
Loss values and every parameter gradient must agree to 1e-5.

How trl's `loss_type`s map (read off `_compute_loss` in the installed trl):
- "dapo": sum of per-token losses / masked tokens of the whole generation batch
  (`num_items_in_batch`) = Sentinel's "token-mean" (also across micro-batches).
- "bnpo": the same, normalised by the masked tokens of the local micro-batch; equal to
  "token-mean" when the batch is one micro-batch, as here.
- "grpo": mean over sequences of each sequence's token mean = "seq-mean-token-mean".
- "dr_grpo": sum / (sequences * max_completion_length) = "dr_grpo" with
  `max_completion_tokens = max_completion_length`.
trl's `use_bias_correction_kl` is Sentinel's `kl_ratio_correction`.

Prompts all have the same length: trl left-pads prompts and does not shift position ids, which
changes RoPE positions (and so the numbers, slightly) against Sentinel's right padding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

trl = pytest.importorskip("trl", reason="trl is not installed (pip install -e '.[dev]')")

from sentinel.policy import load_policy  # noqa: E402
from sentinel.types import Trajectory  # noqa: E402
from trainers import GRPOConfig, GRPOTrainer, token_logprobs  # noqa: E402

PROMPT_LEN = 7
COMPLETION_LENS = [3, 9, 5, 12, 1, 7]
ADVANTAGES = [1.2, -0.8, 0.5, -1.5, 0.9, 0.0]
MAX_COMPLETION = 16
TEMPERATURE = 0.7


def build_trl(model_dir: Path, tokenizer: Any, output_dir: Path, **overrides: Any) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    args = TRLConfig(
        output_dir=str(output_dir),
        report_to="none",
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=len(COMPLETION_LENS),
        num_generations=2,
        max_completion_length=MAX_COMPLETION,
        temperature=TEMPERATURE,
        save_strategy="no",
        **overrides,
    )
    trainer = TRLTrainer(
        model=str(model_dir),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "1+1"}] * 4),
        processing_class=tokenizer,
    )
    # Set by Trainer's training loop; _compute_loss divides by it.
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def make_inputs(
    model: torch.nn.Module, vocab: int, pad_id: int, multi_turn: bool
) -> tuple[list[list[int]], list[list[int]], list[list[int]], list[list[float]]]:
    """Prompts, completions, masks over completions (policy tokens) and stored sampling
    log-probs over completions (the model's own, moved off-policy by seeded noise)."""
    g = torch.Generator().manual_seed(11)
    prompts, completions, masks, old = [], [], [], []
    for n in COMPLETION_LENS:
        prompt = torch.randint(4, vocab, (PROMPT_LEN,), generator=g).tolist()
        completion = torch.randint(4, vocab, (n,), generator=g).tolist()
        mask = [1] * n
        if multi_turn and n >= 5:
            mask[2:4] = [0, 0]  # a tool observation inside the completion
        ids = prompt + completion
        with torch.no_grad():
            lp = token_logprobs(
                model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), TEMPERATURE
            )[0, PROMPT_LEN:]
        noise = 0.4 * torch.randn(n, generator=g)
        prompts.append(prompt)
        completions.append(completion)
        masks.append(mask)
        old.append([float(x + e) if m else 0.0 for x, e, m in zip(lp, noise, mask, strict=True)])
    return prompts, completions, masks, old


CASES = [
    # (trl loss_type, Sentinel loss_agg, beta, kl correction, multi-turn, Sentinel micro-batch)
    ("dapo", "token-mean", 0.0, False, False, 2),
    ("bnpo", "token-mean", 0.0, False, False, 6),
    ("grpo", "seq-mean-token-mean", 0.0, False, False, 4),
    ("dr_grpo", "dr_grpo", 0.0, False, False, 3),
    ("dapo", "token-mean", 0.05, False, False, 6),
    ("dapo", "token-mean", 0.05, True, False, 6),
    ("grpo", "seq-mean-token-mean", 0.05, True, True, 2),
    ("dr_grpo", "dr_grpo", 0.05, False, True, 6),
]


@pytest.mark.parametrize(("loss_type", "loss_agg", "beta", "kl_corr", "multi_turn", "mbs"), CASES)
def test_loss_and_gradients_match_trl(
    tiny_dir: Path,
    tmp_path: Path,
    loss_type: str,
    loss_agg: str,
    beta: float,
    kl_corr: bool,
    multi_turn: bool,
    mbs: int,
) -> None:
    model, tokenizer = load_policy(tiny_dir)
    pad_id = tokenizer.pad_token_id
    cfg = GRPOConfig(
        loss_agg=loss_agg,
        beta=beta,
        kl_ratio_correction=kl_corr,
        epsilon_low=0.2,
        epsilon_high=0.28,
        temperature=TEMPERATURE,
        max_completion_tokens=MAX_COMPLETION,
        micro_batch_size=mbs,
    )
    ours = GRPOTrainer(model, cfg, pad_id)  # its reference: the weights as loaded
    # Move the policy off the reference so the KL term and its gradient are not zero.
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))

    theirs = build_trl(
        tiny_dir,
        tokenizer,
        tmp_path,
        loss_type=loss_type,
        beta=beta,
        epsilon=0.2,
        epsilon_high=0.28,
        use_bias_correction_kl=kl_corr,
    )
    theirs.model.load_state_dict(model.state_dict())
    assert (theirs.ref_model is not None) == (beta > 0) == (ours.ref_model is not None)

    prompts, completions, masks, old = make_inputs(model, len(tokenizer), pad_id, multi_turn)
    trajs = [
        Trajectory(
            task_id="t",
            messages=[],
            token_ids=p + c,
            loss_mask=[0] * PROMPT_LEN + m,
            logprobs=[0.0] * PROMPT_LEN + o,
            steps=[],
            finish_reason="answer",
        )
        for p, c, m, o in zip(prompts, completions, masks, old, strict=True)
    ]
    model.train()
    stats = ours.accumulate_gradients(trajs, ADVANTAGES)
    our_grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    width = max(COMPLETION_LENS)

    def right_pad(rows: list[list[Any]], value: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=dtype)

    prompt_ids = torch.tensor(prompts)
    completion_ids = right_pad(completions, pad_id, torch.long)
    completion_mask = right_pad([[1] * len(c) for c in completions], 0, torch.long)
    inputs: dict[str, Any] = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(ADVANTAGES),
        "old_per_token_logps": right_pad(old, 0.0, torch.float32),
    }
    if multi_turn:
        inputs["tool_mask"] = right_pad(masks, 1, torch.long)
    loss_mask = completion_mask * inputs.get("tool_mask", 1)
    inputs["num_items_in_batch"] = loss_mask.sum()
    if beta > 0:
        # trl's own reference model (loaded from the same directory) and its own log-prob path.
        for a, b in zip(theirs.ref_model.parameters(), ours.ref_model.parameters(), strict=True):
            assert torch.equal(a, b)
        with torch.no_grad():
            inputs["ref_per_token_logps"], _, _ = theirs._get_per_token_logps_and_entropies(
                theirs.ref_model,
                torch.cat([prompt_ids, completion_ids], dim=1),
                torch.cat([inputs["prompt_mask"], completion_mask], dim=1),
                width,
            )
    theirs.model.train()
    theirs.model.zero_grad(set_to_none=True)
    loss = theirs._compute_loss(theirs.model, inputs)
    loss.backward()

    assert stats["loss"] == pytest.approx(loss.item(), abs=1e-5)
    assert stats["clip_ratio"] > 0  # the clipped branch is exercised
    if beta > 0:
        assert stats["kl"] > 0
    for name, p in theirs.model.named_parameters():
        torch.testing.assert_close(our_grads[name], p.grad, atol=1e-5, rtol=0, msg=name)
    assert any(g.abs().max() > 1e-3 for g in our_grads.values())
