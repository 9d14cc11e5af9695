"""What the failure arm trained on: training rollouts by generator (`seed`: base-distribution
draws) and fault type (the task's `recover:` skill; None: clean), with their success rate,
summed over the given run directories.

Usage: python docs/results/recovery/training_mix.py runs/bench-5/failure-s{0,1,2,3,4}
"""

from __future__ import annotations

import sys
from collections import defaultdict

import duckdb

QUERY = """
SELECT coalesce(k.generator, k.origin),
       list_filter(k.skills, lambda x: starts_with(x, 'recover:'))[1],
       count(*), sum(t.success::INT)
FROM trajectories t JOIN tasks k USING (task_id) WHERE t.split = 'train' GROUP BY ALL"""


def main(run_dirs: list[str]) -> None:
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for run_dir in run_dirs:
        con = duckdb.connect(f"{run_dir}/sentinel.duckdb", read_only=True)
        for generator, fault, n, successes in con.execute(QUERY).fetchall():
            totals[(str(generator), str(fault))][0] += n
            totals[(str(generator), str(fault))][1] += successes
    print(f"training rollouts {sum(n for n, _ in totals.values())}")
    for (generator, fault), (n, successes) in sorted(totals.items()):
        print(f"{generator:10s} {fault:22s} {n:6d}  success {successes / n:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
