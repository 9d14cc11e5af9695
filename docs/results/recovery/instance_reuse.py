"""How often the training groups of a run met the same task: training groups by how many groups
their task had in the run (1: a task trained on once; 9+: one instance trained on 9 times or
more), for mined (`generated`) and base-distribution (`seed`) tasks, summed over the given run
directories.

Usage: python docs/results/recovery/instance_reuse.py runs/tail-prog/failure-s{0,1,2,3,4}
"""

from __future__ import annotations

import sys
from collections import defaultdict

import duckdb

QUERY = """
WITH g AS (SELECT t.task_id, k.origin, count(DISTINCT t.group_id) AS groups
           FROM trajectories t JOIN tasks k USING (task_id) WHERE t.split = 'train' GROUP BY ALL)
SELECT origin, CASE WHEN groups = 1 THEN '1' WHEN groups <= 3 THEN '2-3'
                    WHEN groups <= 8 THEN '4-8' ELSE '9+' END, count(*), sum(groups)
FROM g GROUP BY ALL"""


def main(run_dirs: list[str]) -> None:
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for run_dir in run_dirs:
        con = duckdb.connect(f"{run_dir}/sentinel.duckdb", read_only=True)
        for origin, reuse, tasks, groups in con.execute(QUERY).fetchall():
            totals[(origin, reuse)][0] += tasks
            totals[(origin, reuse)][1] += groups
    for origin in sorted({o for o, _ in totals}):
        groups = sum(g for (o, _), (_, g) in totals.items() if o == origin)
        print(f"{origin}: {groups} training groups")
        for (o, reuse), (tasks, g) in sorted(totals.items()):
            if o == origin:
                print(f"  task trained on {reuse:>3s} times: {tasks:5d} tasks, {g:5d} groups "
                      f"({g / groups:.0%})")


if __name__ == "__main__":
    main(sys.argv[1:])
