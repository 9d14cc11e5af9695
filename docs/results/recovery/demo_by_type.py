"""Held-out recovery per fault type (and clean success), round 0 -> last round, of one or more runs:
each type's rate over its held-out tasks at both rounds and the paired change with a 95 %
bootstrap CI over those tasks (`sentinel.heldout`: its query and its resampling, one stratum per
type), then the mean over the types of each run, as `sentinel status` prints it. For runs that
train on one fault type alone (the isolation runs of docs/results.md) it shows what training
one remedy does to the others.

Usage: python docs/results/recovery/demo_by_type.py [--round N] RUN_DIR [RUN_DIR ...]
(`--round N`: compare round 0 with round N instead of each run's last round.)
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


def compared_round(store: Store, at: int | None) -> int:
    """The round compared with round 0: `at` (at most the last evaluated), else the last."""
    _, rows = store.query("SELECT max(round) FROM evals")
    return rows[0][0] if at is None else min(at, rows[0][0])


def parse_args(args: list[str]) -> tuple[list[str], int | None]:
    """`[--round N] RUN_DIR ...` as (run dirs, N or None)."""
    return (args[2:], int(args[1])) if args[:1] == ["--round"] else (args, None)


def main(run_dirs: list[str], at: int | None = None) -> None:
    for run_dir in run_dirs:
        store = Store(Path(run_dir) / "sentinel.duckdb")
        last = compared_round(store, at)
        strata = by_type(store, 0, last)
        print(f"{run_dir}: round 0 -> {last}")
        for name in sorted(strata, key=lambda s: (s == "clean", s)):
            print(f"  {name:<11} {paired_change([strata[name]])}")
        faults = [strata[t] for t in sorted(strata) if t != "clean"]  # as heldout_change
        if faults:
            print(f"  {'mean':<11} {paired_change(faults)}")


if __name__ == "__main__":
    main(*parse_args(sys.argv[1:]))
