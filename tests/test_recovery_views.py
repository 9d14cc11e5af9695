"""Recovery rate per fault type (schema v4): the `recovery_rates` view and the recovery columns of
`failure_patterns`, on real DuckDB files whose expected rates are worked out by hand below."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from task_store import SCHEMA_VERSION, SchemaVersionError, Store
from tests.test_store import dump, round_row, v1_store
from tests.test_views import failures, rows_of, task, trajs

A = task("A", ["op:add", "recover:timeout", "steps:2"], origin="eval")
B = task("B", ["op:mul", "recover:timeout", "steps:3"], origin="eval")
C = task("C", ["op:add", "recover:renamed", "steps:2"], origin="eval")
D = task("D", ["op:add", "steps:2"], origin="eval")  # clean
L = task("L", ["recover:tool_error", "tool:lookup"])  # lookup's tag counts as a fault type
M = task("M", ["op:mul", "recover:notation", "recover:timeout"])  # two faults
E = task("E", ["recover:", "op:add"])  # nothing after the prefix: no fault type


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.create(tmp_path / "sentinel.duckdb", "run", {})


def evals(r: int, rows: list[tuple[str, int, int, bool | None]]) -> list[dict]:
    return [{"round": r, "task_id": t, "k": k, "successes": s, "success_rate": s / k,
             "greedy_success": g} for t, k, s, g in rows]


def two_rounds(store: Store) -> None:
    store.record_round(
        1, round_row(), tasks=[A, B, C, D, L, M, E],
        trajectories=[*trajs("L", 1, [True, False, False, True]),
                      *trajs("M", 1, [True, False, False]),
                      *trajs("A", 1, [False, False]),
                      *trajs("D", 1, [True]), *trajs("E", 1, [False]),
                      # held-out rollouts are counted from `evals`, never from here
                      *trajs("A", 1, [True, True, True], split="eval")],
        evals=evals(1, [("A", 4, 1, True), ("B", 4, 3, False), ("C", 4, 0, False),
                        ("D", 4, 4, True)]),
        failures=[*failures(2, 1, "tool_error_unrecovered", A["skills"], "cA"),
                  *failures(1, 1, "unknown_tool", C["skills"], "cC"),
                  *failures(1, 1, "wrong_answer", D["skills"], "cD"),
                  *failures(1, 1, "loop", M["skills"], "cM")])
    store.record_round(
        2, round_row(), trajectories=trajs("A", 2, [True, False, False, False]),
        evals=evals(2, [("A", 2, 2, None), ("B", 2, 1, None)]),  # greedy eval off
        failures=failures(1, 2, "tool_error_unrecovered", A["skills"], "cA"))


def test_recovery_rates_per_round_split_and_fault_type(store: Store) -> None:
    two_rounds(store)
    cols, rows = store.query("SELECT * FROM recovery_rates")
    assert cols == ["round", "split", "fault_type", "tasks", "attempts", "recovered",
                    "recovery_rate", "greedy_rate"]
    assert rows == [
        # renamed: C alone, 0 of 4 sampled, greedy failed.
        (1, "eval", "renamed", 1, 4, 0, 0.0, 0.0),
        # timeout: A 1/4 + B 3/4 = 4/8; greedy A yes, B no -> 1/2. D (clean) is not counted.
        (1, "eval", "timeout", 2, 8, 4, 0.5, 0.5),
        (1, "train", "notation", 1, 3, 1, pytest.approx(1 / 3), None),
        # timeout on train: M 1/3 (it carries timeout too) + A 0/2 = 1/5.
        (1, "train", "timeout", 2, 5, 1, 0.2, None),
        (1, "train", "tool_error", 1, 4, 2, 0.5, None),
        # A 2/2 + B 1/2 = 3/4; no greedy attempt this round -> NULL.
        (2, "eval", "timeout", 2, 4, 3, 0.75, None),
        (2, "train", "timeout", 1, 4, 1, 0.25, None),
    ]
    # The mean held-out recovery rate of a round (docs/schema.md): unweighted over fault types.
    assert rows_of(store, "SELECT round, avg(recovery_rate) FROM recovery_rates "
                          "WHERE split = 'eval' GROUP BY round ORDER BY round") == [
        (1, 0.25), (2, 0.75)]


def test_failure_patterns_show_the_recovery_rate_of_their_fault_type(store: Store) -> None:
    two_rounds(store)
    rows = rows_of(store, "SELECT mode, n_failures, last_round, fault_type, recovery_rate, "
                          "train_recovery_rate FROM failure_patterns")
    assert store.query("SELECT * FROM failure_patterns")[0] == [
        "family", "skills", "mode", "cluster_id", "n_failures", "first_round", "last_round",
        "trend", "fault_type", "recovery_rate", "train_recovery_rate"]
    assert rows == [
        # A's pattern failed last in round 2: timeout's rates of round 2 (3/4 held-out, 1/4 train).
        ("tool_error_unrecovered", 3, 2, "timeout", 0.75, 0.25),
        # M carries two faults: no single type's rate.
        ("loop", 1, 1, "notation+timeout", None, None),
        # C: renamed, held out 0 of 4 in round 1, never trained.
        ("unknown_tool", 1, 1, "renamed", 0.0, None),
        ("wrong_answer", 1, 1, None, None, None),  # a clean task has no fault type
    ]


# `failure_patterns` as schema version 3 stored it (frozen: the file under upgrade holds this).
V3_FAILURE_PATTERNS = """CREATE OR REPLACE VIEW failure_patterns AS
WITH patterns AS (
    SELECT family, list_sort(skills) AS skills, mode, max(cluster_id) AS cluster_id,
           count(*)::BIGINT AS n_failures, min(round) AS first_round, max(round) AS last_round
    FROM failures GROUP BY family, list_sort(skills), mode
)
SELECT p.family, p.skills, p.mode, p.cluster_id, p.n_failures, p.first_round, p.last_round,
       c.trend
FROM patterns p LEFT JOIN clusters c ON c.cluster_id = p.cluster_id AND c.round = p.last_round
ORDER BY p.n_failures DESC, p.family, p.mode, p.skills"""


def v3_store(path: Path) -> Path:
    """A version-3 file: the frozen v1 file, the frozen steps 1 -> 2 -> 3, v3's
    `failure_patterns`, and a fault task with a held-out tally and a failure."""
    from task_store.migrations import MIGRATIONS

    v1_store(path)
    with duckdb.connect(str(path)) as con:
        for statement in (*MIGRATIONS[1], *MIGRATIONS[2], V3_FAILURE_PATTERNS):
            con.execute(statement)
        con.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
        con.execute("INSERT INTO tasks (task_id, family, spec, prompt, answer, skills, origin) "
                    "VALUES ('arith-t', 'arith', '{}', '[]', '7', "
                    "['op:add', 'recover:timeout'], 'eval')")
        con.execute("INSERT INTO evals VALUES (1, 'arith-t', 4, 3, 0.75, true)")
        con.execute("INSERT INTO failures VALUES ('ft', 't1', 'arith-t', 1, "
                    "'tool_error_unrecovered', 1, 'timed out', ['recover:timeout', 'op:add'], "
                    "'arith', 'cl-t')")
    return path


def test_v3_file_upgrade_adds_the_recovery_view(tmp_path: Path) -> None:
    path = v3_store(tmp_path / "v3.duckdb")
    with pytest.raises(SchemaVersionError, match="older"):
        Store(path).query("SELECT 1")  # read-only opens never upgrade
    assert Store(path).upgrade() == 3
    meta = dict(dump(path, "meta"))
    assert meta["schema_version"] == str(SCHEMA_VERSION) and "upgraded_from_3_at" in meta
    assert rows_of(Store(path), "SELECT * FROM recovery_rates") == [
        (1, "eval", "timeout", 1, 4, 3, 0.75, 1.0)]
    assert rows_of(Store(path), "SELECT fault_type, recovery_rate FROM failure_patterns "
                                "WHERE mode = 'tool_error_unrecovered'") == [("timeout", 0.75)]
    fresh = Store.create(tmp_path / "new.duckdb", "r", {})
    views = "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY view_name"
    assert Store(path).query(views) == fresh.query(views)
