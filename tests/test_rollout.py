"""The `hf` rollout backend and the episode driver, on the real tiny policy."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig, Episode
from sentinel.env.parser import HermesParser
from sentinel.env.tools import tool_schema
from sentinel.rollout import run_episodes
from sentinel.rollout.hf import HFBackend
from sentinel.tasks.arith import ArithFamily
from trainers.common import pad_batch, token_logprobs


@pytest.fixture(scope="module")
def backend(tiny_model: Any, tokenizer: Any) -> HFBackend:
    return HFBackend(tiny_model, tokenizer, batch_size=4)


@pytest.fixture(scope="module")
def contexts(chat: ChatFormat, arith: ArithFamily) -> list[list[int]]:
    """Prompts of different lengths, so the backend has to left-pad."""
    schemas = [tool_schema(t) for t in arith.tools()]
    out = [chat.prompt_ids(arith.render({"expr": e}), schemas) for e in ("3+4", "(12+7)*3-5")]
    out.append(chat.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"))
    assert len({len(c) for c in out}) == 3
    return out


def test_greedy_is_deterministic(backend: HFBackend, contexts: list[list[int]]) -> None:
    budgets = [12, 12, 12]
    first = backend.sample(contexts, budgets, temperature=0.7, greedy=True)
    second = backend.sample(contexts, budgets, temperature=0.7, greedy=True)
    assert [ids for ids, _ in first] == [ids for ids, _ in second]
    for ids, logprobs in first:
        assert 1 <= len(ids) <= 12 and len(logprobs) == len(ids)
        assert all(lp <= 0.0 for lp in logprobs)


def test_greedy_matches_argmax(backend: HFBackend, tiny_model: Any,
                               contexts: list[list[int]]) -> None:
    ctx = contexts[0]
    ((ids, _),) = backend.sample([ctx], [3], temperature=1.0, greedy=True)
    with torch.no_grad():
        logits = tiny_model(input_ids=torch.tensor([ctx])).logits[0, -1]
    assert ids[0] == int(logits.argmax())


def test_sampled_logprobs_match_recomputed(backend: HFBackend, tiny_model: Any,
                                           contexts: list[list[int]]) -> None:
    temperature = 0.7
    torch.manual_seed(0)
    outputs = backend.sample(contexts, [10, 10, 10], temperature=temperature, greedy=False)
    seqs = [ctx + ids for ctx, (ids, _) in zip(contexts, outputs, strict=True)]
    batch = pad_batch(seqs, pad_id=backend.pad_id)
    with torch.no_grad():
        fresh = token_logprobs(tiny_model, batch["input_ids"], batch["attention_mask"],
                               temperature)
    for row, (ctx, (ids, logprobs)) in enumerate(zip(contexts, outputs, strict=True)):
        assert len(ids) == len(logprobs) >= 1
        expected = fresh[row, len(ctx):len(ctx) + len(ids)]
        assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-4), row


def test_greedy_logprobs_are_at_temperature_one(backend: HFBackend, tiny_model: Any,
                                                contexts: list[list[int]]) -> None:
    ctx = contexts[1]
    ((ids, logprobs),) = backend.sample([ctx], [6], temperature=0.5, greedy=True)
    batch = pad_batch([ctx + ids], pad_id=backend.pad_id)
    with torch.no_grad():
        fresh = token_logprobs(tiny_model, batch["input_ids"], batch["attention_mask"], 1.0)
    assert torch.allclose(torch.tensor(logprobs), fresh[0, len(ctx):], atol=1e-4)


def test_outputs_cut_at_eos_and_budget(backend: HFBackend, contexts: list[list[int]]) -> None:
    torch.manual_seed(1)
    budgets = [1, 5, 0]
    outputs = backend.sample(contexts * 4, budgets * 4, temperature=1.5, greedy=False)
    assert len(outputs) == 12
    for (ids, logprobs), budget in zip(outputs, budgets * 4, strict=True):
        assert len(ids) == len(logprobs) <= budget
        if budget == 0:
            assert ids == [] and logprobs == []
        else:
            assert len(ids) >= 1
        if backend.eos_id in ids:
            assert ids.index(backend.eos_id) == len(ids) - 1  # nothing after eos
        else:
            assert len(ids) == budget  # without eos only the budget stops a turn


def test_eos_cut_with_a_model_that_always_ends(tiny_model: Any, tokenizer: Any,
                                               contexts: list[list[int]]) -> None:
    """A copy of the model with an lm_head bias that favours eos: every turn is exactly [eos]."""
    import copy

    model = copy.deepcopy(tiny_model)
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 100.0
    model.lm_head = head
    backend = HFBackend(model, tokenizer)
    for ids, logprobs in backend.sample(contexts, [8, 8, 8], temperature=1.0, greedy=False):
        assert ids == [tokenizer.eos_token_id]
        assert len(logprobs) == 1 and logprobs[0] > -1e-3


def test_run_episodes_finishes_every_episode(backend: HFBackend, chat: ChatFormat,
                                             arith: ArithFamily) -> None:
    rng = random.Random(0)
    tasks = [arith.sample_task(rng) for _ in range(3)]
    config = EnvConfig(max_turns=2, max_turn_tokens=8, max_tokens=160)
    episodes = [Episode(t, arith.tool_map(), chat, HermesParser(), config, random.Random(i))
                for i, t in enumerate(tasks)]
    progress: list[int] = []
    torch.manual_seed(0)
    run_episodes(backend, episodes, temperature=1.0, on_turn=progress.append)
    assert all(e.done for e in episodes)
    assert progress and progress[-1] == 3 and progress == sorted(progress)
    for e in episodes:
        assert e.finish_reason in {"answer", "stop", "max_turns", "max_tokens"}
        assert 1 <= e.turns <= 2
        assert len(e.token_ids) == len(e.loss_mask) == len(e.logprobs)
        assert len(e.token_ids) <= config.max_tokens + 64  # only observations may overshoot
        assert sum(e.loss_mask) <= e.turns * config.max_turn_tokens
        traj = e.trajectory()
        assert traj.n_policy_tokens == sum(e.loss_mask) >= 1


def test_run_episodes_with_no_budget_ends_by_tokens(backend: HFBackend, chat: ChatFormat,
                                                    arith: ArithFamily) -> None:
    task = arith.make_task({"expr": "3+4"})
    episode = Episode(task, arith.tool_map(), chat, HermesParser(),
                      EnvConfig(max_tokens=16), random.Random(0))
    assert episode.turn_budget() == 0  # the prompt alone exceeds the episode budget
    run_episodes(backend, [episode], temperature=1.0)
    assert episode.done and episode.finish_reason == "max_tokens" and episode.turns == 0


def test_batch_metrics_and_pass_rates_on_hand_made_rollouts() -> None:
    from sentinel.rollout import batch_metrics, pass_rates
    from sentinel.types import Trajectory

    def traj(task_id: str, reward: float, success: bool, policy_tokens: int) -> Trajectory:
        return Trajectory(task_id, [], [0] * 9, [0] * (9 - policy_tokens) + [1] * policy_tokens,
                          [], [], "answer", reward=reward, success=success)

    trajs = [traj("a", 1.2, True, 4), traj("a", 0.2, False, 2), traj("b", 0.4, False, 6),
             traj("b", 0.2, False, 4)]
    metrics = batch_metrics(trajs)
    assert metrics["reward"] == pytest.approx(0.5)
    assert metrics["reward_std"] == pytest.approx(0.4123105626)  # population std
    assert metrics["success"] == pytest.approx(0.25)
    assert metrics["completions/mean_length"] == pytest.approx(4.0)
    assert pass_rates(trajs) == {"a": 0.5, "b": 0.0}
