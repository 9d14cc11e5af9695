"""`sentinel export`: each format loaded back by the tool that consumes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sentinel.cli import app
from sentinel.export import export_dpo, export_hf, export_parquet, export_verl
from task_store import Store
from task_store.schema import COLUMNS
from tests.test_store import round_row, task_row, traj_row

PROMPT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Compute 1+2"}]
CALL = {"role": "assistant", "content": '<tool_call>{"name": "calculator"}</tool_call>'}
OBS = {"role": "tool", "content": "3"}


def task(task_id: str, origin: str, **extra: Any) -> dict[str, Any]:
    return {**task_row(0), "task_id": task_id, "origin": origin, "prompt": json.dumps(PROMPT),
            **extra}


def rollout(traj_id: str, task_id: str, group: str, idx: int, answer: str, success: bool,
            split: str = "train") -> dict[str, Any]:
    messages = [*PROMPT, CALL, OBS, {"role": "assistant", "content": f"<answer>{answer}</answer>"}]
    return {**traj_row(traj_id, task_id, 1, split=split, success=success), "group_id": group,
            "sample_idx": idx, "messages": json.dumps(messages)}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    store = Store.create(tmp_path_factory.mktemp("export") / "sentinel.duckdb", "run", {})
    store.record_round(1, round_row(), tasks=[
        task("A", "seed", answer="3"),
        task("B", "generated", answer="4", generator="mutate", parent_task_id="A",
             skills=["op:add"], created_round=1),
        task("E", "eval"),
    ], trajectories=[
        # group g1: successes at 0 and 3, failures at 1 and 2 -> pairs (0, 1) and (3, 2)
        rollout("a0", "A", "g1", 0, "3", True), rollout("a1", "A", "g1", 1, "5", False),
        rollout("a2", "A", "g1", 2, "6", False), rollout("a3", "A", "g1", 3, "3", True),
        # all successes: no pair; eval rollouts are never paired
        rollout("b0", "B", "g2", 0, "4", True), rollout("b1", "B", "g2", 1, "4", True),
        rollout("e0", "E", "g3", 0, "3", True, split="eval"),
        rollout("e1", "E", "g3", 1, "9", False, split="eval"),
    ])
    return store


def test_parquet_writes_every_table(store: Store, tmp_path: Path) -> None:
    export_parquet(store, tmp_path / "pq")
    assert sorted(p.stem for p in (tmp_path / "pq").iterdir()) == sorted(COLUMNS)
    trajs = pq.read_table(tmp_path / "pq" / "trajectories.parquet")
    assert trajs.num_rows == 8
    assert trajs.column_names == [name for name, _ in COLUMNS["trajectories"]]
    assert pq.read_table(tmp_path / "pq" / "tasks.parquet").column("skills").to_pylist()[0] == [
        "add", "tool:calc"]


def test_hf_dataset_loads_with_datasets(store: Store, tmp_path: Path) -> None:
    import datasets

    export_hf(store, tmp_path / "hf")
    ds = datasets.load_from_disk(str(tmp_path / "hf"))
    assert ds.column_names == [name for name, _ in COLUMNS["tasks"]]
    assert list(ds["task_id"]) == ["A", "E", "B"]  # by (created_round, task_id)
    assert ds[0]["prompt"] == PROMPT
    assert json.loads(ds[2]["spec"]) == {"a": 0, "b": 2}
    assert ds[2]["parent_task_id"] == "A" and ds[2]["skills"] == ["op:add"]


def test_dpo_pairs_are_trl_conversational_preference_rows(store: Store, tmp_path: Path) -> None:
    import datasets

    out = tmp_path / "dpo" / "pairs.jsonl"
    summary = export_dpo(store, out)
    assert "2 preference pairs" in summary
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [set(r) for r in rows] == [{"prompt", "chosen", "rejected"}] * 2
    tail = [CALL, OBS]
    assert rows[0] == {"prompt": PROMPT,
                       "chosen": [*tail, {"role": "assistant", "content": "<answer>3</answer>"}],
                       "rejected": [*tail, {"role": "assistant", "content": "<answer>5</answer>"}]}
    assert rows[1]["rejected"][-1]["content"] == "<answer>6</answer>"
    ds = datasets.load_dataset("json", data_files=str(out), split="train")
    assert ds.num_rows == 2 and ds[0]["chosen"][0]["role"] == "assistant"


def test_verl_parquet_has_the_exact_rl_layout(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "verl" / "train.parquet"
    export_verl(store, out)
    table = pq.read_table(out)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model",
                                  "extra_info"]
    schema = table.schema
    assert schema.field("prompt").type == pa.list_(
        pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert [f.name for f in schema.field("reward_model").type] == ["style", "ground_truth"]
    assert [f.name for f in schema.field("extra_info").type] == [
        "task_id", "family", "spec", "skills", "split", "index"]
    rows = table.to_pylist()
    assert [r["extra_info"]["task_id"] for r in rows] == ["A", "B"]  # no eval task
    assert rows[1] == {
        "data_source": "sentinel/arith",
        "prompt": PROMPT,
        "ability": "arith",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"task_id": "B", "family": "arith", "spec": '{"a":0,"b":2}',
                       "skills": ["op:add"], "split": "train", "index": 1},
    }


def test_export_command(store: Store, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "t.parquet"
    result = runner.invoke(app, ["export", "verl", "--run-dir", str(store.path.parent),
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 2 tasks" in result.stdout and out.exists()
    result = runner.invoke(app, ["export", "csv", "--run-dir", str(store.path.parent),
                                 "--out", str(out)])
    assert result.exit_code == 2 and "unknown export kind 'csv'" in result.stderr
    result = runner.invoke(app, ["export", "dpo", "--run-dir", str(store.path.parent),
                                 "--out", str(tmp_path)])
    assert result.exit_code == 2 and "is a folder" in result.stderr
