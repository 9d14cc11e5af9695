"""`sentinel.heldout`: the paired change of held-out success and recovery between two rounds,
with its bootstrap CI over the held-out tasks, on a real store; and where the CLI prints it."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

import pytest

from sentinel.heldout import heldout_change
from task_store import Store
from tests.test_recovery_report import fault_run  # noqa: F401  (fixture)
from tests.test_report import sentinel

# task -> (skills, success rate in round 0, in round 2); 'gone' is not evaluated in round 2.
TASKS = {
    "clean-1": (["op:add"], 1.0, 1.0),
    "clean-2": (["op:mul"], 0.5, 1.0),
    "to-1": (["recover:timeout"], 0.0, 1.0),
    "to-2": (["recover:timeout"], 0.25, 0.25),
    "to-3": (["recover:timeout"], 0.5, 1.0),
    "nt-1": (["recover:notation"], 0.0, 0.5),
    "gone": (["recover:renamed"], 0.0, None),
}


def _store(path: Path, tasks: dict[str, tuple[list[str], float, float | None]]) -> Store:
    store = Store.create(path, run_id="heldout", config={})
    with store.connect(read_only=False) as con:
        for task_id, (skills, r0, r2) in tasks.items():
            con.execute("INSERT INTO tasks (task_id, family, spec, prompt, answer, skills, origin)"
                        " VALUES (?, 'arith', '{}', '[]', '1', ?, 'eval')", [task_id, skills])
            for rnd, rate in ((0, r0), (2, r2)):
                if rate is not None:
                    con.execute("INSERT INTO evals VALUES (?, ?, 4, ?, ?, NULL)",
                                [rnd, task_id, int(rate * 4), rate])
    return store


def test_heldout_change_pairs_the_tasks_of_both_rounds(tmp_path: Path) -> None:
    out = heldout_change(_store(tmp_path / "s.duckdb", TASKS), 0, 2)
    # success: the six tasks evaluated in both rounds ('gone' is not paired)
    assert out["success"].first == pytest.approx((1 + 0.5 + 0 + 0.25 + 0.5 + 0) / 6)
    assert out["success"].last == pytest.approx((1 + 1 + 1 + 0.25 + 1 + 0.5) / 6)
    assert out["success"].tasks == 6
    # recovery: the mean over the fault types of each type's mean (timeout 3 tasks, notation 1)
    assert out["recovery"].first == pytest.approx(((0 + 0.25 + 0.5) / 3 + 0) / 2)
    assert out["recovery"].last == pytest.approx(((1 + 0.25 + 1) / 3 + 0.5) / 2)
    assert out["recovery"].tasks == 4
    for change in out.values():
        assert change.low <= change.diff <= change.high
    # notation's one task moves by +0.5 in every resample: the CI's ends differ only by timeout
    assert out["recovery"].high - out["recovery"].low <= (1 - 0) / 2 + 1e-9
    assert heldout_change(_store(tmp_path / "t.duckdb", TASKS), 0, 5) == {}


def test_heldout_change_without_fault_tasks_has_no_recovery(tmp_path: Path) -> None:
    clean = {k: v for k, v in TASKS.items() if k.startswith("clean")}
    assert set(heldout_change(_store(tmp_path / "s.duckdb", clean), 0, 2)) == {"success"}


def test_heldout_change_ci_matches_the_normal_approximation(tmp_path: Path) -> None:
    """400 clean tasks whose change is +1 (60 tasks), -1 (20) or 0: mean +0.1; the bootstrap
    CI's width is within 15 % of 2 * 1.96 * sd / sqrt(n), and it excludes 0. A change of 0 on
    average (40 up, 40 down) gives a CI around 0."""
    def tasks(up: int, down: int) -> dict[str, tuple[list[str], float, float]]:
        return {f"t{i}": (["op:add"], 0.0 if i < up else 1.0 if i < up + down else 0.5,
                          1.0 if i < up else 0.0 if i < up + down else 0.5)
                for i in range(400)}

    change = heldout_change(_store(tmp_path / "a.duckdb", tasks(60, 20)), 0, 2)["success"]
    diffs = [1.0] * 60 + [-1.0] * 20 + [0.0] * 320
    width = 2 * 1.96 * statistics.pstdev(diffs) / math.sqrt(len(diffs))
    assert change.diff == pytest.approx(0.1)
    assert change.high - change.low == pytest.approx(width, rel=0.15)
    assert change.low > 0
    level = heldout_change(_store(tmp_path / "b.duckdb", tasks(40, 40)), 0, 2)["success"]
    assert level.diff == pytest.approx(0.0) and level.low < 0 < level.high


def test_status_states_the_change_with_its_ci(fault_run: Path) -> None:  # noqa: F811
    proc = sentinel("status", "--run-dir", str(fault_run), env={**os.environ, "COLUMNS": "300"})
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("round 0 -> 3")]
    recovery = heldout_change(Store(fault_run / "sentinel.duckdb"), 0, 3)["recovery"]
    assert f"round 0 -> 3, mean held-out recovery: {recovery}" in lines
    assert any(ln.startswith("round 0 -> 3, held-out success: ") for ln in lines)
