"""How the policy fails a `notation` task (the user writes `x` for `*`): of the failed held-out
notation tasks at the last eval, how many the policy's first calculator call divides (a `/`)
where the task's expression has no division: the colon remedy (`:` → `/`) written for `x`.
Summed over the run directories given (the seeds of one arm).

Usage: python docs/results/recovery/notation_divides.py runs/tail-tailexp/exposure-s{0,1,2,3,4}
"""

from __future__ import annotations

import json
import sys

import duckdb

FAILED = """SELECT t.traj_id, k.spec FROM trajectories t JOIN tasks k USING (task_id)
WHERE t.split = 'eval' AND t.round = (SELECT max(round) FROM trajectories WHERE split = 'eval')
  AND list_contains(k.skills, 'recover:notation') AND NOT t.success"""
FIRST_CALL = """SELECT arguments FROM steps WHERE traj_id = ? AND kind = 'tool_call'
ORDER BY step LIMIT 1"""


def main(run_dirs: list[str]) -> None:
    divides = failed = 0
    for run_dir in run_dirs:
        con = duckdb.connect(f"{run_dir}/sentinel.duckdb", read_only=True)
        for traj_id, spec in con.execute(FAILED).fetchall():
            failed += 1
            first = con.execute(FIRST_CALL, [traj_id]).fetchone()
            if first and "/" in (first[0] or "") and "/" not in json.loads(spec)["expr"]:
                divides += 1
        con.close()
    print(f"failed notation tasks at the last eval: {failed}; first call divides where the task "
          f"has no division: {divides}")


if __name__ == "__main__":
    main(sys.argv[1:])
