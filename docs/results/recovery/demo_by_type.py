"""Held-out recovery per fault type (and clean success), round 0 -> last round, of one or more runs:
each type's rate over its held-out tasks at both rounds and the paired change with a 95 %
bootstrap CI over those tasks (`sentinel.heldout`'s resampling, one stratum per type), then the
mean over the types of each run. For runs that train on one fault type alone (the isolation
runs of docs/results.md) it shows what training one remedy does to the others.

Usage: python docs/results/recovery/demo_by_type.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from sentinel.analyzer import fault_types
from sentinel.heldout import _change
from task_store import Store

BOOTSTRAP = 2000


def by_type(store: Store, first: int, last: int) -> dict[str, list[tuple[float, float]]]:
    """{fault type or 'clean': [(rate at first, rate at last) per held-out task]}."""
    _, rows = store.query(
        "SELECT e0.success_rate, e1.success_rate, t.skills FROM evals e0 "
        "JOIN evals e1 ON e0.task_id = e1.task_id AND e1.round = ? "
        "JOIN tasks t ON t.task_id = e0.task_id WHERE e0.round = ?", [last, first])
    strata: dict[str, list[tuple[float, float]]] = {}
    for r0, r1, skills in rows:
        types = fault_types(skills or [])
        for name in types or ["clean"]:
            strata.setdefault(name, []).append((r0, r1))
    return strata


def main(run_dirs: list[str]) -> None:
    for run_dir in run_dirs:
        store = Store(Path(run_dir) / "sentinel.duckdb")
        _, rows = store.query("SELECT max(round) FROM evals")
        last = rows[0][0]
        strata = by_type(store, 0, last)
        print(f"{run_dir}: round 0 -> {last}")
        for name in sorted(strata, key=lambda s: (s == "clean", s)):
            print(f"  {name:<11} {_change([strata[name]], BOOTSTRAP, 0)}")
        faults = [g for name, g in strata.items() if name != "clean"]
        if faults:
            print(f"  {'mean':<11} {_change(faults, BOOTSTRAP, 0)}")


if __name__ == "__main__":
    main(sys.argv[1:])
