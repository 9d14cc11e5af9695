"""The SQL views stored in the file, each checked on a hand-built store whose answer is known."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import duckdb
import pytest

from task_store import Store
from tests.test_store import failure_row, round_row, task_row, traj_row

_ids = itertools.count()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.create(tmp_path / "sentinel.duckdb", "run", {})


def trajs(task_id: str, round: int, outcomes: list[bool], split: str = "train") -> list[dict]:
    return [traj_row(f"t{next(_ids)}", task_id, round, split=split, success=ok) for ok in outcomes]


def task(task_id: str, skills: list[str], **extra: Any) -> dict[str, Any]:
    return {**task_row(0), "task_id": task_id, "skills": skills, **extra}


def failures(n: int, round: int, mode: str, skills: list[str], cluster: str) -> list[dict]:
    rows = []
    for _ in range(n):
        row = failure_row(f"f{next(_ids)}", "t", "task", round, mode)
        rows.append({**row, "skills": skills, "cluster_id": cluster})
    return rows


def rows_of(store: Store, sql: str) -> list[tuple]:
    return store.query(sql)[1]


def test_views_are_in_the_file_for_any_duckdb_client(store: Store) -> None:
    with duckdb.connect(str(store.path), read_only=True) as con:
        names = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal "
                            "ORDER BY view_name").fetchall()
    assert [n[0] for n in names] == ["failure_modes_by_round", "failure_patterns",
                                     "generator_yield", "hardest_tasks", "recovery_rates",
                                     "skill_mastery", "task_lineage"]


def test_view_counts_are_plain_integers(store: Store) -> None:
    # count_if and sum(BIGINT) give HUGEINT, which Arrow/pandas/Parquet readers get as decimals.
    _, rows = store.query(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() c "
        "JOIN duckdb_views() v ON v.view_name = c.table_name WHERE NOT v.internal "
        "AND (data_type LIKE 'HUGEINT%' OR data_type LIKE 'DECIMAL%')")
    assert rows == []


def test_skill_mastery_separates_train_sampled_eval_and_greedy(store: Store) -> None:
    a, b = task("A", ["x", "y"]), task("B", ["y"])
    store.record_round(
        1, round_row(), tasks=[a, b],
        trajectories=[*trajs("A", 1, [True, True, False]), *trajs("B", 1, [False]),
                      # eval rollouts (sampled and greedy) are not train attempts
                      *trajs("A", 1, [True, True, True], split="eval")],
        evals=[{"round": 1, "task_id": "A", "k": 4, "successes": 1, "success_rate": 0.25,
                "greedy_success": True},
               {"round": 1, "task_id": "B", "k": 4, "successes": 4, "success_rate": 1.0,
                "greedy_success": None}],
    )
    cols, rows = store.query("SELECT * FROM skill_mastery")
    assert cols == ["round", "split", "skill", "n", "successes", "success_rate"]
    assert rows == [
        (1, "eval", "x", 4, 1, 0.25),
        (1, "eval", "y", 8, 5, 0.625),
        (1, "eval_greedy", "x", 1, 1, 1.0),
        (1, "eval_greedy", "y", 1, 1, 1.0),
        (1, "train", "x", 3, 2, pytest.approx(2 / 3)),
        (1, "train", "y", 4, 2, 0.5),
    ]


def test_failure_patterns_group_by_skill_set(store: Store) -> None:
    pattern = {1: 2, 2: 4, 3: 2, 4: 0}
    for r in (1, 2, 3, 4):
        rows = failures(pattern[r], r, "wrong_answer", ["b", "a"] if r % 2 else ["a", "b"], "P")
        if r == 4:
            rows += failures(1, r, "loop", ["a"], "Q")
        store.record_round(r, round_row(), trajectories=trajs("T", r, [False] * 10),
                           failures=rows)
    cols, rows = store.query("SELECT * FROM failure_patterns")
    assert cols == ["family", "skills", "mode", "cluster_id", "n_failures", "first_round",
                    "last_round", "trend", "fault_type", "recovery_rate", "train_recovery_rate"]
    # No `clusters` rows were written, so there is no trend to show; no fault task, so no
    # recovery rate (tests/test_recovery_views.py has those).
    assert rows == [
        ("arith", ["a", "b"], "wrong_answer", "P", 8, 1, 3, None, None, None, None),
        ("arith", ["a"], "loop", "Q", 1, 4, 4, None, None, None, None),
    ]


def test_failure_patterns_trend_is_the_analyzers_and_null_for_a_new_cluster(store: Store) -> None:
    """One trend definition (issue #20): each pattern shows the `clusters.trend` the analyzer
    stored for the last round it failed in, so the two never disagree, and a cluster new in that
    round has NULL in both, as docs/schema.md says."""
    from sentinel.analyzer import cluster_failures
    from sentinel.types import Failure

    def failed(n: int, r: int, mode: str, skills: list[str]) -> list[Failure]:
        return [Failure(f"t{next(_ids)}", "task", r, mode, 1, "e", skills, "arith")
                for _ in range(n)]

    counts = {1: (2, 0), 2: (4, 0), 3: (1, 0), 4: (5, 2)}  # (P, Q) failures of 10 rollouts
    history: dict[str, list[tuple[int, float]]] = {}
    for r, (p, q) in counts.items():
        found = failed(p, r, "wrong_answer", ["a", "b"]) + failed(q, r, "loop", ["a"])
        clusters = cluster_failures(found, r, 10, history=history)
        for row in clusters:
            history.setdefault(row["cluster_id"], []).append((r, row["share"]))
        store.record_round(r, round_row(), trajectories=trajs("T", r, [False] * 10),
                           failures=[f.to_row() for f in found], clusters=clusters)
    stored = dict(rows_of(store, "SELECT mode, trend FROM clusters WHERE round = 4"))
    shown = dict(rows_of(store, "SELECT mode, trend FROM failure_patterns"))
    assert shown == stored
    # P: shares 0.2, 0.4, 0.1, 0.5 over rounds 1-4: slope 0.06. Q first failed in round 4.
    assert shown["wrong_answer"] == pytest.approx(0.06)
    assert shown["loop"] is None


def test_generator_yield_counts_proposals_errors_and_shrinking_clusters(store: Store) -> None:
    gen = {"origin": "generated", "parent_task_id": "S"}
    tasks = [
        task("S", ["x"]),
        task("M1", ["x"], generator="mutate", created_round=1, target_cluster_id="C1", **gen),
        task("M2", ["x"], generator="mutate", created_round=1, target_cluster_id="C1", **gen),
        task("M3", ["x"], generator="mutate", created_round=1, target_cluster_id="C2", **gen),
        task("D1", ["x"], generator="decompose", created_round=2, target_cluster_id="C1", **gen),
    ]
    reasons = [("mutate", "duplicate"), ("mutate", "duplicate"), ("mutate", "unsolvable"),
               ("mutate", "generator_timeout"), ("crashy", "generator_error"),
               ("crashy", "generator_error")]
    rejections = [{"rejection_id": f"rj{i}", "round": 1, "generator": g, "family": "arith",
                   "spec": "{}", "reason": r} for i, (g, r) in enumerate(reasons)]
    # C1 failures 4, 2, 2 of 10 train rollouts a round: mutate (from round 1) saw 0.4 -> 0.2,
    # shrank; decompose (from round 2) saw 0.2 -> 0.2, did not. C2: 0.1 -> 0.15, grew.
    c1, c2 = {1: 4, 2: 2, 3: 2}, {1: 1, 2: 3, 3: 0}
    for r in (1, 2, 3):
        store.record_round(
            r, round_row(), tasks=tasks if r == 1 else [],
            trajectories=trajs("S", r, [False] * 10),
            failures=failures(c1[r], r, "m", ["x"], "C1") + failures(c2[r], r, "m", ["x"], "C2"),
            rejections=rejections if r == 1 else [],
        )
    cols, rows = store.query("SELECT * FROM generator_yield")
    assert cols == ["generator", "proposed", "accepted", "rejected", "errors",
                    "rejected_by_reason", "targeted_clusters", "clusters_shrank"]
    assert rows == [
        ("crashy", 0, 0, 0, 2, {}, 0, 0),
        ("decompose", 1, 1, 0, 0, {}, 1, 0),
        ("mutate", 6, 3, 3, 1, {"duplicate": 2, "unsolvable": 1}, 2, 1),
    ]


def test_task_lineage_walks_parents_back_to_the_seed(store: Store) -> None:
    store.record_round(0, round_row(), tasks=[
        task("S", ["x"]),
        task("G1", ["x"], origin="generated", generator="mutate", parent_task_id="S",
             failure_ids=["f1"]),
        task("G2", ["x"], origin="generated", generator="decompose", parent_task_id="G1",
             failure_ids=["f2"]),
        task("O", ["x"], origin="generated", generator="mutate", parent_task_id="gone"),
    ])
    cols, rows = store.query("SELECT * FROM task_lineage WHERE task_id IN ('G2', 'O')")
    assert cols == ["task_id", "ancestor_id", "depth", "ancestor_origin", "ancestor_generator",
                    "failure_ids"]
    assert rows == [
        ("G2", "G2", 0, "generated", "decompose", ["f2"]),
        ("G2", "G1", 1, "generated", "mutate", ["f1"]),
        ("G2", "S", 2, "seed", None, []),
        ("O", "O", 0, "generated", "mutate", []),
        ("O", "gone", 1, None, None, None),  # a parent missing from `tasks` still shows
    ]
    assert rows_of(store, "SELECT task_id FROM task_lineage WHERE ancestor_id = 'S' "
                          "ORDER BY task_id") == [("G1",), ("G2",), ("S",)]


def test_hardest_tasks_uses_the_last_sixteen_train_attempts(store: Store) -> None:
    store.record_round(0, round_row(), tasks=[task("H", ["x"]), task("E", ["x"])])
    # Round 1 of H: samples 0-7 succeed, 8-9 fail (group g1), then group g2 all succeed.
    h1 = [{**row, "group_id": "g1", "sample_idx": i}
          for i, row in enumerate(trajs("H", 1, [True] * 8 + [False] * 2))]
    h1 += [{**row, "group_id": "g2", "sample_idx": i}
           for i, row in enumerate(trajs("H", 1, [True] * 3))]
    store.record_round(1, round_row(), trajectories=[
        *h1, *trajs("E", 1, [True, True, False, True, True]),
        *trajs("F", 1, [False] * 3),  # too few attempts to judge
    ])
    store.record_round(2, round_row(), trajectories=[
        *trajs("H", 2, [False] * 8), *trajs("H", 2, [True] * 5, split="eval")])
    # The last 16 attempts of H: round 2's 8 failures, then the newest 8 of round 1: g2's 3
    # successes and g1's samples 9..5 (2 failures, 3 successes) -> 6 / 16.
    cols, rows = store.query("SELECT * FROM hardest_tasks")
    assert cols == ["task_id", "family", "origin", "attempts", "successes", "pass_rate"]
    assert rows == [("H", "arith", "seed", 16, 6, 0.375), ("E", "arith", "seed", 5, 4, 0.8)]

