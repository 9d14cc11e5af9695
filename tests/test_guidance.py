"""Off-policy reference guidance (`curriculum.reference_guidance`, `sentinel.guidance`): an
all-failed group of an eligible task trains on the task's verified reference in place of its
first rollout, with the policy's own log-probs as the reference's "old" ones; the stored
rollouts stay the policy's. Real tiny policy, real environment and arith tools, real trainer."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
import torch

from sentinel.config import ConfigError, load_config
from sentinel.env.environment import EnvConfig, Episode
from sentinel.env.parser import format_answer, format_call
from sentinel.guidance import guide
from sentinel.rewards import RewardConfig, score
from sentinel.types import Task, Trajectory
from trainers import GRPOConfig, GRPOTrainer
from trainers.grpo import group_advantages

ENV = EnvConfig(max_turns=4, max_tokens=256, max_turn_tokens=48)
REWARD = RewardConfig()
TEMPERATURE = 0.7


def rollout(task: Task, arith: Any, chat: Any, parser: Any, turns: list[str], k: int,
            group: str) -> Trajectory:
    """A scored 'rollout' of scripted turns (log-probs -1 per token, as a sampler records)."""
    episode = Episode(task, arith.tool_map(task.spec), chat, parser, ENV, random.Random(k))
    for text in turns:
        if episode.done:
            break
        ids = chat.assistant_ids(text)
        episode.add_policy_turn(ids, [-1.0] * len(ids))
    traj = episode.trajectory(round=1, split="train", sample_idx=k, group_id=group)
    traj.reward, traj.reward_terms, traj.success = score(task, traj, arith, REWARD)
    return traj


def failed_group(task: Task, arith: Any, chat: Any, parser: Any, group: str,
                 n: int = 4) -> list[Trajectory]:
    return [rollout(task, arith, chat, parser, [format_answer(str(100 + k))], k, group)
            for k in range(n)]


def run_guide(trajs: list[Trajectory], admitted: list[Trajectory], tasks: list[Task], arith: Any,
              chat: Any, parser: Any, model: Any, mode: str) -> tuple[list[Trajectory], int]:
    return guide(trajs, admitted, {t.task_id: t for t in tasks}, {"arith": arith}, chat=chat,
                 parser=parser, env=ENV, reward=REWARD, model=model, temperature=TEMPERATURE,
                 mode=mode)  # type: ignore[arg-type]


def test_an_all_failed_group_trains_on_the_reference_in_place_of_its_first_rollout(
        tiny_model: Any, chat: Any, arith: Any, parser: Any) -> None:
    task = arith.make_task({"expr": "(3+4)*5"}, origin="generated")
    group = failed_group(task, arith, chat, parser, "g")
    assert not any(t.success for t in group)
    before = [(t.traj_id, list(t.token_ids)) for t in group]
    # The gate dropped the group (no variance): guidance brings it back with the reference.
    batch, n = run_guide(group, [], [task], arith, chat, parser, tiny_model, "mined")
    assert n == 1 and len(batch) == 4
    ref, rest = batch[0], batch[1:]
    assert rest == group[1:] and all(a is b for a, b in zip(rest, group[1:], strict=True))
    expected = arith.reference_trajectory(task, chat, parser, ENV)
    assert ref.token_ids == expected.token_ids and ref.loss_mask == expected.loss_mask
    assert ref.success and ref.reward > max(t.reward for t in group)
    assert (ref.group_id, ref.sample_idx, ref.round, ref.split) == ("g", 0, 1, "train")
    assert ref.traj_id not in {t.traj_id for t in group}
    # The rollouts themselves (what the store keeps) are untouched.
    assert [(t.traj_id, list(t.token_ids)) for t in group] == before
    # The reference's old log-probs are the policy's, at the sampling temperature, on trained
    # tokens only: computed here straight from the logits.
    ids = torch.tensor([ref.token_ids])
    with torch.no_grad():
        logits = tiny_model(input_ids=ids).logits[0, :-1].float() / TEMPERATURE
    own = logits.log_softmax(-1).gather(1, ids[0, 1:, None])[:, 0]
    want = [0.0] + [float(v) if m else 0.0 for v, m in zip(own, ref.loss_mask[1:], strict=True)]
    assert sum(ref.loss_mask) > 0
    assert torch.allclose(torch.tensor(ref.logprobs), torch.tensor(want), atol=1e-4)


def test_which_groups_are_guided(tiny_model: Any, chat: Any, arith: Any, parser: Any) -> None:
    seed_task = arith.make_task({"expr": "2+9"})
    mined = arith.make_task({"expr": "7*6"}, origin="generated")
    solved = arith.make_task({"expr": "8-3"}, origin="generated")
    a = failed_group(seed_task, arith, chat, parser, "a")
    b = failed_group(mined, arith, chat, parser, "b")
    win = [format_call("calculator", {"expression": "8-3"}), format_answer("5")]
    c = [rollout(solved, arith, chat, parser, win, 0, "c"),
         *failed_group(solved, arith, chat, parser, "c")[1:]]
    assert c[0].success
    trajs, tasks = a + b + c, [seed_task, mined, solved]
    # Admitted: c (it has a success) and b (say its rewards varied); a was dropped.
    admitted = c + b

    batch, n = run_guide(trajs, admitted, tasks, arith, chat, parser, tiny_model, "off")
    assert (batch, n) == (admitted, 0)
    # 'mined': only the generated task's all-failed group; c (one success) is left alone, and
    # the admitted groups keep their order.
    batch, n = run_guide(trajs, admitted, tasks, arith, chat, parser, tiny_model, "mined")
    assert n == 1
    assert batch[:4] == c and batch[5:] == b[1:] and batch[4].success
    assert batch[4].group_id == "b" and len(batch) == 8
    # 'all': the seed task's dropped group comes back too, after the admitted ones.
    batch, n = run_guide(trajs, admitted, tasks, arith, chat, parser, tiny_model, "all")
    assert n == 2 and len(batch) == 12
    assert [t.group_id for t in batch] == ["c"] * 4 + ["b"] * 4 + ["a"] * 4
    assert batch[8].success and batch[9:] == a[1:]


def test_one_guided_update_raises_the_references_log_prob(
        tiny_model: Any, tokenizer: Any, chat: Any, arith: Any, parser: Any) -> None:
    model = copy.deepcopy(tiny_model)
    task = arith.make_task({"expr": "(3+4)*5"}, origin="generated")
    group = failed_group(task, arith, chat, parser, "g")
    batch, _ = run_guide(group, [], [task], arith, chat, parser, model, "mined")
    adv = group_advantages([t.reward for t in batch], [t.group_id for t in batch])
    assert adv[0] > 0 and all(a < 0 for a in adv[1:])  # the reference is the one to move toward
    ref = batch[0]

    def ref_logprob() -> float:
        ids = torch.tensor([ref.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float() / TEMPERATURE
        own = logits.log_softmax(-1).gather(1, ids[0, 1:, None])[:, 0]
        return float(sum(v for v, m in zip(own, ref.loss_mask[1:], strict=True) if m))

    start = ref_logprob()
    trainer = GRPOTrainer(model, GRPOConfig(lr=1e-3, temperature=TEMPERATURE, warmup_steps=0),
                          tokenizer.pad_token_id)
    trainer.update(batch)
    assert ref_logprob() > start + 0.1


def test_guidance_needs_the_native_trainer() -> None:
    with pytest.raises(ConfigError, match="reference_guidance"):
        load_config(data={"rounds": 1, "curriculum": {"reference_guidance": "mined"},
                          "trainer": {"backend": "verl"}})
    cfg = load_config(data={"rounds": 1, "curriculum": {"reference_guidance": "all"}})
    assert cfg.curriculum.reference_guidance == "all"
    with pytest.raises(ConfigError, match="reference_guidance"):
        load_config(data={"rounds": 1, "curriculum": {"reference_guidance": "some"}})


def test_the_loop_trains_on_the_guided_batch_and_stores_the_rollouts(tmp_path) -> None:
    """`Loop.run` with `reference_guidance: all` after the fast loop's 40-step cold start, where
    no sample succeeds yet: every group is guided, the trainer's `n_tokens` counts each group's
    reference in place of its first rollout, and the store holds the policy's rollouts only."""
    from sentinel.env.chat import ChatFormat
    from sentinel.env.parser import HermesParser
    from sentinel.policy import load_policy
    from sentinel.tasks import load_family
    from task_store import Store
    from tests.test_loop_fast import GROUP, TASKS, config, round_metrics, run_loop

    cfg = config()
    cfg["curriculum"] = {"reference_guidance": "all"}
    run_loop(cfg, tmp_path)
    store = Store(tmp_path / "sentinel.duckdb")
    rows = store.query("SELECT task_id, sample_idx, success, list_sum(loss_mask), traj_id "
                       "FROM trajectories WHERE round = 1 AND split = 'train'")[1]
    assert len(rows) == TASKS * GROUP and not any(r[2] for r in rows)
    assert not any(r[4].startswith("ref") for r in rows)
    metrics = round_metrics(tmp_path, 1)
    assert metrics["curriculum/guided_groups"] == TASKS
    arith = load_family("arith")
    chat, parser = ChatFormat(load_policy(tmp_path / "policy")[1]), HermesParser()
    env = EnvConfig(**cfg["env"])
    tasks = [Task.from_row(r) for r in store.load_tasks(task_ids={r[0] for r in rows})]
    assert len(tasks) == TASKS
    references = sum(sum(arith.reference_trajectory(t, chat, parser, env).loss_mask)
                     for t in tasks)
    rollouts = sum(int(r[3]) for r in rows if r[1] != 0)
    assert metrics["n_tokens"] == rollouts + references
