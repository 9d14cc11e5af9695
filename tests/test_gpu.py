"""The CUDA paths: the static-cache sampler, a GRPO step under bf16 autocast and the loop, on a GPU.
Skipped where CUDA is absent (CI never has one); run on a lent GPU with `pytest -m gpu`."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from sentinel.rollout.hf import HFBackend
from sentinel.rollout.static import StaticEngine
from tests.test_static_engine import _contexts, _model, _Tok

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_static_engine_on_cuda_equals_generate_and_the_cpu(kind: str) -> None:
    """Greedy ids on the GPU equal transformers' generate there, and the CPU engine's; the
    log-probs agree to float32 kernel noise."""
    cpu = _model(kind)
    gpu = copy.deepcopy(cpu).to("cuda")
    contexts, budgets = _contexts(1)
    ours = StaticEngine.build(gpu, eos_id=1, pad_id=0).sample(contexts, budgets,
                                                             temperature=1.0, greedy=True)
    theirs = HFBackend(gpu, _Tok(), batch_size=64, engine="generate").sample(
        contexts, budgets, temperature=1.0, greedy=True)
    on_cpu = StaticEngine.build(cpu, eos_id=1, pad_id=0).sample(contexts, budgets,
                                                               temperature=1.0, greedy=True)
    for (ids, lps), (ref_ids, ref_lps), (cpu_ids, _) in zip(ours, theirs, on_cpu, strict=True):
        assert ids == ref_ids == cpu_ids
        assert lps == pytest.approx(ref_lps, abs=1e-3)


def test_grpo_step_on_cuda_in_bf16_matches_the_cpu_step(tiny_model) -> None:
    """One GRPO step with `bf16: auto` (autocast on the GPU) moves the weights as the float32
    CPU step does, to bf16 precision, with finite metrics."""
    from tests.test_trainers import PAD, grouped_batch
    from trainers import GRPOConfig, GRPOTrainer

    adv = [1.0, -1.0, 0.5, -0.5, 0.8, -0.2, -0.3, -0.3, 0.6, 0.4, -0.7, -0.3]
    cpu = copy.deepcopy(tiny_model)
    trajs = grouped_batch(cpu, 1.0)
    gpu = copy.deepcopy(cpu).to("cuda")
    cfg = GRPOConfig(lr=1e-3, temperature=1.0, max_grad_norm=1e9, bf16="auto")
    before = torch.cat([p.detach().flatten() for p in cpu.parameters()]).clone()
    m_cpu = GRPOTrainer(cpu, cfg, PAD).step(trajs, adv)
    m_gpu = GRPOTrainer(gpu, cfg, PAD).step(trajs, adv)
    d_cpu = torch.cat([p.detach().flatten() for p in cpu.parameters()]) - before
    d_gpu = torch.cat([p.detach().flatten().cpu() for p in gpu.parameters()]) - before
    assert all(torch.isfinite(torch.tensor(v)) for v in m_gpu.values())
    assert m_gpu["loss"] == pytest.approx(m_cpu["loss"], abs=2e-2)
    # Adam's first step is ~lr * sign(g): the same direction on almost every coordinate.
    agree = ((d_cpu.sign() == d_gpu.sign()) | (d_cpu.abs() < 1e-6)).float().mean()
    assert agree > 0.95


@pytest.mark.slow
def test_the_fast_loop_on_cuda_commits_its_round(tmp_path: Path) -> None:
    from sentinel.config import load_config
    from sentinel.loop import Loop
    from task_store import Store
    from tests.test_loop_fast import config

    cfg = config()
    cfg["policy"]["device"] = "cuda"
    Loop(load_config(data=cfg), tmp_path).run()
    store = Store(tmp_path / "sentinel.duckdb")
    assert store.completed_rounds() == [0, 1]
