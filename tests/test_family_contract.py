"""The contract every task family keeps, checked on every built-in family instance: arith, lookup
(with and without the forced first-call fault), reasoning_gym on six datasets, and bfcl.

For sampled tasks: the reference trajectory (made by really calling the tools, replayed through the
environment with the tiny tokenizer) verifies; a wrong one does not; the loss mask covers exactly
the assistant turns; specs survive JSON, `Task.to_row`/`from_row` and a real DuckDB store; the
spec edits give valid, solvable specs."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig, replay
from sentinel.env.parser import HermesParser, format_answer
from sentinel.env.tools import tool_schema
from sentinel.policy import build_tokenizer
from sentinel.tasks import TaskFamily, load_family
from sentinel.tasks.bfcl import BFCLFamily
from sentinel.types import Task, Trajectory, new_id
from task_store import Store

RG_DATASETS = {
    "chain_sum": {"max_terms": 3, "max_digits": 2},
    "countdown": {"max_numbers": 4},
    "basic_arithmetic": {"max_terms": 3},
    "gsm_symbolic": {},
    "leg_counting": {"max_animals": 3},
    "word_sorting": {"max_words": 4},
}


def _rg(dataset: str) -> Callable[[], TaskFamily]:
    def make() -> TaskFamily:
        pytest.importorskip("reasoning_gym")
        return load_family("reasoning_gym", {
            "datasets": [{"name": dataset, "config": RG_DATASETS[dataset]}]})
    return make


def _bfcl() -> TaskFamily:
    pytest.importorskip("bfcl_eval")
    return load_family("bfcl")


CASES: dict[str, Callable[[], TaskFamily]] = {
    "arith": lambda: load_family("arith"),
    "lookup": lambda: load_family("lookup", {"fault_share": 0.0, "max_hops": 4}),
    "lookup-fault": lambda: load_family("lookup", {"fault_share": 1.0, "compute_share": 0.5}),
    **{f"rg-{name}": _rg(name) for name in RG_DATASETS},
    "bfcl": _bfcl,
}
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(build_tokenizer())


@pytest.fixture(params=list(CASES), scope="module")
def family(request: pytest.FixtureRequest) -> TaskFamily:
    return CASES[request.param]()


def _tasks(family: TaskFamily) -> list[Task]:
    return [family.sample_task(random.Random(seed)) for seed in SEEDS]


def _reference(family: TaskFamily, task: Task) -> list[str]:
    return family.solve(task.spec, family.tool_map(task.spec)).assistant_turns()


def _replay(family: TaskFamily, task: Task, turns: list[str], chat: ChatFormat) -> Trajectory:
    return replay(task, turns, family.tool_map(task.spec), chat, HermesParser(), EnvConfig(),
                  follow_ups=family.follow_up_turns(task.spec))


def _wrong(family: TaskFamily, task: Task, turns: list[str]) -> list[str]:
    """A wrong solution: the last tool call dropped (bfcl, judged by its calls), else a wrong
    final answer."""
    if isinstance(family, BFCLFamily):
        last = max(i for i, t in enumerate(turns) if t.startswith("<tool_call>"))
        return turns[:last] + turns[last + 1:]
    return [*turns[:-1], format_answer(task.answer + "7")]


def _policy_runs(token_ids: list[int], mask: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    prev = 0
    for tok, m in zip(token_ids, mask, strict=True):
        if m and not prev:
            runs.append([])
        if m:
            runs[-1].append(tok)
        prev = m
    return runs


def test_reference_trajectory_verifies(family: TaskFamily, chat: ChatFormat) -> None:
    for task in _tasks(family):
        turns = _reference(family, task)
        traj = _replay(family, task, turns, chat)
        assert traj.finish_reason == "answer"
        assert family.verify_trajectory(task, traj), task.spec
        assert traj.answer == task.answer
        wrong = _replay(family, task, _wrong(family, task, turns), chat)
        assert not family.verify_trajectory(task, wrong), task.spec
        if not isinstance(family, BFCLFamily):
            assert family.verify(task, task.answer)
            assert not family.verify(task, task.answer + "7")
            assert not family.verify(task, None)


def test_loss_mask_covers_only_policy_tokens(family: TaskFamily, chat: ChatFormat) -> None:
    task = _tasks(family)[0]
    turns = _reference(family, task)
    traj = _replay(family, task, turns, chat)
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)
    assert traj.loss_mask[: traj.prompt_len] == [0] * traj.prompt_len
    assert _policy_runs(traj.token_ids, traj.loss_mask) == [chat.assistant_ids(t) for t in turns]
    schemas = [tool_schema(t) for t in family.tool_map(task.spec).values()]
    assert chat.decode(traj.token_ids) == chat.render(traj.messages, schemas,
                                                      add_generation_prompt=False)
    users = [m["content"] for m in traj.messages if m["role"] == "user"]
    follow_ups = [m["content"] for turn in family.follow_up_turns(task.spec) for m in turn]
    assert users[1:] == follow_ups


def test_specs_round_trip_through_json_and_the_store(family: TaskFamily, tmp_path: Path) -> None:
    tasks = _tasks(family)
    for task in tasks:
        spec = json.loads(json.dumps(task.spec))
        assert family.validate_spec(spec) == task.spec
        assert family.make_task(spec).task_id == task.task_id
        assert Task.from_row(task.to_row()) == task
    store = Store.create(tmp_path / "s.duckdb", run_id=new_id("run"), config={})
    store.record_round(0, {}, tasks=[t.to_row() for t in tasks])
    by_id = {t.task_id: t for t in tasks}
    rows = store.load_tasks(task_ids=list(by_id))
    assert len(rows) == len(by_id)
    for row in rows:
        loaded = Task.from_row(row)
        assert loaded == by_id[loaded.task_id]
        assert family.make_task(loaded.spec) == by_id[loaded.task_id]


def _check_valid(family: TaskFamily, spec: dict | None) -> None:
    if spec is None:
        return
    assert family.validate_spec(spec) == spec
    task = family.make_task(spec)  # solvable by the tools
    assert json.loads(json.dumps(task.spec)) == spec


def test_spec_edits_give_valid_specs(family: TaskFamily) -> None:
    rng = random.Random(7)
    for task in _tasks(family):
        perturbed = family.perturb(task.spec, rng)
        assert perturbed != task.spec
        _check_valid(family, perturbed)
        harder = family.escalate(task.spec, rng)
        _check_valid(family, harder)
        if harder is not None:
            assert family.difficulty(harder) >= task.difficulty
        n_calls = len(family.solve(task.spec, family.tool_map(task.spec)).calls)
        for step in range(n_calls + 1):
            _check_valid(family, family.decompose(task.spec, step))


def test_family_from_an_entry_point_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin package registers a family under the entry-point group `sentinel.families`; here
    a real (tiny) installed distribution on sys.path."""
    from sentinel.tasks import ENTRY_POINT_GROUP, PluginError, family_class
    from sentinel.tasks.lookup import LookupFamily

    (tmp_path / "myfam.py").write_text(
        "from sentinel.tasks.lookup import LookupFamily\n"
        "class Renamed(LookupFamily):\n    name = 'renamed'\n"
        "class NotAFamily:\n    pass\n")
    dist = tmp_path / "myfam-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myfam\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nrenamed = myfam:Renamed\nbroken = myfam:NotAFamily\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = family_class("renamed")
    assert issubclass(cls, LookupFamily) and cls.name == "renamed"
    assert load_family("renamed").make_task(
        load_family("renamed").sample_spec(random.Random(0))).family == "renamed"
    with pytest.raises(PluginError, match="not a TaskFamily"):
        family_class("broken")
    with pytest.raises(PluginError, match=r"sentinel\.families"):
        family_class("absent")
