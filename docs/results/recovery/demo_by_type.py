"""Held-out recovery per fault type (and clean success), round 0 -> last round, of one or more runs:
each type's rate over its held-out tasks at both rounds and the paired change with a 95 %
bootstrap CI over those tasks (`sentinel.heldout`: its query and its resampling, one stratum per
type), then the mean over the types of each run, as `sentinel status` prints it. For runs that
train on one fault type alone (the isolation runs of docs/results.md) it shows what training
one remedy does to the others.

Usage: python docs/results/recovery/demo_by_type.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from sentinel.heldout import paired_change, paired_rates
from task_store import Store


def by_type(store: Store, first: int, last: int) -> dict[str, list[tuple[float, float]]]:
    """{fault type or 'clean': [(rate at first, rate at last) per held-out task]}."""
    strata: dict[str, list[tuple[float, float]]] = {}
    for r0, r1, faults in paired_rates(store, first, last):
        for name in faults or ["clean"]:
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
            print(f"  {name:<11} {paired_change([strata[name]])}")
        faults = [strata[t] for t in sorted(strata) if t != "clean"]  # as heldout_change
        if faults:
            print(f"  {'mean':<11} {paired_change(faults)}")


if __name__ == "__main__":
    main(sys.argv[1:])
