"""Partial reveals (`Task.hint`, AdaBack): the revealed start of the policy's first own turn.

The environment appends the hint as context (loss mask 0) and parses the policy's turn as hint +
what it wrote; the reference trajectory continues the hint and verifies; a hint that is not the
start of the reference's next turn is a `bad_prefix`; the hint is part of the task id and of the
store row; the `restart` generator's `reveal` cuts it from the reference's next turn and halves it
once the policy solves the task. Real environment, real arith tools, real DuckDB file."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

from generators import GenerationContext, Replay, RestartConfig, RestartGenerator
from generators.validate import validate_candidates
from sentinel.analyzer import FailureAnalyzer
from sentinel.env.environment import EnvConfig, Episode, replay
from sentinel.env.parser import format_answer, format_call
from sentinel.rewards import RewardConfig, score
from sentinel.tasks.prefix import prefix_problem
from sentinel.types import Task, Trajectory
from task_store import Store

ENV = EnvConfig(max_turns=4, max_tokens=256, max_turn_tokens=48)
REWARD = RewardConfig()
EXPR = "(3+4)*5"  # reference: 3+4 -> 7, 7*5 -> 35


def call(expression: str) -> str:
    return format_call("calculator", {"expression": expression})


def hinted(task: Task, hint: str, prefix: list[str] | None = None) -> Task:
    return dataclasses.replace(task, hint=hint, prefix=list(prefix or task.prefix), task_id="")


def test_the_hint_is_context_and_the_policy_turn_continues_it(chat, arith, parser) -> None:
    task = arith.make_task({"expr": EXPR})
    hint = call("3+4")[:20]
    episode = Episode(hinted(task, hint), arith.tool_map(task.spec), chat, parser, ENV,
                      random.Random(0))
    plain = Episode(task, arith.tool_map(task.spec), chat, parser, ENV, random.Random(0))
    n = len(chat.encode(hint))
    assert episode.token_ids == plain.token_ids + chat.encode(hint)
    assert episode.loss_mask[-n:] == [0] * n and episode.prefix_problem is None
    rest = chat.assistant_ids(call("3+4")[20:])
    episode.add_policy_turn(rest, [-0.5] * len(rest))
    (step,) = episode.steps
    # Parsed as one call: the hint and the policy's continuation together; the tool ran.
    assert (step.kind, step.tool, step.arguments, step.observation) == (
        "tool_call", "calculator", {"expression": "3+4"}, "7")
    assert step.text == call("3+4") and not step.revealed
    start = len(plain.token_ids) + n
    assert episode.loss_mask[start:start + len(rest)] == [1] * len(rest)
    # Only the first turn continues the hint: the next one is parsed on its own.
    episode.add_policy_turn(chat.assistant_ids(format_answer("35")), [0.0] * 4)
    assert episode.steps[-1].kind == "answer" and episode.answer == "35"


def test_the_reference_continues_the_hint_and_verifies(chat, arith, parser) -> None:
    task = arith.make_task({"expr": EXPR, "faults": [{"type": "timeout", "call": 0}]})
    # After the fault: the reference's next turn retries the call; half of it is revealed.
    prefix = [call("3+4")]
    nxt = call("3+4")
    task = hinted(task, nxt[: len(nxt) // 2], prefix)
    traj = arith.reference_trajectory(task, chat, parser, ENV)
    assert arith.verify_trajectory(task, traj)
    assert prefix_problem(arith, task, chat, parser, ENV) is None
    hint_ids = chat.encode(task.hint)
    start = traj.loss_mask.index(1)
    assert traj.token_ids[start - len(hint_ids):start] == hint_ids  # the hint, untrained
    # A hint the reference does not start its next turn with cannot be continued.
    wrong = hinted(task, format_answer("35")[:8], prefix)
    assert "is not the start of the reference's next turn" in prefix_problem(
        arith, wrong, chat, parser, ENV)
    (kept,), rejected = validate_candidates(
        [dataclasses.replace(c, hint=h) for c, h in
         ((_candidate(task), task.hint), (_candidate(task), wrong.hint))],
        generator="restart", families={"arith": arith}, known_task_ids=lambda ids: set(),
        round=1, replay=Replay(chat, parser, ENV))
    assert kept.hint == task.hint and kept.prefix == prefix
    assert [r.reason for r in rejected] == ["bad_prefix"]


def _candidate(task: Task) -> Any:
    from sentinel.types import Candidate

    return Candidate(family=task.family, spec=task.spec, prefix=list(task.prefix))


def test_the_hint_is_part_of_the_id_and_of_the_store_row(tmp_path: Path, arith) -> None:
    task = arith.make_task({"expr": EXPR})
    with_hint = hinted(task, "<tool_call>")
    assert with_hint.task_id != task.task_id
    assert hinted(with_hint, "").task_id == task.task_id
    assert Task.from_row(with_hint.to_row()) == with_hint
    store = Store.create(tmp_path / "s.duckdb", run_id="run-1", config={})
    store.record_round(0, {"round": 0, "heldout_success": 0.0, "heldout_greedy": None,
                           "train_success": None, "metrics": {}, "timings": {}},
                       tasks=[with_hint.to_row(), task.to_row()], trajectories=[], steps=[],
                       failures=[], rejections=[], evals=[], clusters=[])
    rows = {r["task_id"]: r for r in store.load_tasks()}
    assert Task.from_row(rows[with_hint.task_id]).hint == "<tool_call>"
    assert rows[task.task_id]["hint"] is None


def _failed(task: Task, turns: list[str], arith, chat, parser) -> tuple[Any, Trajectory]:
    traj = replay(task, turns, arith.tool_map(task.spec), chat, parser, ENV)
    traj.reward, traj.reward_terms, traj.success = score(task, traj, arith, REWARD)
    failure = FailureAnalyzer({"arith": arith}).classify(task, traj)
    assert failure is not None
    return failure, traj


def _generate(failures, tasks, trajs, arith, chat, parser, mastered=None, **options):
    ctx = GenerationContext(round=1, failures=failures, tasks={t.task_id: t for t in tasks},
                            families={"arith": arith}, rng=random.Random(0), budget=16,
                            mastered=mastered or [], trajectories={t.traj_id: t for t in trajs},
                            replay=Replay(chat, parser, ENV))
    return list(RestartGenerator(RestartConfig(**options)).generate(ctx))


def test_restart_reveal_cuts_the_hint_from_the_reference_and_halves_it(chat, arith,
                                                                       parser) -> None:
    task = arith.make_task({"expr": EXPR})
    # The copy error is in the second turn: the start state is the first turn, the reference's
    # next turn is the call 7*5; reveal 0.5 gives its first half as the hint.
    failure, traj = _failed(task, [call("3+4"), call("7*6"), format_answer("42")], arith, chat,
                            parser)
    (plain,) = _generate([failure], [task], [traj], arith, chat, parser)
    assert plain.hint == ""  # reveal is off by default
    (candidate,) = _generate([failure], [task], [traj], arith, chat, parser, reveal=0.5)
    nxt = call("7*5")
    assert candidate.prefix == [call("3+4")] and candidate.hint == nxt[: len(nxt) // 2]
    (accepted,), _ = validate_candidates([candidate], generator="restart",
                                         families={"arith": arith},
                                         known_task_ids=lambda ids: set(), round=1,
                                         replay=Replay(chat, parser, ENV))
    # Solved (mastered, rolled out this round): proposed again with the hint halved, then with
    # none once it would be shorter than min_hint, and then the prefix shrinks.
    ran = [replay(accepted, [nxt[len(accepted.hint):], format_answer("35")],
                  arith.tool_map(task.spec), chat, parser, ENV)]
    (halved,) = _generate([], [], ran, arith, chat, parser, mastered=[accepted], reveal=0.5)
    assert (halved.prefix, halved.hint) == (accepted.prefix, accepted.hint[: len(accepted.hint)
                                                                           // 2])
    (gone,) = _generate([], [], ran, arith, chat, parser, mastered=[accepted], reveal=0.5,
                        min_hint=len(accepted.hint))
    assert (gone.prefix, gone.hint) == (accepted.prefix, "")
    bare = hinted(accepted, "")
    ran = [replay(bare, [nxt, format_answer("35")], arith.tool_map(task.spec), chat, parser,
                  ENV)]
    (shorter,) = _generate([], [], ran, arith, chat, parser, mastered=[bare], reveal=0.5)
    assert (shorter.prefix, shorter.hint) == ([], "")
