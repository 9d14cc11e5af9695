"""Pair new failure-arm runs with the arms of an earlier recovery bench, seed by seed.

A variant of the failure arm (one config key changed) is run with `bench.arms: [failure]` into
its own directory, from the same cold start as an earlier bench (it reproduces bit for bit at one
torch thread). The `uniform` and `filter` arms do not depend on the failure arm (no mined tasks;
`filter` sets its own gate), so their runs would repeat the earlier bench's exactly: they are
taken from its JSON (`sentinel bench` writes every curve there). `exposure` copies the failure
arm's fault share; an exposure run made for the variant (`--exposure DIR`) is used when given,
else the earlier bench's exposure curves, and the output says which.

Prints, for each variant: the ratio line of `sentinel bench` (same target), the final and area of
the metric, and the paired differences variant - X (last round, area) with bootstrap 95 % CIs,
X each arm of the earlier bench that ran (a bench of fewer arms is fine), its failure arm too.

Usage: python docs/results/recovery/pair_with_bench.py docs/results/recovery/bench-2026-12-06b.json
           NAME=RUN_DIR_OF_FAILURE_ARM_BENCH [NAME=DIR ...] [--exposure NAME=DIR]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from sentinel.bench import (
    RunResult,
    area_under,
    bootstrap_ci,
    ratio_line,
    read_run,
    summarize,
)


def from_json(summary: dict, arm: str) -> list[RunResult]:
    if arm not in summary["arms"]:
        return []  # a bench run with fewer arms
    a = summary["arms"][arm]
    out = []
    for curve, share in zip(a["curves"], a["fault_share"], strict=True):
        r = RunResult(arm, curve["seed"], rollouts=curve["rollouts"], success=curve["success"],
                      recovery=curve["recovery"], clean=curve["clean"], fault_share=share)
        out.append(r)
    return out


def runs_in(bench_dir: Path, arm: str) -> list[RunResult]:
    dirs = sorted(bench_dir.glob(f"{arm}-s*"), key=lambda p: int(p.name.rsplit("s", 1)[1]))
    return [read_run(d, arm, int(d.name.rsplit("s", 1)[1])) for d in dirs]


def fmt(ci: tuple[float, float]) -> str:
    return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def main(argv: list[str]) -> None:
    earlier = json.loads(Path(argv[0]).read_text())
    target, metric = earlier["target"], earlier["metric"]
    variants, exposure = {}, {}
    args = iter(argv[1:])
    for a in args:
        if a == "--exposure":
            name, d = next(args).split("=", 1)
            exposure[name] = Path(d)
        else:
            name, d = a.split("=", 1)
            variants[name] = Path(d)
    for name, d in variants.items():
        failure = runs_in(d, "failure")
        seeds = [r.seed for r in failure]
        others = {arm: [r for r in from_json(earlier, arm) if r.seed in seeds]
                  for arm in ("uniform", "exposure", "filter")}
        source = "the earlier bench's"
        if name in exposure:
            others["exposure"] = [r for r in runs_in(exposure[name], "exposure") if r.seed in seeds]
            source = f"{exposure[name]}'s"
        summary = summarize(failure + [r for rs in others.values() for r in rs], target, [],
                            metric)
        print(f"## {name} ({d}): failure arm vs {Path(argv[0]).name} "
              f"(exposure: {source} runs); target {metric} {target}")
        print(ratio_line(summary))
        for arm, a in summary["arms"].items():
            finals = ", ".join(f"{c[metric][-1]:.3f}" for c in a["curves"])
            print(f"  {arm:9s} final {a['final_mean']:.3f} [{a['final_ci'][0]:.3f}, "
                  f"{a['final_ci'][1]:.3f}] (per seed {finals}); area {a['area_mean']:.3f}; "
                  f"reached {a['reached']}/{len(a['seeds'])}; fault share "
                  f"{statistics.fmean(a['fault_share']):.3f}")
        base = {r.seed: r for r in failure}
        earlier_failure = [r for r in from_json(earlier, "failure") if r.seed in base]
        for arm, rs in [*others.items(), ("the earlier bench's failure arm", earlier_failure)]:
            pairs = [(base[r.seed], r) for r in rs]
            if not pairs:
                continue
            last = [f.curve(metric)[-1] - o.curve(metric)[-1] for f, o in pairs]
            area = [area_under(f.rollouts, f.curve(metric)) - area_under(o.rollouts,
                                                                         o.curve(metric))
                    for f, o in pairs]
            print(f"  failure - {arm:9s} last round {statistics.fmean(last):+.3f} "
                  f"{fmt(bootstrap_ci(last))}; area {statistics.fmean(area):+.3f} "
                  f"{fmt(bootstrap_ci(area))}")
        rise = [r.curve(metric)[-1] - r.curve(metric)[0] for r in failure]
        print(f"  failure round 0 -> last: {statistics.fmean(rise):+.3f} {fmt(bootstrap_ci(rise))}")


if __name__ == "__main__":
    main(sys.argv[1:])
