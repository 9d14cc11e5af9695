"""How large a run's GRPO updates were, per run directory: the mean KL of an update to the policy
before it (`guard/kl`), the mean gradient norm, the share of updates the KL guard halved, the
rows that ran forward only (zero advantage, kept in the loss's normaliser) and the share of
training groups whose outcomes were all equal (success on every sample or on none), read from
the store's `rounds.metrics` and `trajectories`.

A run whose curriculum drops such groups (`curriculum.drop_zero_variance`) normalises its loss
over the few groups left, so the same learning rate takes a larger step than in a run that keeps
them (they count in the normaliser, as in trl): this script shows by how much.

Usage: python docs/results/recovery/step_sizes.py runs/tail/exposure-s{0,1,2,3,4} \
           runs/tail/failure-s{0,1,2,3,4}
"""

from __future__ import annotations

import json
import statistics
import sys

import duckdb

FLAT = """SELECT count(*), sum((s = 0 OR s = n)::INT) FROM (
    SELECT group_id, sum(success::INT) AS s, count(*) AS n FROM trajectories
    WHERE split = 'train' GROUP BY group_id)"""


def main(run_dirs: list[str]) -> None:
    print("| run | KL per update | grad norm | share of updates halved "
          "| forward-only rows per update | flat groups |")
    print("|---|---|---|---|---|---|")
    for run_dir in run_dirs:
        con = duckdb.connect(f"{run_dir}/sentinel.duckdb", read_only=True)
        rounds = [json.loads(m) for (m,) in con.execute(
            "SELECT metrics FROM rounds WHERE round > 0 ORDER BY round").fetchall()]
        groups, flat = con.execute(FLAT).fetchone()
        kl, grad, halved, inert = (statistics.mean(m[key] for m in rounds) for key in
                                   ("guard/kl", "grad_norm", "guard/halved", "n_inert"))
        print(f"| {run_dir} | {kl:.4f} | {grad:.2f} | {halved:.2f} | {inert:.0f} "
              f"| {flat}/{groups} |")


if __name__ == "__main__":
    main(sys.argv[1:])
