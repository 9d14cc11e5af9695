"""The static-cache sampler against transformers: same greedy tokens as `generate`, and log-probs
equal to a full forward over the sampled sequence, for Llama and for Qwen2/Qwen3-shaped models
(q/k/v biases, grouped-query attention, q/k norms)."""

from __future__ import annotations

import random

import pytest
import torch

from sentinel.rollout.hf import HFBackend
from sentinel.rollout.static import StaticEngine


def _model(kind: str):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    common = dict(vocab_size=61, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=256, pad_token_id=0,
                  eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_key_value_heads=4, tie_word_embeddings=True,
                                             **common))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=2, tie_word_embeddings=False,
                                             **common))
        for layer in model.model.layers:  # non-zero q/k/v biases, so they are exercised
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    elif kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(num_key_value_heads=2, head_dim=16, **common))
        for layer in model.model.layers:
            torch.nn.init.normal_(layer.self_attn.q_norm.weight, mean=1.0, std=0.3)
    else:
        model = MistralForCausalLM(MistralConfig(num_key_value_heads=2, sliding_window=None,
                                                 **common))
    return model.eval()


def _contexts(seed: int, shared: int = 0) -> tuple[list[list[int]], list[int]]:
    """Contexts of 2-19 random tokens (some repeated: the fan-out path), after a prefix of
    `shared` tokens common to all (with `shared`, one context is the prefix and one token)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 61) for _ in range(shared)]
    base = [prefix + [rng.randrange(3, 61) for _ in range(rng.randrange(2, 20))]
            for _ in range(5)]
    if shared:
        base[4] = [*prefix, 7]
    contexts = [*base, base[0], base[0], base[3]]  # shared contexts take the fan-out path
    budgets = [rng.randrange(1, 12) for _ in contexts]
    return contexts, budgets


def _full_logprobs(model, ctx: list[int], new: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([ctx + new])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(ctx) - 1:-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(new)[:, None]).squeeze(-1).tolist()


@pytest.mark.parametrize("shared", [0, 24], ids=["own", "shared-prefix"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral"])
def test_greedy_matches_generate(kind, shared):
    """Greedy outputs and log-probs equal `generate`'s, with and without a prefix common to
    every context (prefilled once for all)."""
    model = _model(kind)
    contexts, budgets = _contexts(1, shared)
    engine = StaticEngine.build(model, eos_id=1, pad_id=0)
    assert engine is not None
    ours = engine.sample(contexts, budgets, temperature=1.0, greedy=True)
    reference = HFBackend(model, _Tok(), batch_size=64, engine="generate").sample(
        contexts, budgets, temperature=1.0, greedy=True)
    for (ids, lps), (ref_ids, ref_lps) in zip(ours, reference, strict=True):
        assert ids == ref_ids
        assert lps == pytest.approx(ref_lps, abs=1e-4)


@pytest.mark.parametrize("shared", [0, 24], ids=["own", "shared-prefix"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_sampled_logprobs_equal_a_full_forward(kind, shared):
    model = _model(kind)
    contexts, budgets = _contexts(2, shared)
    torch.manual_seed(3)
    outs = StaticEngine.build(model, eos_id=1, pad_id=0).sample(
        contexts, budgets, temperature=0.8, greedy=False)
    lengths = set()
    for ctx, budget, (ids, lps) in zip(contexts, budgets, outs, strict=True):
        assert 1 <= len(ids) <= budget
        assert 1 not in ids[:-1]  # nothing after the first eos
        assert lps == pytest.approx(_full_logprobs(model, ctx, ids, 0.8), abs=1e-4)
        lengths.add(len(ids))
    assert len(lengths) > 1  # rows ended at different steps: the compaction path ran


def test_samples_of_a_shared_context_differ_and_follow_the_distribution():
    """The fan-out copies the prompt's cache, not the random draws: samples of one context
    differ, and the first token's frequency tracks its model probability."""
    model = _model("llama")
    ctx = [5, 9, 11, 4]
    torch.manual_seed(0)
    outs = StaticEngine.build(model, eos_id=1, pad_id=0).sample(
        [ctx] * 2000, [1] * 2000, temperature=1.0, greedy=False)
    firsts = [ids[0] for ids, _ in outs]
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([ctx])).logits[0, -1], -1)
    top = int(probs.argmax())
    assert len(set(firsts)) > 5
    assert firsts.count(top) / 2000 == pytest.approx(float(probs[top]), abs=0.04)


def test_unsupported_models_fall_back_to_generate():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=61, n_embd=32, n_layer=1, n_head=2)).eval()
    assert StaticEngine.build(gpt2, eos_id=1, pad_id=0) is None
    backend = HFBackend(gpt2, _Tok(), batch_size=8)
    assert backend.engine is None
    (ids, lps), = backend.sample([[5, 6, 7]], [3], temperature=1.0, greedy=True)
    assert len(ids) == len(lps) <= 3


def test_backend_uses_the_static_engine_for_llama():
    assert isinstance(HFBackend(_model("llama"), _Tok(), batch_size=8).engine, StaticEngine)
    with pytest.raises(ValueError, match="static"):
        HFBackend(_model("llama"), _Tok(), batch_size=8, engine="bogus")


class _Tok:
    eos_token_id, pad_token_id = 1, 0
