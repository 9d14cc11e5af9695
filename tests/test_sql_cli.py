"""`sentinel sql`: output formats, the read-only guard, and queries beside a running loop."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sentinel.cli import app
from task_store import Store
from task_store.migrations import V1_DDL
from task_store.sql import ReadOnlyQueryError, check_read_only
from tests.test_store import TABLES, full_round, round_row

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store shared by the module: no test here may change it (the refusal tests check)."""
    path = tmp_path_factory.mktemp("sql") / "run" / "sentinel.duckdb"
    store = Store.create(path, "run-1", {"lr": 0.1})
    store.record_round(0, round_row(), **full_round(0))
    store.record_round(1, round_row(), **full_round(1))
    return store.path.parent


def fingerprint(run_dir: Path) -> list[tuple]:
    """Row counts of every table and the view definitions, in one query."""
    parts = [f"(SELECT count(*) FROM {t})" for t in TABLES]
    parts.append("(SELECT string_agg(sql, ';' ORDER BY view_name) FROM duckdb_views())")
    return Store(run_dir).query("SELECT " + ", ".join(parts))[1]


def sql(run_dir: Path, *args: str):
    return CliRunner().invoke(app, ["sql", "--run-dir", str(run_dir), *args])


QUERY = ("SELECT round, traj_id, success, token_ids, reward_terms FROM trajectories "
         "WHERE round = 1 ORDER BY traj_id")


def test_table_csv_json_and_parquet_formats(run_dir: Path, tmp_path: Path) -> None:
    result = sql(run_dir, QUERY)
    assert result.exit_code == 0, result.output
    assert "traj-1-0" in result.stdout and "reward_terms" in result.stdout

    result = sql(run_dir, QUERY, "--format", "csv")
    assert result.exit_code == 0, result.output
    assert list(csv.reader(io.StringIO(result.stdout))) == [
        ["round", "traj_id", "success", "token_ids", "reward_terms"],
        ["1", "traj-1-0", "true", "[101, 102, 70000, 7]", '{"correct": 1.0, "format": 0.1}'],
        ["1", "traj-1-1", "false", "[101, 102, 70000, 7]", '{"correct": 0.0, "format": 0.1}'],
    ]

    result = sql(run_dir, QUERY, "--format", "json")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert records[0] == {"round": 1, "traj_id": "traj-1-0", "success": True,
                          "token_ids": [101, 102, 70000, 7],
                          "reward_terms": {"correct": 1.0, "format": 0.1}}  # JSON embedded

    out = tmp_path / "r.parquet"
    result = sql(run_dir, QUERY, "--format", "parquet", "--output", str(out))
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert table.column_names == ["round", "traj_id", "success", "token_ids", "reward_terms"]
    assert table.column("token_ids").to_pylist()[1] == [101, 102, 70000, 7]

    query_file = tmp_path / "q.sql"
    query_file.write_text("-- failures per mode\nSELECT mode, count(*) AS n FROM failures "
                          "GROUP BY mode;\n")
    out = tmp_path / "modes.csv"
    result = sql(run_dir, "--file", str(query_file), "--format", "csv", "--output", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_text() == "mode,n\nwrong_answer,2\n"


@pytest.mark.parametrize("query", [
    "SELECT * FROM failure_modes_by_round",
    "WITH x AS (SELECT 1 AS a) SELECT a FROM x",
    "FROM tasks SELECT task_id LIMIT 1",
    "DESCRIBE tasks",
    "SHOW TABLES",
    "SUMMARIZE rounds",
    "EXPLAIN SELECT count(*) FROM trajectories",
    "EXPLAIN ANALYZE SELECT count(*) FROM trajectories",
    "-- leading comment\nEXPLAIN SELECT 1",
    "/* metadata */ PRAGMA show_tables",
    "PRAGMA table_info('tasks')",
    "VALUES (1, 'a')",
])
def test_reads_are_allowed(run_dir: Path, query: str) -> None:
    # `--` ends the options, so a query may start with a `--` comment
    result = sql(run_dir, "--format", "json", "--", query)
    assert result.exit_code == 0, result.output
    assert isinstance(json.loads(result.stdout), list)


REFUSED = [
    ("DROP TABLE tasks", "DROP"),
    ("INSERT INTO rounds (round) VALUES (9)", "INSERT"),
    ("UPDATE tasks SET answer = 'x'", "UPDATE"),
    ("DELETE FROM failures", "DELETE"),
    ("CREATE TABLE x (a INT)", "CREATE"),
    ("CREATE OR REPLACE VIEW hardest_tasks AS SELECT 1", "CREATE"),
    ("ALTER TABLE tasks ADD COLUMN y INT", "ALTER"),
    ("COPY tasks TO '{tmp}/leak.csv'", "COPY"),
    ("COPY (SELECT * FROM tasks) TO '{tmp}/leak.parquet' (FORMAT parquet)", "COPY"),
    ("EXPORT DATABASE '{tmp}/dump'", "EXPORT"),
    ("ATTACH '{tmp}/other.duckdb' AS o", "ATTACH"),
    ("DETACH o", "DETACH"),
    ("INSTALL httpfs", "INSTALL"),
    ("LOAD httpfs", "LOAD"),
    ("SET threads = 1", "SET"),
    ("PRAGMA threads = 1", "PRAGMA"),
    ("PRAGMA enable_profiling", "PRAGMA enable_profiling"),
    ("CALL force_checkpoint()", "CALL"),
    ("CHECKPOINT", "CHECKPOINT"),
    ("VACUUM", "VACUUM"),
    ("BEGIN TRANSACTION", "BEGIN"),
    ("WITH d AS (DELETE FROM failures RETURNING *) SELECT count(*) FROM d", "DELETE"),
    ("WITH d AS (INSERT INTO rounds (round) VALUES (9) RETURNING *) SELECT * FROM d", "INSERT"),
    ("EXPLAIN ANALYZE DELETE FROM failures", "DELETE"),
    ("-- a comment\n/* and another */ EXPLAIN analyse DELETE FROM failures", "DELETE"),
    ("/* x */ PRAGMA enable_profiling", "PRAGMA enable_profiling"),
    ("SELECT 1; DROP TABLE tasks", "one statement per call"),
    ("SELEC 1", "cannot parse"),
    ("  -- nothing\n", "no SQL statement"),
]


@pytest.mark.parametrize(("query", "named"), REFUSED)
def test_guard_refuses_every_kind_of_write(query: str, named: str) -> None:
    with pytest.raises(ReadOnlyQueryError, match=re.escape(named)):
        check_read_only(query)


def test_cli_refuses_writes_before_they_run(run_dir: Path, tmp_path: Path) -> None:
    before = fingerprint(run_dir)
    for query, named in REFUSED:
        result = sql(run_dir, "--", query.format(tmp=tmp_path))
        assert result.exit_code == 2, query
        assert result.stderr.startswith("error: "), query
        assert named in result.stderr, (query, result.stderr)
        assert "Traceback" not in result.output
    assert fingerprint(run_dir) == before
    assert list(tmp_path.iterdir()) == []  # no COPY/EXPORT/ATTACH file appeared


def test_usage_errors(run_dir: Path, tmp_path: Path) -> None:
    cases = [
        ((), "either as the QUERY argument or with --file"),
        (("SELECT 1", "--file", str(tmp_path / "q.sql")), "not both"),
        (("--file", str(tmp_path / "missing.sql")), "no SQL file"),
        (("SELECT 1", "--format", "xml"), "unknown --format"),
        (("SELECT 1", "--format", "parquet"), "--output"),
        (("SELECT nope FROM tasks",), "BinderException"),
    ]
    for args, message in cases:
        result = sql(run_dir, *args)
        assert result.exit_code == 2, args
        assert message in result.stderr, (args, result.stderr)


def test_old_store_is_refused_read_only_with_the_upgrade_command(tmp_path: Path) -> None:
    import duckdb

    run = tmp_path / "old"
    run.mkdir()
    with duckdb.connect(str(run / "sentinel.duckdb")) as con:
        for statement in V1_DDL:
            con.execute(statement)
    result = sql(run, "SELECT 1")
    assert result.exit_code == 2
    assert "python -m task_store.upgrade" in result.stderr
    with duckdb.connect(str(run / "sentinel.duckdb"), read_only=True) as con:
        assert con.execute("SELECT value FROM meta").fetchall() == [("1",)]  # untouched


TINY_LOOP = [
    "policy.tiny.hidden_size=32", "policy.tiny.intermediate_size=64",
    "policy.tiny.num_hidden_layers=2", "policy.tiny.num_attention_heads=4",
    "sft.steps=10", "sft.num_examples=32", "sft.batch_size=8", "rounds=2", "eval.greedy=false",
    "batch.steps_per_round=1", "batch.tasks_per_step=4", "batch.group_size=2",
    "eval.num_tasks=4", "eval.samples=1", "env.max_turns=2", "env.max_turn_tokens=16",
    "env.max_tokens=128",
]


@pytest.mark.slow
def test_queries_succeed_while_a_loop_writes(tmp_path: Path) -> None:
    run = tmp_path / "live"
    args = [sys.executable, "-m", "sentinel", "loop", "--config", "configs/quickstart.yaml",
            "--run-dir", str(run)]
    # Without the quickstart's embedded teacher, whose training (a minute) is not what this
    # test is about.
    for item in [*TINY_LOOP, "generators=[{type: mutate}]"]:
        args += ["--set", item]
    loop = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    seen_rounds: set[int] = set()
    n_queries = 0
    try:
        deadline = time.monotonic() + 180
        while loop.poll() is None:
            assert time.monotonic() < deadline, "loop did not finish"
            if not (run / "sentinel.duckdb").exists():
                time.sleep(0.1)
                continue
            result = sql(run, "SELECT count(*) AS n FROM rounds", "--format", "json")
            assert result.exit_code == 0, result.output
            seen_rounds.add(json.loads(result.stdout)[0]["n"])
            result = sql(run, "SELECT * FROM failure_patterns", "--format", "csv")
            assert result.exit_code == 0, result.output
            n_queries += 2
            time.sleep(0.05)
    finally:
        if loop.poll() is None:
            loop.kill()
        stderr = loop.communicate(timeout=60)[1]
    assert loop.returncode == 0, stderr[-3000:]
    final = sql(run, "SELECT count(*) AS n FROM rounds", "--format", "json")
    assert json.loads(final.stdout) == [{"n": 3}]  # round 0 (SFT) + 2 GRPO rounds
    assert n_queries >= 10
    assert len(seen_rounds) >= 2, seen_rounds  # it read between commits, not only at the end
