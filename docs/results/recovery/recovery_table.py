"""Per run and round: held-out recovery rate (mean over fault types, view `recovery_rates`),
clean success (held-out tasks without a fault), training success, and each fault type's rate.

Usage: python docs/results/recovery/recovery_table.py RUN_DIR_OR_PARENT...
"""

from __future__ import annotations

import glob
import os
import statistics
import sys

import duckdb


def summarize(path: str) -> list[str]:
    con = duckdb.connect(path)
    rates = con.execute("SELECT round, fault_type, recovery_rate FROM recovery_rates "
                        "WHERE split = 'eval' ORDER BY round").fetchall()
    clean = dict(con.execute(
        "SELECT e.round, sum(e.successes) / sum(e.k) FROM evals e JOIN tasks t USING (task_id) "
        "WHERE array_to_string(t.skills, ',') NOT LIKE '%recover:%' GROUP BY e.round").fetchall())
    train = dict(con.execute("SELECT round, avg(success::INT) FROM trajectories "
                             "WHERE split = 'train' GROUP BY round").fetchall())
    by_round: dict[int, dict[str, float]] = {}
    for r, fault, rate in rates:
        by_round.setdefault(r, {})[fault] = rate
    lines = []
    for r in sorted(by_round):
        mean = statistics.mean(by_round[r].values())
        t = train.get(r)
        types = " ".join(f"{k[:4]}={v:.2f}" for k, v in sorted(by_round[r].items()))
        lines.append(f"r{r}: rec {mean:.3f} clean {clean.get(r, float('nan')):.3f} "
                     f"train {'-' if t is None else f'{t:.3f}'} [{types}]")
    return lines


if __name__ == "__main__":
    for root in sys.argv[1:]:
        stores = sorted(glob.glob(os.path.join(root, "*/sentinel.duckdb"))) or [
            os.path.join(root, "sentinel.duckdb")]
        for path in stores:
            print(os.path.basename(os.path.dirname(path)))
            try:
                for line in summarize(path):
                    print("  " + line)
            except duckdb.Error as exc:
                print("  ERR", exc)
