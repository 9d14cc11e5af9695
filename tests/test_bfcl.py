"""The `bfcl` family: BFCL v4 multi-turn entries as multi-turn episodes with the real API classes,
judged by BFCL's own state and response checkers. The done criterion (every `multi_turn_base`
reference verifies, and fails with its last call dropped) runs on a sample here and on all
entries in the slow test."""

from __future__ import annotations

import random

import pytest

from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig, Episode, FaultConfig, replay
from sentinel.env.parser import HermesParser, format_answer, format_call
from sentinel.env.tools import BadArguments
from sentinel.policy import build_tokenizer
from sentinel.tasks import load_family
from sentinel.tasks.bfcl import BFCLFamily, load_category
from sentinel.types import Task, Trajectory

pytest.importorskip("bfcl_eval")


@pytest.fixture(scope="module")
def family() -> BFCLFamily:
    fam = load_family("bfcl", {"categories": list(("multi_turn_base", "multi_turn_miss_param",
                                                   "multi_turn_long_context"))})
    assert isinstance(fam, BFCLFamily)
    return fam


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(build_tokenizer())


def _reference(family: BFCLFamily, task: Task, chat: ChatFormat,
               drop_last_call: bool = False) -> Trajectory:
    turns = family.solve(task.spec, family.tool_map(task.spec)).assistant_turns()
    if drop_last_call:
        last = max(i for i, t in enumerate(turns) if t.startswith("<tool_call>"))
        turns = turns[:last] + turns[last + 1:]
    return replay(task, turns, family.tool_map(task.spec), chat, HermesParser(),
                  EnvConfig(), follow_ups=family.follow_up_turns(task.spec))


def _done_criterion(family: BFCLFamily, chat: ChatFormat, ids: list[str]) -> tuple[int, int]:
    verified = refused = 0
    for entry_id in ids:
        task = family.make_task({"id": entry_id})
        verified += family.verify_trajectory(task, _reference(family, task, chat))
        refused += not family.verify_trajectory(task, _reference(family, task, chat, True))
    return verified, refused


def test_done_criterion_on_a_sample(family: BFCLFamily, chat: ChatFormat) -> None:
    for category in ("multi_turn_base", "multi_turn_miss_param", "multi_turn_long_context"):
        ids = random.Random(0).sample(sorted(load_category(category)), 6)
        assert _done_criterion(family, chat, ids) == (6, 6), category


@pytest.mark.slow
def test_done_criterion_on_every_multi_turn_base_entry(family: BFCLFamily,
                                                       chat: ChatFormat) -> None:
    ids = sorted(load_category("multi_turn_base"))
    assert len(ids) == 200
    assert _done_criterion(family, chat, ids) == (200, 200)  # docs/families.md quotes this


def test_user_turns_follow_each_closed_turn(family: BFCLFamily, chat: ChatFormat) -> None:
    task = family.make_task({"id": "multi_turn_base_0"})
    traj = _reference(family, task, chat)
    questions = load_category("multi_turn_base")["multi_turn_base_0"]["question"]
    users = [m["content"] for m in traj.messages if m["role"] == "user"]
    assert users == [turn[0]["content"] for turn in questions]
    assert [s.kind for s in traj.steps].count("answer") == len(questions)
    assert traj.finish_reason == "answer"
    assert task.skills == ["api:GorillaFileSystem", "api:TwitterAPI", "category:base", "turns:4"]
    assert task.difficulty == 10.0


def test_episode_stops_at_a_turn_without_follow_ups(family: BFCLFamily,
                                                    chat: ChatFormat) -> None:
    task = family.make_task({"id": "multi_turn_base_0"})
    episode = Episode(task, family.tool_map(task.spec), chat, HermesParser(),
                      EnvConfig(max_tokens=1 << 16), random.Random(0),
                      follow_ups=family.follow_up_turns(task.spec))
    for _ in range(3):  # close three turns without doing anything
        ids = chat.assistant_ids(format_answer("ok"))
        episode.add_policy_turn(ids, [0.0] * len(ids))
        assert not episode.done
    text = chat.encode("nothing to do")  # a text turn ended with eos closes the last turn
    episode.add_policy_turn([*text, chat.eos_token_id], [0.0] * (len(text) + 1))
    assert episode.done and episode.finish_reason == "stop"
    verdict = family.check(task.spec, episode.steps)
    assert not verdict["valid"] and verdict["turn"] == 0
    assert verdict["error_type"] == "multi_turn:empty_turn_model_response"


def test_tools_are_fresh_per_episode_and_from_the_entry(family: BFCLFamily) -> None:
    spec = {"id": "multi_turn_base_0"}
    first, second = family.tool_map(spec), family.tool_map(spec)
    assert first["cd"](folder="document") == '{"current_working_directory": "document"}'
    assert "final_report.pdf" in first["ls"]()
    assert "final_report.pdf" not in second["ls"]()  # still at the root of its own instance
    assert first["cd"].parameters["type"] == "object"
    with pytest.raises(BadArguments, match="cd: missing a required argument: 'folder'"):
        first["cd"](directory="x")
    with pytest.raises(TypeError, match="tool_map"):
        family.tool_map()
    with pytest.raises(TypeError, match="verify_trajectory"):
        family.verify(family.make_task(spec), "done")


def test_faulted_calls_are_not_replayed(family: BFCLFamily, chat: ChatFormat) -> None:
    """A call that an injected fault stopped never ran, so the check must not run it either:
    with mkdir faulted once and retried, the episode still verifies."""
    task = family.make_task({"id": "multi_turn_base_0"})
    turns = family.solve(task.spec, family.tool_map(task.spec)).assistant_turns()
    mkdir = next(t for t in turns if '"mkdir"' in t)
    turns.insert(turns.index(mkdir), mkdir)
    episode = Episode(task, family.tool_map(task.spec), chat, HermesParser(),
                      EnvConfig(max_turns=40, max_tokens=1 << 16,
                                faults=FaultConfig(rate=1.0, tools=["mkdir"])),
                      random.Random(0), follow_ups=family.follow_up_turns(task.spec))
    for text in turns:
        ids = chat.assistant_ids(text)
        episode.add_policy_turn(ids, [0.0] * len(ids))
        if episode.steps[-1].tool == "mkdir":  # only the first mkdir is faulted
            episode.config.faults.rate = 0.0
    assert [s.tool for s in episode.steps[1:3]] == ["mkdir", "mkdir"]
    assert episode.steps[1].error_kind in ("tool_error", "timeout")
    assert episode.steps[2].error_kind is None
    assert family.verify_trajectory(task, episode.trajectory())


def test_wrong_arguments_change_the_state(family: BFCLFamily, chat: ChatFormat) -> None:
    task = family.make_task({"id": "multi_turn_base_0"})
    turns = family.solve(task.spec, family.tool_map(task.spec)).assistant_turns()
    mkdir = next(t for t in turns if '"mkdir"' in t)
    turns[turns.index(mkdir)] = format_call("mkdir", {"dir_name": "tmp"})
    traj = replay(task, turns, family.tool_map(task.spec), chat, HermesParser(), EnvConfig(),
                  follow_ups=family.follow_up_turns(task.spec))
    verdict = family.check(task.spec, traj.steps)
    assert not verdict["valid"] and verdict["turn"] == 0
    assert verdict["error_type"] == "multi_turn:instance_state_mismatch"
    assert family.locate_error(task, traj.steps) == 1  # the wrong mkdir


def test_edits(family: BFCLFamily) -> None:
    rng = random.Random(0)
    siblings = [{"id": i} for i in [*family._siblings({"id": "multi_turn_base_0"}),
                                    "multi_turn_base_0"]]
    spec = min(siblings, key=family.difficulty)  # the easiest of its API classes
    other = family.perturb(spec, rng)
    assert other != spec
    entries = load_category("multi_turn_base")
    assert (sorted(entries[other["id"]]["involved_classes"])
            == sorted(entries[spec["id"]]["involved_classes"]))
    harder = family.escalate(spec, rng)
    assert harder is not None and family.difficulty(harder) > family.difficulty(spec)
    hardest = max(siblings, key=family.difficulty)
    assert family.escalate(hardest, rng) is None
    assert family.decompose(spec, 0) is None
