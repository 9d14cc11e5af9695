"""The recovery bench by fault type: for each arm, the held-out recovery rate of every fault type
and clean-task success at round 0 and at the last round, mean over the arm's seeds (the view
`recovery_rates` of each run's store), with the paired difference last - round 0 and its
bootstrap 95 % CI over seeds.

Usage: python docs/results/recovery/bench_by_type.py runs/bench-recovery [RUN_DIR ...]

Each argument is a bench directory (its `<arm>-s<seed>` runs are read) or one run directory named
`<arm>-s<seed>` (e.g. runs/guided-s0, a probe run beside the bench), so extra arms pair by seed.
"""

from __future__ import annotations

import json
import random
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import duckdb

from sentinel.env.faults import FAULT_TYPES


def rates(db: Path) -> dict[int, dict[str, float]]:
    con = duckdb.connect(str(db), read_only=True)
    out: dict[int, dict[str, float]] = defaultdict(dict)
    for r, fault, rate in con.execute("SELECT round, fault_type, recovery_rate FROM "
                                      "recovery_rates WHERE split = 'eval'").fetchall():
        out[r][fault] = rate
    for r, clean in con.execute(
            "SELECT e.round, sum(e.successes) / sum(e.k) FROM evals e JOIN tasks t USING "
            "(task_id) WHERE array_to_string(t.skills, ',') NOT LIKE '%recover:%' "
            "GROUP BY e.round").fetchall():
        out[r]["clean"] = float(clean)
    con.close()
    return out


def ci(xs: list[float], n: int = 10000) -> tuple[float, float]:
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(xs, k=len(xs))) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


RUN = re.compile(r"^(?P<arm>[a-z_]+)-s(?P<seed>\d+)$")


def main(dirs: list[Path]) -> None:
    found: dict[str, dict[int, Path]] = defaultdict(dict)
    for d in dirs:
        for run in ([d] if (d / "sentinel.duckdb").exists() else sorted(d.iterdir())):
            m = RUN.match(run.name)
            if m and (run / "sentinel.duckdb").exists():
                found[m["arm"]][int(m["seed"])] = run / "sentinel.duckdb"
    runs = {arm: [rates(by_seed[s]) for s in sorted(by_seed)] for arm, by_seed in found.items()}
    seeds = {arm: sorted(by_seed) for arm, by_seed in found.items()}
    seen = {f for per_seed in runs.values() for rounds in per_seed for r in rounds.values()
            for f in r if f != "clean"}
    keys = [t for t in FAULT_TYPES if t in seen] + ["mean", "clean"]
    print("| arm | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for arm, per_seed in runs.items():
        cells = []
        for k in keys:
            first, last = [], []
            for rounds in per_seed:
                lo, hi = rounds[min(rounds)], rounds[max(rounds)]
                if k == "mean":
                    faults = [f for f in lo if f != "clean"]
                    first.append(statistics.fmean(lo[f] for f in faults))
                    last.append(statistics.fmean(hi[f] for f in faults))
                else:
                    first.append(lo.get(k, float("nan")))
                    last.append(hi.get(k, float("nan")))
            diff = [b - a for a, b in zip(first, last, strict=True)]
            d_lo, d_hi = ci(diff)
            cells.append(f"{statistics.fmean(first):.3f} → {statistics.fmean(last):.3f} "
                         f"({statistics.fmean(diff):+.3f} [{d_lo:+.3f}, {d_hi:+.3f}])")
        print(f"| {arm} (n={len(per_seed)}) | " + " | ".join(cells) + " |")
    # Paired over seeds: the failure arm's last-round mean recovery minus each other arm's.
    final = {arm: [statistics.fmean(v for k, v in rounds[max(rounds)].items() if k != "clean")
                   for rounds in per_seed] for arm, per_seed in runs.items()}
    for arm in runs:
        if arm == "failure" or "failure" not in runs:
            continue
        common = [s for s in seeds[arm] if s in seeds["failure"]]
        diff = [final["failure"][seeds["failure"].index(s)] - final[arm][seeds[arm].index(s)]
                for s in common]
        lo, hi = ci(diff)
        print(f"last-round mean recovery, failure - {arm}: {statistics.fmean(diff):+.3f} "
              f"[{lo:+.3f}, {hi:+.3f}] (paired over {len(diff)} seeds)")
    # Paired over seeds from the bench's results.json: area under the recovery curve.
    for d in dirs:
        if (d / "results.json").exists():
            arms = json.loads((d / "results.json").read_text())["arms"]
            fa = dict(zip(arms["failure"]["seeds"], arms["failure"]["area"], strict=True))
            for arm, a in arms.items():
                if arm == "failure":
                    continue
                diff = [fa[s] - v for s, v in zip(a["seeds"], a["area"], strict=True) if s in fa]
                lo, hi = ci(diff)
                print(f"area (mean recovery over the budget), failure - {arm}: "
                      f"{statistics.fmean(diff):+.3f} [{lo:+.3f}, {hi:+.3f}] "
                      f"(paired over {len(diff)} seeds)")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or [Path("runs/bench-recovery")])
