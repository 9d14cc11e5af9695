"""The veRL backend's pieces that need no veRL (run in .venv): the dataset version and its
items, `compute_score` on real episodes, the ingest of a dump in veRL's format, the overrides.
Their contracts with veRL itself are checked in veRL's environment (test_verl_contracts.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sentinel.cli import app
from sentinel.rewards import score
from sentinel.verl.dataset import SentinelDataset
from sentinel.verl.episode import RECORD_KEY, episode_record
from sentinel.verl.ingest import IngestError, ingest_dump
from sentinel.verl.launch import VerlRound, overrides
from sentinel.verl.reward import compute_score
from sentinel.verl.version import VersionError, item, read_version
from task_store import Store
from tests.verl_helpers import (
    ENV,
    REWARD,
    arith_family,
    dump_line,
    scripted_episode,
    tasks_with_fault,
    write_dataset,
)


@pytest.fixture
def family():
    return arith_family()


def test_dataset_items_are_deterministic_per_index_and_version(tmp_path: Path, family) -> None:
    tasks = tasks_with_fault(family, 4)
    path = write_dataset(tmp_path / "v1.jsonl", tasks, family, version=1)
    a = SentinelDataset(data_files=[str(path)], tokenizer=None, config={})
    b = SentinelDataset(data_files=str(path), tokenizer=None, config={}, max_samples=3)
    assert len(a) == 4 and len(b) == 3
    for i, task in enumerate(tasks[:3]):
        x, y = a[i], b[i]
        assert x.pop("dummy_tensor").tolist() == y.pop("dummy_tensor").tolist() == [0]
        assert x == y
        assert x["extra_info"]["task_id"] == task.task_id
        assert x["index"] == x["extra_info"]["index"] == i
        assert x["reward_model"]["ground_truth"] == task.answer
        assert x["raw_prompt"] == task.prompt
        assert x["extra_info"]["sentinel"]["task"]["spec"] == task.to_row()["spec"]
        assert x["extra_info"]["version"] == 1
    v2 = write_dataset(tmp_path / "v2.jsonl", tasks, family, version=2)
    assert item(read_version(v2), 0)["extra_info"]["version"] == 2
    (tmp_path / "bad.jsonl").write_text('{"format": "other"}\n')
    with pytest.raises(VersionError, match="not a Sentinel dataset version"):
        SentinelDataset(data_files=[str(tmp_path / "bad.jsonl")], tokenizer=None, config={})


def test_compute_score_is_sentinels_hybrid_reward(tmp_path: Path, family, chat) -> None:
    task = tasks_with_fault(family, 1)[0]
    row = item(read_version(write_dataset(tmp_path / "v.jsonl", [task], family)), 0)
    results = {}
    for wrong in (False, True):
        episode = scripted_episode(family, task, chat, wrong=wrong)
        # The fault schedule was met: the first call timed out and was retried.
        assert episode.steps[0].error_kind == "timeout"
        extra = {**row["extra_info"], RECORD_KEY: episode_record(episode)}
        got = compute_score(row["data_source"], "ignored", task.answer, extra, num_turns=3)
        want, terms, success = score(task, episode.trajectory(), family, REWARD)
        assert got["score"] == pytest.approx(want)
        assert {k: got[k] for k in terms} == terms and got["success"] is success
        assert got["task_id"] == task.task_id
        results[wrong] = got
    assert results[False]["success"] and not results[True]["success"]
    assert results[True]["score"] < results[False]["score"]
    with pytest.raises(ValueError, match="ground truth"):
        compute_score(row["data_source"], "", "not the answer", row["extra_info"])
    # Without Sentinel's agent loop: the text is parsed as one turn.
    text = f"<answer>{task.answer}</answer>"
    plain = compute_score(row["data_source"], text, task.answer, row["extra_info"])
    assert plain["success"] and plain["outcome"] == 1.0


def test_ingest_of_a_verl_dump(tmp_path: Path, family, chat) -> None:
    tasks = tasks_with_fault(family, 2, seed=3)
    version = read_version(write_dataset(tmp_path / "v.jsonl", tasks, family))
    dump = tmp_path / "rollouts"
    dump.mkdir()
    for step in (1, 2):
        lines = []
        for i, task in enumerate(tasks):
            episode = scripted_episode(family, task, chat, wrong=(step == 2 and i == 0))
            extra = {**item(version, i)["extra_info"], RECORD_KEY: episode_record(episode)}
            result = compute_score(f"sentinel/{task.family}", "", task.answer, extra)
            lines.append(dump_line(result, step=step, ground_truth=task.answer))
        (dump / f"{step}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (dump / "3.jsonl").write_text('{"input": "half a line')  # veRL still writing step 3
    run = tmp_path / "run"
    assert "round 0: 4 rollouts of 2 tasks" in ingest_dump(dump, run)
    store = Store(run / "sentinel.duckdb")
    assert store.completed_rounds() == [0]
    _, rows = store.query("SELECT success, count(*) FROM trajectories GROUP BY 1 ORDER BY 1")
    assert rows == [(False, 1), (True, 3)]
    _, rows = store.query("SELECT f.mode, t.task_id FROM failures f JOIN trajectories t "
                          "USING (traj_id)")
    assert rows == [("wrong_answer", tasks[0].task_id)]
    _, rows = store.query("SELECT count(*) FROM steps WHERE error_kind = 'timeout'")
    assert rows == [(4,)]  # every episode met its scheduled timeout
    _, rows = store.query("SELECT count(DISTINCT group_id) FROM trajectories")
    assert rows == [(4,)]  # a group: one task within one step
    # Again: nothing new until step 3 is complete; then only step 3, as round 1.
    assert "nothing new" in ingest_dump(dump, run)
    (dump / "3.jsonl").write_text((dump / "1.jsonl").read_text().replace('"step": 1',
                                                                         '"step": 3'))
    assert "round 1: 2 rollouts" in ingest_dump(dump, run)
    result = CliRunner().invoke(app, ["sql", "SELECT count(*) AS n FROM failure_patterns",
                                      "--run-dir", str(run), "--format", "csv"])
    assert result.exit_code == 0, result.output


def test_ingest_refuses_a_dump_without_sentinel_records(tmp_path: Path) -> None:
    dump = tmp_path / "rollouts"
    dump.mkdir()
    (dump / "1.jsonl").write_text(json.dumps(
        {"input": "a", "output": "b", "gts": "1", "score": 0.0, "step": 1, "uid": "x_0_0"}) + "\n")
    with pytest.raises(IngestError, match=r"trainer\.use_v1=false"):
        ingest_dump(dump, tmp_path / "run")
    result = CliRunner().invoke(app, ["ingest", "verl-rollouts", str(dump),
                                      "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2 and "no task_id, sentinel" in result.output


def test_overrides_plug_sentinel_into_verl(tmp_path: Path) -> None:
    args = overrides(VerlRound(
        dataset=tmp_path / "d.jsonl", rollout_dir=tmp_path / "r", checkpoint_dir=tmp_path / "c",
        agent_loop_config=tmp_path / "a.yaml", model="Qwen/Qwen3-0.6B", steps=3,
        tasks_per_step=4, group_size=8, extra=["trainer.n_gpus_per_node=2"]))
    values = dict(a.split("=", 1) for a in args)
    assert values["data.custom_cls.path"] == "pkg://sentinel.verl.dataset"
    assert values["reward.custom_reward_function.path"] == "pkg://sentinel.verl.reward"
    assert values["actor_rollout_ref.rollout.agent.default_agent_loop"] == "sentinel_agent"
    assert values["trainer.rollout_data_dir"] == str(tmp_path / "r")
    assert values["actor_rollout_ref.rollout.n"] == "8"
    assert values["trainer.total_training_steps"] == "3"
    assert args[-1] == "trainer.n_gpus_per_node=2"  # the user's overrides come last


def test_prepare_round_writes_what_verl_reads(tmp_path: Path, family) -> None:
    from sentinel.verl.round import prepare_round

    tasks = tasks_with_fault(family, 4)
    command = prepare_round(
        tmp_path / "run", 2, tasks, env=ENV, reward=REWARD, families={family.name: family},
        launch=VerlRound(dataset=Path(), rollout_dir=Path(), checkpoint_dir=Path(),
                         agent_loop_config=Path(), model="m", steps=2, tasks_per_step=2,
                         group_size=4), python="/venv/bin/python")
    where = (tmp_path / "run" / "verl" / "round-2").resolve()
    assert command[:3] == ["/venv/bin/python", "-m", "verl.trainer.main_ppo"]
    values = dict(a.split("=", 1) for a in command[3:])
    assert values["hydra.run.dir"] == str(where / "hydra")
    assert values["data.train_files"] == f"['{where / 'dataset.jsonl'}']"
    assert values["trainer.rollout_data_dir"] == str(where / "rollouts")
    version = read_version(where / "dataset.jsonl")
    assert version.version == 2 and [t["task_id"] for t in version.tasks] == [
        t.task_id for t in tasks]
    assert "sentinel.verl.agent_loop.SentinelAgentLoop" in (where / "agent_loops.yaml").read_text()
    assert (where / "overrides.txt").read_text().split("\n")[0] == "/venv/bin/python"


def test_the_loop_refuses_verl_without_its_environment(tmp_path: Path) -> None:
    """trainer.backend verl with an interpreter that is not there: a LoopError naming the key and
    `make verl-env`, before the store or the cold start."""
    from sentinel.config import load_config
    from sentinel.loop import Loop, LoopError
    from tests.verl_helpers import loop_config

    cfg = load_config(data=loop_config(str(tmp_path / "no-such-python")))
    with pytest.raises(LoopError, match=r"trainer\.verl\.python .* `make verl-env`"):
        Loop(cfg, tmp_path / "run").run()
    assert not (tmp_path / "run" / "sentinel.duckdb").exists()
