"""Tests of `task_store.Store` on real DuckDB files (no mocks)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from task_store import SCHEMA_VERSION, SchemaVersionError, Store, StoreLockedError

TABLES = (
    "rounds", "tasks", "trajectories", "steps", "failures", "rejections", "evals", "clusters"
)


# Rows shaped like sentinel.types.*.to_row() output (built by hand: task_store must not need
# sentinel).
def task_row(n: int, origin: str = "seed", created_round: int = 0) -> dict[str, Any]:
    return {
        "family": "arith",
        "spec": json.dumps({"a": n, "b": 2}, sort_keys=True, separators=(",", ":")),
        "prompt": json.dumps([{"role": "user", "content": f"{n} + 2?"}]),
        "answer": str(n + 2),
        "skills": ["add", "tool:calc"],
        "difficulty": 0.25,
        "origin": origin,
        "created_round": created_round,
        "parent_task_id": None,
        "failure_ids": [],
        "generator": None,
        "target_cluster_id": None,
        "probe_pass_rate": None,
        "prefix": None,
        "task_id": f"arith-{n:016d}",
        "hint": None,
    }


def traj_row(
    traj_id: str, task_id: str, round: int, split: str = "train", success: bool = True
) -> dict[str, Any]:
    return {
        "traj_id": traj_id,
        "round": round,
        "split": split,
        "task_id": task_id,
        "group_id": f"g-{task_id}",
        "sample_idx": 0,
        "messages": json.dumps([{"role": "assistant", "content": "<answer>3</answer>"}]),
        "token_ids": [101, 102, 70000, 7],
        "loss_mask": [0, 0, 1, 1],
        "prompt_len": 2,
        "n_tokens": 4,
        "n_policy_tokens": 2,
        "n_turns": 1,
        "finish_reason": "answer",
        "answer": "3",
        "reward": 1.0 if success else 0.0,
        "reward_terms": json.dumps({"correct": 1.0 if success else 0.0, "format": 0.1}),
        "success": success,
    }


def step_row(traj_id: str, step: int) -> dict[str, Any]:
    return {
        "traj_id": traj_id,
        "step": step,
        "text": "<tool_call>...</tool_call>",
        "kind": "tool_call",
        "tool": "calc",
        "arguments": json.dumps({"expr": "1+2"}),
        "observation": "3",
        "error": None,
        "error_kind": None,
        "hallucinated": False,
        "answer": None,
    }


def failure_row(fid: str, traj_id: str, task_id: str, round: int, mode: str) -> dict[str, Any]:
    return {
        "failure_id": fid,
        "traj_id": traj_id,
        "task_id": task_id,
        "round": round,
        "mode": mode,
        "first_error_step": 0,
        "evidence": "...",
        "skills": ["add"],
        "family": "arith",
        "cluster_id": f"cl-{mode}",
    }


def round_row(**extra: Any) -> dict[str, Any]:
    return {
        "started_at": 1_700_000_000.0,
        "finished_at": 1_700_000_060.0,
        "n_train_rollouts": 2,
        "train_success": 0.5,
        "train_reward": 0.55,
        "metrics": {"loss": 0.12, "kl": 0.01, "clip_fraction": 0.02},
        "timings": {"rollout": 40.0, "train": 20.0},
        **extra,
    }


def counts(store: Store) -> dict[str, int]:
    return {t: store.query(f"SELECT count(*) FROM {t}")[1][0][0] for t in TABLES}


def full_round(round: int) -> dict[str, Any]:
    t0, t1 = task_row(round * 10), task_row(round * 10 + 1)
    trajs = [
        traj_row(f"traj-{round}-0", t0["task_id"], round),
        traj_row(f"traj-{round}-1", t1["task_id"], round, success=False),
    ]
    return {
        "tasks": [t0, t1],
        "trajectories": trajs,
        "steps": [
            step_row(f"traj-{round}-0", 0),
            step_row(f"traj-{round}-0", 1),
            step_row(f"traj-{round}-1", 0),
        ],
        "failures": [
            failure_row(f"fail-{round}", f"traj-{round}-1", t1["task_id"], round, "wrong_answer")
        ],
        "rejections": [
            {
                "rejection_id": f"rej-{round}",
                "round": round,
                "generator": "mutate",
                "family": "arith",
                "spec": '{"a":-1}',
                "reason": "unsolvable",
                "detail": "",
                "parent_task_id": t0["task_id"],
            }
        ],
        "evals": [
            {
                "round": round,
                "task_id": t0["task_id"],
                "k": 4,
                "successes": 3,
                "success_rate": 0.75,
                "greedy_success": True,
            }
        ],
        "clusters": [
            {
                "round": round,
                "cluster_id": "cl-wrong_answer",
                "family": "arith",
                "skills": ["add"],
                "mode": "wrong_answer",
                "n_failures": 1,
                "share": 0.5,
                "trend": None,
                "exemplar_traj_ids": [f"traj-{round}-1"],
                "summary": "adds wrongly",
            }
        ],
    }


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.create(
        tmp_path / "run" / "sentinel.duckdb", "run-1", {"model": "tiny", "lr": 1e-6}
    )


def test_create_record_and_read_back(store: Store) -> None:
    assert store.path.exists()
    assert store.completed_rounds() == []
    store.record_round(0, round_row(), **full_round(0))
    store.record_round(1, round_row(heldout_success=0.4), **full_round(1))
    assert store.completed_rounds() == [0, 1]
    assert counts(store) == {
        "rounds": 2,
        "tasks": 4,
        "trajectories": 4,
        "steps": 6,
        "failures": 2,
        "rejections": 2,
        "evals": 2,
        "clusters": 2,
    }

    tasks = store.load_tasks()
    assert [t["task_id"] for t in tasks] == [task_row(n)["task_id"] for n in (0, 1, 10, 11)]
    assert tasks[0] == task_row(0)  # exactly what Task.to_row produced: lists and JSON strings
    assert store.load_tasks(task_ids=[task_row(11)["task_id"], "nope"]) == [task_row(11)]
    assert store.load_tasks(origin="generated") == []
    assert store.load_tasks(task_ids=[]) == []
    assert store.existing_task_ids([task_row(1)["task_id"], "nope"]) == {task_row(1)["task_id"]}

    cols, rows = store.query(
        "SELECT token_ids, loss_mask, success, reward_terms->>'format' FROM trajectories "
        "WHERE traj_id = ?",
        ["traj-0-0"],
    )
    assert cols == ["token_ids", "loss_mask", "success", "(reward_terms ->> 'format')"]
    assert rows == [([101, 102, 70000, 7], [0, 0, 1, 1], True, "0.1")]
    _, rows = store.query(
        "SELECT metrics->>'loss', timings->>'train', started_at, "
        "heldout_success FROM rounds ORDER BY round"
    )
    assert rows[0][:2] == ("0.12", "20.0")
    assert rows[0][2].isoformat() == "2023-11-14T22:13:20"  # epoch seconds -> naive UTC
    assert [r[3] for r in rows] == [None, 0.4]  # missing round columns are NULL
    _, rows = store.query("SELECT arguments->>'expr', spec->>'a' FROM steps, rejections LIMIT 1")
    assert rows == [("1+2", "-1")]
    _, rows = store.query("SELECT run_id, config->>'model', schema_version FROM runs")
    assert rows == [("run-1", "tiny", SCHEMA_VERSION)]


def test_create_is_idempotent_and_accepts_run_dir(store: Store) -> None:
    store.record_round(0, round_row(), **full_round(0))
    again = Store.create(store.path.parent, "run-1", {"model": "other"})
    assert again.path == store.path
    assert again.query("SELECT count(*) FROM runs")[1] == [(1,)]
    assert again.completed_rounds() == [0]


def test_duplicate_tasks_collapse(store: Store) -> None:
    t = task_row(5)
    store.record_round(0, round_row(), tasks=[t, t, {**t, "answer": "other"}])
    store.record_round(1, round_row(), tasks=[{**t, "answer": "later"}, task_row(6)])
    assert [(r["task_id"], r["answer"]) for r in store.load_tasks()] == [
        (t["task_id"], "7"),
        (task_row(6)["task_id"], "8"),
    ]


def test_recording_a_round_twice_raises(store: Store) -> None:
    store.record_round(0, round_row(), **full_round(0))
    before = counts(store)
    with pytest.raises(ValueError, match="already recorded"):
        store.record_round(0, round_row(), **full_round(0))
    assert counts(store) == before


@pytest.mark.parametrize("breakage", ["bad_type_in_last_table", "duplicate_step_key"])
def test_failed_round_leaves_nothing(store: Store, breakage: str) -> None:
    store.record_round(0, round_row(), **full_round(0))
    before = counts(store)
    rows = full_round(1)
    if breakage == "bad_type_in_last_table":  # evals go last: pyarrow refuses "three" as INTEGER
        rows["evals"][0]["k"] = "three"
        expected: type[Exception] = ValueError
    else:  # DuckDB refuses the steps insert (primary key) after rounds/tasks/trajectories
        rows["steps"].append(dict(rows["steps"][0]))
        expected = duckdb.ConstraintException
    with pytest.raises(expected):
        store.record_round(1, round_row(), **rows)
    assert counts(store) == before
    assert store.completed_rounds() == [0]
    store.record_round(1, round_row(), **full_round(1))  # the round can then be redone
    assert store.completed_rounds() == [0, 1]


def test_query_is_read_only(store: Store) -> None:
    with pytest.raises(duckdb.Error, match="read-only"):
        store.query("INSERT INTO rounds (round) VALUES (7)")
    assert store.completed_rounds() == []


def test_missing_file_and_foreign_schema_version(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Store(tmp_path / "none.duckdb").completed_rounds()
    path = tmp_path / "future.duckdb"
    Store.create(path, "r", {})
    with duckdb.connect(str(path)) as con:
        con.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)]
        )
    with pytest.raises(SchemaVersionError, match="newer"):
        Store(path).completed_rounds()
    with pytest.raises(SchemaVersionError, match="newer"):
        Store.create(path, "r", {})


HOLD_LOCK = """
import sys, time, pathlib, duckdb
con = duckdb.connect(sys.argv[1])
pathlib.Path(sys.argv[2]).write_text("held")
time.sleep(float(sys.argv[3]))
con.close()
"""


def hold_lock(store: Store, tmp_path: Path, seconds: float) -> subprocess.Popen:
    """Start a process holding a read-write connection; return once it holds it."""
    signal = tmp_path / "held"
    signal.unlink(missing_ok=True)
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(store.path), str(signal), str(seconds)]
    )
    deadline = time.monotonic() + 60
    while not signal.exists():
        assert child.poll() is None, "lock-holding child died"
        assert time.monotonic() < deadline, "lock-holding child never took the lock"
        time.sleep(0.02)
    return child


def test_lock_wait_then_answer(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    child = hold_lock(store, tmp_path, 1.5)
    try:
        start = time.monotonic()
        assert Store(store.path, lock_timeout_s=60).completed_rounds() == []
        assert time.monotonic() - start > 0.3  # it did wait for the child
        assert capsys.readouterr().err.count("store is locked by another process") == 1
    finally:
        child.wait(timeout=60)


def test_lock_timeout_raises(store: Store, tmp_path: Path) -> None:
    child = hold_lock(store, tmp_path, 30)
    try:
        start = time.monotonic()
        with pytest.raises(StoreLockedError, match="locked by another process"):
            Store(store.path, lock_timeout_s=0.3).query("SELECT 1")
        with pytest.raises(StoreLockedError):
            Store(store.path, lock_timeout_s=0.3).record_round(0, round_row())
        assert time.monotonic() - start < 10
    finally:
        child.kill()
        child.wait(timeout=60)
    assert store.completed_rounds() == []


def test_failure_modes_by_round_view(store: Store) -> None:
    trajs = [traj_row(f"t{i}", "task", 0, success=False) for i in range(4)]
    trajs.append(traj_row("e0", "task", 0, split="eval", success=False))  # not a train rollout
    store.record_round(
        0,
        round_row(),
        trajectories=trajs,
        failures=[
            failure_row("f0", "t0", "task", 0, "wrong_answer"),
            failure_row("f1", "t1", "task", 0, "wrong_answer"),
            failure_row("f2", "t2", "task", 0, "loop"),
        ],
    )
    store.record_round(
        1,
        round_row(),
        trajectories=[traj_row("t5", "task", 1, success=False)],
        failures=[failure_row("f3", "t5", "task", 1, "format_error")],
    )
    store.record_round(2, round_row())
    cols, rows = store.query("SELECT * FROM failure_modes_by_round")
    assert cols == ["round", "mode", "n_failures", "share_of_rollouts"]
    assert rows == [(0, "loop", 1, 0.25), (0, "wrong_answer", 2, 0.5), (1, "format_error", 1, 1.0)]


# -- migrations ----------------------------------------------------------------------------------

V1_ROWS = (
    "INSERT INTO runs VALUES ('run-old', TIMESTAMP '2025-01-01 00:00:00', '{\"lr\": 1}', 1)",
    "INSERT INTO rounds (round, n_train_rollouts, metrics) VALUES (0, 0, '{}'), (1, 2, '{}')",
    "INSERT INTO tasks VALUES ('arith-a', 'arith', '{\"a\":1}', '[]', '3', ['op:add', 'steps:2'],"
    " 0.1, 'seed', 0, NULL, [], NULL), ('arith-b', 'arith', '{\"a\":2}', '[]', '4', ['op:mul'],"
    " 0.2, 'generated', 1, 'arith-a', ['f1'], 'mutate')",
    "INSERT INTO trajectories (traj_id, round, split, task_id, group_id, token_ids, loss_mask,"
    " success) VALUES ('t1', 1, 'train', 'arith-a', 'r1s0-arith-a', [1, 2], [0, 1], false),"
    " ('t2', 1, 'train', 'arith-a', 'r1s0-arith-a', [3], [1], true)",
    "INSERT INTO steps (traj_id, step, kind) VALUES ('t1', 0, 'answer'), ('t2', 0, 'answer')",
    "INSERT INTO failures VALUES ('f1', 't1', 'arith-a', 1, 'wrong_answer', 0, 'said 5',"
    " ['steps:2', 'op:add'], 'arith')",
    "INSERT INTO rejections VALUES ('rj', 1, 'mutate', 'arith', '{}', 'duplicate', '', 'arith-a')",
    "INSERT INTO evals VALUES (1, 'arith-a', 4, 1, 0.25, false)",
)


def v1_store(path: Path) -> Path:
    """A genuine version-1 file: the frozen v1 DDL plus rows, written without `Store`."""
    from task_store.migrations import V1_DDL

    with duckdb.connect(str(path)) as con:
        for statement in (*V1_DDL, *V1_ROWS):
            con.execute(statement)
    return path


def dump(path: Path, table: str, columns: str = "*") -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(f"SELECT {columns} FROM {table} ORDER BY ALL").fetchall()


def test_v1_file_is_upgraded_in_place_keeping_every_row(tmp_path: Path) -> None:
    from sentinel.types import cluster_id_for

    path = v1_store(tmp_path / "old.duckdb")
    v1_columns = {t: [d[0] for d in duckdb.connect(str(path)).execute(
        f"SELECT * FROM {t} LIMIT 0").description] for t in ("tasks", "failures", "steps")}
    before = {t: dump(path, t) for t in (*TABLES[:-1], "runs")}

    # Read-only opens refuse to touch an old file and say how to upgrade it.
    with pytest.raises(SchemaVersionError, match=r"older .*python -m task_store\.upgrade"):
        Store(path).query("SELECT 1")
    assert dump(path, "meta") == [("schema_version", "1")]

    assert Store(path).upgrade() == 1
    for table, rows in before.items():  # every old row kept, old columns unchanged
        cols = ", ".join(v1_columns.get(table, ["*"]))
        assert dump(path, table, cols) == rows, table
    assert dump(path, "tasks", "task_id, target_cluster_id, probe_pass_rate") == [
        ("arith-a", None, None), ("arith-b", None, None)]
    # Backfilled cluster ids are the ones the analyzer gives the same failure today.
    assert dump(path, "failures", "cluster_id") == [
        (cluster_id_for("arith", ["steps:2", "op:add"], "wrong_answer"),)]
    meta = dict(dump(path, "meta"))
    assert meta["schema_version"] == str(SCHEMA_VERSION) and "upgraded_from_1_at" in meta

    # Same columns in the same order as a file created at the current version.
    fresh = Store.create(tmp_path / "new.duckdb", "r", {}).path
    columns = ("SELECT table_name, column_index, column_name, data_type FROM duckdb_columns() "
               "WHERE NOT internal ORDER BY table_name, column_index")
    assert Store(path).query(columns) == Store(fresh).query(columns)
    views = "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY view_name"
    assert Store(path).query(views)[1] == Store(fresh).query(views)[1]
    assert len(Store(path).query(views)[1]) == 7
    _, rows = Store(path).query("SELECT task_id, ancestor_id, depth FROM task_lineage")
    assert ("arith-b", "arith-a", 1) in rows

    # The upgraded file takes v2 rounds; upgrading again is a no-op.
    Store(path).record_round(2, round_row(), **full_round(2))
    assert Store(path).completed_rounds() == [0, 1, 2]
    assert Store(path).upgrade() == SCHEMA_VERSION


def test_writing_store_upgrades_and_migrations_cli(tmp_path: Path) -> None:
    old = v1_store(tmp_path / "a.duckdb")
    Store.create(old, "run-new", {})  # the loop's first call on a resumed run
    assert dict(dump(old, "meta"))["schema_version"] == str(SCHEMA_VERSION)
    assert [r[0] for r in dump(old, "runs", "run_id")] == ["run-new", "run-old"]

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    v1_store(run_dir / "sentinel.duckdb")
    proc = subprocess.run([sys.executable, "-m", "task_store.upgrade", str(run_dir)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"upgraded schema version {SCHEMA_VERSION} (was 1)" in proc.stdout
    assert Store(run_dir).completed_rounds() == [0, 1]
