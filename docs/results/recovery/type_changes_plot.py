"""Plot the change of held-out recovery by fault type, round 0 -> last round, mean over seeds
with bootstrap 95 % CIs, for several arms side by side (the eighth run's figure,
docs/results.md): which remedies an arm teaches and which it unlearns.

Usage: python docs/results/recovery/type_changes_plot.py OUT.png NAME=RUN_DIR[,RUN_DIR...] ...
       (each NAME is one arm; its run directories are its seeds)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from bench_by_type import ci, rates

from sentinel.env.faults import FAULT_TYPES


def changes(run_dirs: list[str]) -> dict[str, list[float]]:
    """{fault type or 'mean': [last - first per seed]}."""
    out: dict[str, list[float]] = {}
    for run_dir in run_dirs:
        rounds = rates(Path(run_dir) / "sentinel.duckdb")
        lo, hi = rounds[min(rounds)], rounds[max(rounds)]
        faults = [f for f in lo if f != "clean"]
        for f in faults:
            out.setdefault(f, []).append(hi[f] - lo[f])
        out.setdefault("mean", []).append(statistics.fmean(hi[f] - lo[f] for f in faults))
    return out


def main(out: str, arms: list[str]) -> None:
    data = {name: changes(dirs.split(",")) for name, dirs in (a.split("=", 1) for a in arms)}
    seen = {k for d in data.values() for k in d}
    keys = [t for t in FAULT_TYPES if t in seen] + ["mean"]
    width = 0.8 / len(data)
    fig, ax = plt.subplots(figsize=(11, 4.2))
    for i, (name, d) in enumerate(data.items()):
        xs = [k + (i - (len(data) - 1) / 2) * width for k in range(len(keys))]
        means = [statistics.fmean(d[k]) for k in keys]
        cis = [ci(d[k]) for k in keys]
        err = [[m - lo for m, (lo, _) in zip(means, cis, strict=True)],
               [hi - m for m, (_, hi) in zip(means, cis, strict=True)]]
        ax.bar(xs, means, width, yerr=err, capsize=2, label=f"{name} (n={len(d['mean'])})")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(keys)), keys)
    ax.set_ylabel("held-out recovery, last round - round 0")
    ax.set_title("Which remedies each arm teaches and unlearns "
                 "(tail bench, 5 paired seeds, 95 % CI)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
