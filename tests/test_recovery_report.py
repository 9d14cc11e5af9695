"""Held-out recovery per fault type in `sentinel report` and `sentinel status`, on real stores
(the synthetic store of tests/test_report.py plus hand-made fault tasks and their `evals`) whose
rates are worked out by hand below."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sentinel.report import MAX_RECOVERY_ROWS, build_report, collect
from task_store import Store
from tests.test_report import sentinel, synth_store

FAULT_TASKS = {"fault-t1": ["op:add", "recover:timeout", "steps:2"],
               "fault-t2": ["op:mul", "recover:timeout", "steps:3"],
               "fault-r": ["op:add", "recover:renamed", "steps:2"]}
# round -> task -> (k, successes, greedy success); round 3 holds no renamed task.
EVALS = {
    0: {"fault-t1": (4, 1, False), "fault-t2": (4, 0, False), "fault-r": (4, 0, False)},
    1: {"fault-t1": (4, 2, True), "fault-t2": (4, 1, False), "fault-r": (5, 1, True)},
    2: {"fault-t1": (4, 4, True), "fault-t2": (4, 2, True), "fault-r": (5, 3, True)},
    3: {"fault-t1": (4, 3, True), "fault-t2": (4, 3, False)},
}
# By hand: timeout pools t1 and t2, renamed is fault-r alone; the mean weighs each type once.
TIMEOUT = {0: 1 / 8, 1: 3 / 8, 2: 6 / 8, 3: 6 / 8}
RENAMED = {0: 0.0, 1: 1 / 5, 2: 3 / 5}
MEAN = {0: 1 / 16, 1: (3 / 8 + 1 / 5) / 2, 2: (6 / 8 + 3 / 5) / 2, 3: 6 / 8}
GREEDY_TIMEOUT = {0: 0.0, 1: 0.5, 2: 1.0, 3: 0.5}


def add_fault_evals(store: Store, evals: dict[int, dict[str, tuple[int, int, bool]]]) -> None:
    with store.connect(read_only=False) as con:
        for task_id, skills in FAULT_TASKS.items():
            con.execute("INSERT INTO tasks (task_id, family, spec, prompt, answer, skills, origin)"
                        " VALUES (?, 'arith', '{}', '[]', '1', ?, 'eval')", [task_id, skills])
        for r, per_task in evals.items():
            for task_id, (k, s, greedy) in per_task.items():
                con.execute("INSERT INTO evals VALUES (?, ?, ?, ?, ?, ?)",
                            [r, task_id, k, s, s / k, greedy])


@pytest.fixture
def fault_run(tmp_path: Path) -> Path:
    add_fault_evals(synth_store(tmp_path / "sentinel.duckdb", rounds=4), EVALS)
    return tmp_path


def test_report_tables_and_plots_recovery_per_fault_type(fault_run: Path) -> None:
    store = Store(fault_run)
    with store.connect(read_only=True) as con:
        ctx = collect(con)
    recovery = ctx["recovery"]
    assert recovery["types"] == ["renamed", "timeout"]
    rows = {row["round"]: row for row in recovery["rows"]}
    assert sorted(rows) == [0, 1, 2, 3]
    for r, row in rows.items():
        assert row["mean"] == pytest.approx(MEAN[r])
        assert row["rates"]["timeout"][:2] == (pytest.approx(TIMEOUT[r]),
                                               pytest.approx(GREEDY_TIMEOUT[r]))
        if r in RENAMED:
            assert row["rates"]["renamed"][0] == pytest.approx(RENAMED[r])
        else:
            assert "renamed" not in row["rates"]
    # The SQL view over the same store agrees with the report's own base-table query.
    _, view = store.query("SELECT round, fault_type, recovery_rate FROM recovery_rates "
                          "WHERE split = 'eval'")
    assert {(r, t): v for r, t, v in view} == {
        (r, t): row["rates"][t][0] for r, row in rows.items() for t in row["rates"]}

    page = build_report(fault_run).read_text()
    section = page[page.index('<h2 id="recovery">'):page.index('<h2 id="failures">')]
    assert 'href="#recovery"' in page
    svg = section[section.index('id="plot-recovery"'):section.index("</svg>")]
    assert len(re.findall(r"<polyline ", svg)) == 3  # mean, renamed, timeout
    # One marker per point: 4 means, 3 renamed (none in round 3), 4 timeout.
    assert len(re.findall(r"<circle ", svg)) == 11
    assert f"timeout · round 1: {TIMEOUT[1]:.3f}" in svg
    table = section[section.index("<table>"):section.index("</table>")]
    row1 = table[table.index("<tr><td>1</td>"):]
    row1 = row1[:row1.index("</tr>")]
    assert f"<b>{MEAN[1]:.3f}</b>" in row1
    assert f"{RENAMED[1]:.3f} <span" in row1 and f"{TIMEOUT[1]:.3f} <span" in row1
    row3 = table[table.index("<tr><td>3</td>"):]
    assert row3[:row3.index("</tr>")].count("–") == 1  # renamed absent in round 3


def test_report_without_fault_tasks_has_no_recovery_section(tmp_path: Path) -> None:
    synth_store(tmp_path / "sentinel.duckdb", rounds=3)
    page = build_report(tmp_path).read_text()
    assert 'id="recovery"' not in page and "plot-recovery" not in page


def test_recovery_table_of_a_long_run_pools_buckets_of_rounds(tmp_path: Path) -> None:
    rounds = 60
    evals = {r: {"fault-t1": (4, r % 5, r % 2 == 0), "fault-t2": (2, r % 3, False)}
             for r in range(rounds)}
    add_fault_evals(synth_store(tmp_path / "sentinel.duckdb", rounds=rounds), evals)
    with Store(tmp_path).connect(read_only=True) as con:
        recovery = collect(con)["recovery"]
    assert len(recovery["rows"]) <= MAX_RECOVERY_ROWS
    bucket = recovery["bucket"]
    assert bucket == 3  # rounds 1-59 in buckets of 3 (at most 24 of them) and round 0 alone
    for row in recovery["rows"]:
        members = [0] if row["round"] == 0 else range(row["round"], row["last"] + 1)
        k = sum(evals[r][t][0] for r in members for t in evals[r])
        s = sum(evals[r][t][1] for r in members for t in evals[r])
        assert row["rates"]["timeout"][0] == pytest.approx(s / k), row
        assert row["rates"]["timeout"][2] == k


def test_status_shows_held_out_recovery_per_fault_type(fault_run: Path) -> None:
    proc = sentinel("status", "--run-dir", str(fault_run), env={**os.environ, "COLUMNS": "300"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "held-out recovery per fault type" in out
    head = next(line for line in out.splitlines() if "mean (greedy)" in line)
    assert [c.strip() for c in head.split("┃")[1:-1]] == [
        "round", "mean (greedy)", "renamed", "timeout"]
    table = out[out.index("held-out recovery per fault type"):]
    cells = {}
    for line in table.splitlines():
        parts = [c.strip() for c in line.split("│")[1:-1]]
        if parts and parts[0].isdigit():
            cells[int(parts[0])] = parts[1:]
    # Round 1: greedy mean over the two types (timeout 1/2, renamed 1/1) = 0.75.
    assert cells[1] == [f"{MEAN[1]:.3f} (0.750)", f"{RENAMED[1]:.3f}", f"{TIMEOUT[1]:.3f}"]
    assert cells[3] == [f"{MEAN[3]:.3f} (0.500)", "-", f"{TIMEOUT[3]:.3f}"]
    assert sorted(cells) == [0, 1, 2, 3]


def test_status_without_fault_tasks_shows_no_recovery_table(tmp_path: Path) -> None:
    synth_store(tmp_path / "sentinel.duckdb", rounds=2)
    proc = sentinel("status", "--run-dir", str(tmp_path), env={**os.environ, "COLUMNS": "300"})
    assert proc.returncode == 0, proc.stderr
    assert "recovery" not in proc.stdout
