"""The demo's change from round 0 to the last round over several runs (one per training seed):
each run's paired change of held-out success and mean recovery with its CI over the held-out
tasks (`sentinel.heldout`, what `sentinel status` prints), then the mean over the runs with a
95 % bootstrap CI over the runs (`sentinel.bench.bootstrap_ci`), which is the spread a user
meets from one `make demo` to the next.

Usage: python docs/results/recovery/demo_seeds.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from sentinel.bench import bootstrap_ci
from sentinel.heldout import heldout_change
from task_store import Store


def main(run_dirs: list[str]) -> None:
    diffs: dict[str, list[float]] = {"success": [], "recovery": []}
    for run_dir in run_dirs:
        store = Store(Path(run_dir) / "sentinel.duckdb")
        _, rows = store.query("SELECT max(round) FROM evals")
        last = rows[0][0]
        changes = heldout_change(store, 0, last)
        for name, change in changes.items():
            diffs[name].append(change.diff)
            print(f"{run_dir}: round 0 -> {last}, {name}: {change}")
    for name, values in diffs.items():
        low, high = bootstrap_ci(values)
        print(f"over {len(values)} runs, {name}: mean change {statistics.fmean(values):+.3f} "
              f"[{low:+.3f}, {high:+.3f}], runs {min(values):+.3f} to {max(values):+.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
