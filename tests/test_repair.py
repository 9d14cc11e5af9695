"""Supervised repair after a round (`repair`, `Loop.repair_examples`, `Loop._repair`): which
training tasks' references are trained on, how many of the others are replayed beside them, and
that the loop's repair steps really train the policy on them. Real tiny policy, real environment
and arith tools, real SFT trainer and store."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sentinel.config import ConfigError, load_config
from sentinel.env.environment import EnvConfig, Episode
from sentinel.env.parser import format_answer, format_call
from sentinel.loop import Loop
from sentinel.record import RoundRecord
from sentinel.rewards import RewardConfig, score
from sentinel.types import Task, Trajectory

ENV = {"max_turns": 4, "max_tokens": 256, "max_turn_tokens": 48}


def loop(tmp_path: Path, **repair: Any) -> Loop:
    cfg = load_config(data={"rounds": 1, "env": ENV, "generators": [],
                            "repair": {"epochs": 1, **repair}})
    return Loop(cfg, tmp_path)


def rollouts_of(task: Task, arith: Any, chat: Any, parser: Any, wins: int, n: int = 4,
                round: int = 1) -> list[Trajectory]:
    """`n` scored rollouts of `task`, the first `wins` of them solving it (a call, then the
    answer), the rest answering wrong."""
    env = EnvConfig(**ENV)
    value = arith.solve(task.spec, arith.tool_map(task.spec)).answer
    out = []
    for k in range(n):
        turns = ([format_call("calculator", {"expression": task.spec["expr"]}),
                  format_answer(value)] if k < wins else [format_answer("-999")])
        episode = Episode(task, arith.tool_map(task.spec), chat, parser, env, random.Random(k))
        for text in turns:
            ids = chat.assistant_ids(text)
            episode.add_policy_turn(ids, [-1.0] * len(ids))
        traj = episode.trajectory(round=round, split="train", sample_idx=k, group_id=task.task_id)
        traj.reward, traj.reward_terms, traj.success = score(task, traj, arith, RewardConfig())
        assert traj.success == (k < wins)
        out.append(traj)
    return out


def record_of(groups: list[tuple[Task, list[Trajectory]]]) -> RoundRecord:
    record = RoundRecord(round=1)
    for task, trajs in groups:
        record.tasks[task.task_id] = task
        record.trajectories += trajs
    return record


@pytest.fixture
def tasks(arith: Any) -> dict[str, Task]:
    return {"never": arith.make_task({"expr": "7*6"}),
            "once": arith.make_task({"expr": "8-3"}, origin="generated"),
            "half": arith.make_task({"expr": "2+9"}, origin="generated"),
            "always": arith.make_task({"expr": "9+4"})}


@pytest.fixture
def record(tasks: dict[str, Task], arith: Any, chat: Any, parser: Any) -> RoundRecord:
    wins = {"never": 0, "once": 1, "half": 2, "always": 4}
    return record_of([(t, rollouts_of(t, arith, chat, parser, wins[k])) for k, t in tasks.items()])


def reference(task: Task, arith: Any, chat: Any, parser: Any) -> tuple[list[int], list[int]]:
    ref = arith.reference_trajectory(task, chat, parser, EnvConfig(**ENV))
    return ref.token_ids, ref.loss_mask


def test_the_repair_set_is_the_failed_tasks_references_by_pass_rate_and_origin(
        tmp_path: Path, tasks: dict[str, Task], record: RoundRecord, arith: Any, chat: Any,
        parser: Any) -> None:
    io = SimpleNamespace(chat=chat, parser=parser)
    ref = {k: reference(t, arith, chat, parser) for k, t in tasks.items()}
    by_id = sorted(tasks, key=lambda k: tasks[k].task_id)

    def failed_refs(names: set[str]) -> list[tuple[list[int], list[int]]]:
        return [ref[k] for k in by_id if k in names]

    # Only the task no rollout solved, by default; nothing else without replay.
    examples, failed, unverified = loop(tmp_path / "a", replay=0.0).repair_examples(record, io)
    assert (failed, unverified) == (1, 0) and examples == [ref["never"]]
    # Up to a pass rate of 1/4 the task solved once comes in too; at 1/2 the half-solved one.
    examples, failed, _ = loop(tmp_path / "b", replay=0.0, max_pass_rate=0.25).repair_examples(
        record, io)
    assert failed == 2 and examples == failed_refs({"never", "once"})
    examples, failed, _ = loop(tmp_path / "c", replay=0.0, max_pass_rate=0.5).repair_examples(
        record, io)
    assert failed == 3 and examples == failed_refs({"never", "once", "half"})
    # `tasks: mined`: of those, only the generated ones.
    examples, failed, _ = loop(tmp_path / "d", replay=0.0, max_pass_rate=0.5,
                               tasks="mined").repair_examples(record, io)
    assert failed == 2 and examples == failed_refs({"once", "half"})


def test_replay_adds_that_many_of_the_other_tasks_references(
        tmp_path: Path, tasks: dict[str, Task], record: RoundRecord, arith: Any, chat: Any,
        parser: Any) -> None:
    io = SimpleNamespace(chat=chat, parser=parser)
    ref = {k: reference(t, arith, chat, parser) for k, t in tasks.items()}
    others = [ref["once"], ref["half"], ref["always"]]
    examples, failed, _ = loop(tmp_path / "a", replay=2.0).repair_examples(record, io)
    assert failed == 1 and examples[0] == ref["never"] and len(examples) == 3
    assert all(e in others for e in examples[1:]) and examples[1] != examples[2]
    examples, _, _ = loop(tmp_path / "b", replay=10.0).repair_examples(record, io)
    assert len(examples) == 4  # capped by the other tasks there are
    # The draw is the round's: the same record gives the same set.
    again, _, _ = loop(tmp_path / "c", replay=2.0).repair_examples(record, io)
    assert again == loop(tmp_path / "d", replay=2.0).repair_examples(record, io)[0]


def test_repair_needs_the_native_trainer_and_sane_keys() -> None:
    with pytest.raises(ConfigError, match="repair"):
        load_config(data={"repair": {"epochs": 1}, "trainer": {"backend": "verl"}})
    with pytest.raises(ConfigError, match=r"repair\.max_pass_rate"):
        load_config(data={"repair": {"epochs": 1, "max_pass_rate": 1.0}})
    with pytest.raises(ConfigError, match=r"repair\.tasks"):
        load_config(data={"repair": {"tasks": "some"}})
    assert load_config(data={}).repair.epochs == 0


def test_the_loops_repair_trains_the_policy_on_the_failed_references(tmp_path: Path) -> None:
    """The fast loop (no sample succeeds after its 40-step cold start) with and without
    `repair`: with it, the round's metrics count every training task as failed and the saved
    policy gives their references a higher log-likelihood than the run without repair."""
    from sentinel.env.chat import ChatFormat
    from sentinel.env.parser import HermesParser
    from sentinel.policy import load_policy
    from sentinel.tasks import load_family
    from task_store import Store
    from tests.test_loop_fast import TASKS, config, round_metrics, run_loop

    plain, repaired = tmp_path / "plain", tmp_path / "repaired"
    cfg = config()
    run_loop(cfg, plain)
    run_loop({**cfg, "repair": {"epochs": 3, "lr": 3e-3, "replay": 0.0}}, repaired)
    metrics = round_metrics(repaired, 1)
    assert metrics["repair/failed"] == metrics["repair/examples"] == TASKS
    assert metrics["repair/steps"] == 3  # 8 examples fit one batch of 32: one step per epoch
    assert "repair/failed" not in round_metrics(plain, 1)

    store = Store(repaired / "sentinel.duckdb")
    ids = {r[0] for r in store.query("SELECT DISTINCT task_id FROM trajectories WHERE round = 1 "
                                     "AND split = 'train'")[1]}
    tasks = [Task.from_row(r) for r in store.load_tasks(task_ids=ids)]
    arith, parser, env = load_family("arith"), HermesParser(), EnvConfig(**cfg["env"])

    def nll(run_dir: Path) -> float:
        model, tokenizer = load_policy(run_dir / "policy")
        chat, total = ChatFormat(tokenizer), 0.0
        for task in tasks:
            ref = arith.reference_trajectory(task, chat, parser, env)
            ids = torch.tensor([ref.token_ids])
            with torch.no_grad():
                logp = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
            own = logp.gather(1, ids[0, 1:, None])[:, 0]
            total -= float(sum(v for v, m in zip(own, ref.loss_mask[1:], strict=True) if m))
        return total

    assert nll(repaired) < nll(plain) - 1.0
