"""`sentinel bench curriculum`: the failure-driven curriculum against uniform sampling and online
difficulty filtering, at equal rollout budget, from one shared cold start.

A learning benchmark (held-out success per rollout spent), part of the CLI; the scripts in
`benchmarks/` are something else: speed and memory measurements of single components, run by
hand, that print ratios.

Protocol (docs/results.md has the figures):

1. One SFT cold start (`OUT/cold-start`, the config's `sft` section, seed `config.seed`) gives the
   starting policy of every run; its round-0 held-out eval ranks the skills by difficulty.
2. For each seed and arm, `sentinel loop` runs from that policy (`sft.enabled: false`) in its own
   process (`OUT/<arm>-s<seed>`), `bench.parallel` at a time with `bench.threads` torch threads
   each. Arms differ only in what they train on:
   - `failure`: the config as written: analyzer, generators, curriculum (mined / replay / base);
   - `uniform`: base-distribution draws only: no generators, no mined or replayed tasks, no
     mastery skipping, no zero-variance filter;
   - `filter`: base-distribution draws with online difficulty filtering: groups whose pass rate is
     0 or 1 are dropped before the update (DAPO dynamic sampling, judged on verified success,
     `curriculum.zero_variance_on: success`) and tasks already solved every time are not drawn
     again;
   - `exposure` (fault benches): `uniform`, but the base distribution carries scheduled faults at
     the share of fault tasks the `failure` run of the same seed ended up training on (measured
     from its store; `bench.exposure_share` fixes it instead), fault types drawn uniformly from
     the families' `fault_types`: the control that separates *mining* from mere *exposure*.
     An exposure run starts as soon as the failure run of its seed has finished (it waits for
     nothing else), ahead of the other arms' pending runs: it is the slowest.
   Every arm runs the same rounds, steps, tasks per step and group size, so the same number of
   training rollouts; the `failure` arm's difficulty-probe rollouts are added to its count (they
   are rollouts it spent), so its curve is charged for them.
3. The held-out set is the config's `eval` section, the same fixed seeded tasks for every run
   (configs/bench_arith.yaml adds a harder tail: more operands, larger numbers;
   configs/bench_recovery.yaml holds 40 tasks per fault type plus clean tasks, as does
   configs/bench_recovery_tail.yaml for its eight types).
4. The metric (`bench.metric`, fixed in the config before the runs): `success` (held-out success)
   or `recovery` (the held-out recovery rate: success on the tasks of each fault type, `recover:T`
   skills, averaged over the types). Clean-task success is reported beside it as the
   no-regression check. Per arm: rollouts to `bench.target` and the area under the metric-vs-
   rollouts curve (trapezoids, divided by the budget: the mean metric over the budget), each
   with its mean and a 95 % bootstrap CI over seeds; the ratio of rollouts-to-target of each
   other arm to `failure` with a paired bootstrap CI (seeds resampled together).

Outputs in OUT: `results.json` (every curve and figure), `results.md` (the table), `curves.png`
(held-out success against rollouts, mean and min-max band over seeds per arm). The last line
printed is `rollouts-to-target ratio: uniform/failure N.NN [lo, hi], exposure/failure ...,
filter/failure ...` (bracketed: the paired bootstrap 95 % CI); a run that
never reaches the target counts with its whole budget there (a lower bound, marked `>`; `<` when
only the failure arm fell short, `~` when both partly did, `n/a` when neither arm ever reached
it).

Runs already complete in OUT are reused and a run that died is resumed, so an interrupted bench
continues where it stopped; a run in OUT made with another loop config (a changed `sft` section,
seed, recipe) is an error naming the keys, never silently reused. The cold start is compared
without the sections it never reads (`COLD_START_UNUSED`: batch, curriculum, generation,
generators, grpo), so a bench that changes only how its arms train reuses it. `bench.*` keys
(target, parallel, ...) are not part of a run's config: a finished bench can be re-summarised
with another target. Each run directory keeps the torch threads it ran on in `bench-threads`, and
`results.json` the cold start's (`cold_start_threads`): CPU training results depend on the
thread count, so a cold start remade on other threads is another cold start.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from sentinel.config import Section, SentinelConfig, drop_removed, load_config

ARMS = ("failure", "uniform", "filter", "exposure")
Arm = Literal["failure", "uniform", "filter", "exposure"]
Metric = Literal["success", "recovery"]
BOOTSTRAP = 2000  # resamples of the seeds for every CI


class BenchSection(Section):
    arms: list[Arm] = Field(default_factory=lambda: ["failure", "uniform", "filter"],
                            description="arms to run (exposure: fault benches only)")
    target: float = Field(0.5, gt=0, le=1, description="held-out success to reach")
    hardest_skills: int = Field(4, ge=1, description="skills reported per arm (lowest at start)")
    min_skill_tasks: int = Field(8, ge=1, description="held-out tasks a reported skill needs")
    parallel: int = Field(2, ge=1, description="runs at once (processes)")
    threads: int = Field(1, ge=1, description="torch threads per run")
    metric: Metric = Field("success", description="what target and area are measured on: "
                           "held-out success, or the held-out recovery rate (mean over fault "
                           "types)")
    exposure_share: float | None = Field(None, ge=0.0, le=1.0, description="exposure arm: share "
                                         "of base tasks carrying a fault (null: the share the "
                                         "failure run of the same seed trained on)")
    failure_fault_share: float | None = Field(None, ge=0.0, le=1.0, description="failure arm: "
                                              "share of its base tasks carrying a fault (null: "
                                              "the families' own; the cold start keeps them)")


class BenchConfig(SentinelConfig):
    bench: BenchSection = Field(default_factory=BenchSection,
                                description="options only `sentinel bench` reads")

    def run_config(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"bench"})


class BenchError(RuntimeError):
    pass


def load_bench_config(path: str | Path | None, overrides: list[str] | None = None) -> BenchConfig:
    """`sentinel.config.load_config` of a bench config (a loop config plus `bench:`)."""
    return load_config(path, overrides, model=BenchConfig)


def _set_fault_share(data: dict[str, Any], arm: str, share: float) -> None:
    for entry in data["families"]:
        if not entry.get("fault_types"):
            raise BenchError(f"{arm} arm: family {entry['type']!r} has no fault_types to draw "
                             "from")
        entry["fault_share"] = share


def arm_config(config: BenchConfig, arm: str, seed: int, policy: Path,
               exposure_share: float | None = None) -> dict[str, Any]:
    """The loop config of one run: the bench config with the arm's sampling and the shared start.
    `exposure_share`: the `exposure` arm's share of fault tasks in its base distribution; the
    `failure` arm's is `bench.failure_fault_share` when set (a floor of every fault type under
    the mined share, for the arm alone: the cold start and the other arms keep the families')."""
    data = config.run_config()
    data["seed"] = seed
    data["policy"]["model"] = str(policy.resolve())
    data["sft"]["enabled"] = False
    cur = data["curriculum"]
    if arm == "exposure":
        if exposure_share is None:
            raise BenchError("the exposure arm needs its fault share (bench.exposure_share or "
                             "the failure run's)")
        _set_fault_share(data, arm, exposure_share)
    if arm == "failure" and config.bench.failure_fault_share is not None:
        _set_fault_share(data, arm, config.bench.failure_fault_share)
    if arm in ("uniform", "exposure"):
        data["generators"] = []
        cur.update(mined_fraction=0.0, replay_fraction=0.0, drop_zero_variance=False,
                   mastery_threshold=1.0, mastery_min_samples=10**9)
    elif arm == "filter":
        data["generators"] = []
        cur.update(mined_fraction=0.0, replay_fraction=0.0, drop_zero_variance=True,
                   zero_variance_on="success", mastery_threshold=1.0,
                   mastery_min_samples=data["batch"]["group_size"])
    elif arm != "failure":
        raise BenchError(f"unknown arm {arm!r}; expected one of {ARMS}")
    return data


# -- running --------------------------------------------------------------------------------------

def _completed(run_dir: Path) -> list[int]:
    from task_store import Store

    path = run_dir / "sentinel.duckdb"
    if not path.exists():
        return []
    try:
        return Store(path).completed_rounds()
    except Exception:  # an unreadable or half-created store: the run starts over
        return []


# Sections a cold start (`rounds: 0`: SFT and the round-0 eval) never reads: a bench that changes
# only how its arms train reuses the cold start it kept.
COLD_START_UNUSED = ("batch", "curriculum", "generation", "generators", "grpo")


def config_diff(old: Any, new: Any, path: str = "", ignore: tuple[str, ...] = ()) -> list[str]:
    """The dotted keys where two loop configs differ, top-level sections in `ignore` left out
    (`policy.model` is ignored when both point at a `cold-start/policy`: the same shared start,
    wherever OUT now lies). Lists of equal length are compared item by item (`families.0.x`), so
    a key that one side lacks and the other holds as null (a key added later, default off) is no
    difference there either.

    >>> config_diff({"sft": {"steps": 600}, "seed": 0}, {"sft": {"steps": 400}, "seed": 0})
    ['sft.steps']
    """
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted((set(old) | set(new)) - set(ignore), key=str)
        return [d for k in keys
                for d in config_diff(old.get(k), new.get(k), f"{path}.{k}" if path else str(k))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True))
                for d in config_diff(a, b, f"{path}.{i}" if path else str(i))]
    if path == "policy.model" and all(str(v).replace("\\", "/").endswith("cold-start/policy")
                                      for v in (old, new)):
        return []
    return [] if old == new else [path or "(root)"]


def kept_config(path: Path) -> Any:
    """The loop config a kept run was made with (its `bench-config.yaml`), without the keys
    removed since then that it holds at their off values (`sentinel.config.drop_removed`): such a
    run is the run the bench would make now. A removed key that was on stays, and differs."""
    return drop_removed(yaml.safe_load(path.read_text()), strict=False)[0]


def _launch(config: dict[str, Any], run_dir: Path, rounds: int, threads: int,
            ignore: tuple[str, ...] = ()) -> float:
    """Run (or resume, or skip) one `sentinel loop`; returns its wall seconds. A run found in
    `run_dir` is reused or resumed only if it was made with the same loop config: otherwise
    `BenchError` names the keys that differ (a bench re-invoked with a changed config must not mix
    runs of two configs, nor train its arms from a stale cold start). The torch threads of each
    launch are appended to `bench-threads` (CPU results depend on them). `ignore`: top-level
    sections the run does not read (the cold start's `COLD_START_UNUSED`)."""
    done = _completed(run_dir)
    cfg_path = run_dir / "bench-config.yaml"
    if done and cfg_path.exists():
        diff = config_diff(kept_config(cfg_path),
                           yaml.safe_load(yaml.safe_dump(config, sort_keys=False)), ignore=ignore)
        if diff:
            raise BenchError(f"{run_dir} holds a run made with another config (differs in "
                             f"{', '.join(diff)}): use another --out, or remove {run_dir} "
                             "(a changed cold start invalidates every arm run too)")
    if done and done[-1] >= rounds:
        return 0.0
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
    with open(run_dir / "bench-threads", "a") as f:
        f.write(f"{threads}\n")
    cmd = [sys.executable, "-m", "sentinel.cli", "loop", "--config", str(cfg_path),
           "--run-dir", str(run_dir)]
    if done:
        cmd.append("--resume")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    started = time.time()
    with open(run_dir / "bench.log", "a") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        tail = (run_dir / "bench.log").read_text()[-2000:]
        raise BenchError(f"run {run_dir} failed (exit {rc}); end of {run_dir / 'bench.log'}:\n"
                         f"{tail}")
    return time.time() - started


def _threads(run_dir: Path) -> int | None:
    """The torch threads `run_dir`'s run was (last) launched with; None if not recorded."""
    path = run_dir / "bench-threads"
    lines = path.read_text().split() if path.exists() else []
    return int(lines[-1]) if lines else None


@dataclass
class RunResult:
    arm: str
    seed: int
    rollouts: list[float] = field(default_factory=list)  # cumulative, after each round
    success: list[float] = field(default_factory=list)  # held-out success after each round
    skills: dict[str, float] = field(default_factory=dict)  # final held-out success per skill
    seconds: float = 0.0
    recovery: list[float] = field(default_factory=list)  # held-out recovery rate, mean over types
    clean: list[float] = field(default_factory=list)  # held-out success on fault-free tasks
    fault_share: float = 0.0  # share of its training rollouts on tasks carrying a fault

    def curve(self, metric: str) -> list[float]:
        return self.recovery if metric == "recovery" else self.success


# Held-out success per round and fault type (`recover:T`; NULL: the fault-free tasks).
_BY_FAULT = """
SELECT e.round, list_filter(t.skills, lambda s: s LIKE 'recover:%')[1] AS fault,
       sum(e.successes)::DOUBLE / sum(e.k) AS rate
FROM evals e JOIN tasks t USING (task_id) GROUP BY ALL"""
_TRAIN_FAULT_SHARE = """
SELECT coalesce(avg((len(list_filter(t.skills, lambda s: s LIKE 'recover:%')) > 0)::INT), 0)
FROM trajectories tr JOIN tasks t USING (task_id) WHERE tr.split = 'train'"""


def read_run(run_dir: Path, arm: str, seed: int) -> RunResult:
    from task_store import Store

    store = Store(run_dir / "sentinel.duckdb")
    _, rows = store.query(
        "SELECT round, n_train_rollouts, heldout_success, "
        "coalesce(TRY_CAST(metrics->>'probe_rollouts' AS DOUBLE), 0) FROM rounds ORDER BY round")
    by_fault: dict[int, dict[str | None, float]] = {}
    for r, fault, rate in store.query(_BY_FAULT)[1]:
        by_fault.setdefault(r, {})[fault] = float(rate)
    result = RunResult(arm, seed)
    total = 0.0
    for r, n_train, success, probe in rows:
        total += (n_train or 0) + probe
        result.rollouts.append(total)
        result.success.append(float(success))
        rates = by_fault.get(r, {})
        faults = [v for k, v in rates.items() if k is not None]
        result.recovery.append(statistics.fmean(faults) if faults else math.nan)
        result.clean.append(rates.get(None, math.nan))
    result.skills = skill_success(store, rows[-1][0])
    result.fault_share = float(store.query(_TRAIN_FAULT_SHARE)[1][0][0])
    return result


def skill_success(store: Any, round: int, min_tasks: int = 1) -> dict[str, float]:
    _, rows = store.query(
        "SELECT skill, sum(successes)::DOUBLE / sum(k), count(*) FROM "
        "(SELECT unnest(t.skills) AS skill, e.successes, e.k FROM evals e "
        " JOIN tasks t USING (task_id) WHERE e.round = ?) GROUP BY skill", [round])
    return {skill: rate for skill, rate, n in rows if n >= min_tasks}


# -- figures --------------------------------------------------------------------------------------

def rollouts_to_target(rollouts: list[float], success: list[float], target: float) -> float | None:
    """Rollouts at which the held-out curve first reaches `target`, interpolated linearly between
    the two evaluations around the crossing; None if it never does.

    >>> rollouts_to_target([0, 100, 200], [0.3, 0.4, 0.6], 0.5)
    150.0
    >>> rollouts_to_target([0, 100], [0.3, 0.4], 0.5) is None
    True
    """
    for i, (x, y) in enumerate(zip(rollouts, success, strict=True)):
        if y >= target:
            if i == 0:
                return float(x)
            x0, y0 = rollouts[i - 1], success[i - 1]
            return float(x0 + (x - x0) * (target - y0) / (y - y0))
    return None


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def area_under(rollouts: list[float], values: list[float]) -> float:
    """Area under the metric-vs-rollouts curve (trapezoids), divided by the rollouts spent: the
    mean metric over the budget.

    >>> area_under([0, 100, 200], [0.2, 0.4, 0.4])
    0.35
    """
    if len(rollouts) < 2 or rollouts[-1] <= rollouts[0]:
        return float(values[-1]) if values else math.nan
    area = sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in
               zip(rollouts, rollouts[1:], values, values[1:], strict=False))
    return round(area / (rollouts[-1] - rollouts[0]), 12)


def bootstrap_ci(values: list[float], stat: Any = statistics.fmean, n: int = BOOTSTRAP,
                 seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap CI of `stat` over `values` (the seeds), resampled with a fixed
    seed; (nan, nan) for no values."""
    if not values:
        return math.nan, math.nan
    rng = random.Random(seed)
    stats = sorted(stat([rng.choice(values) for _ in values]) for _ in range(n))
    return stats[int(0.025 * n)], stats[min(n - 1, int(0.975 * n))]


def paired_ratio_ci(other: list[float], base: list[float], n: int = BOOTSTRAP,
                    seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap CI of mean(other) / mean(base), the seeds resampled together (pairs)."""
    pairs = list(zip(other, base, strict=True))
    if not pairs:
        return math.nan, math.nan
    rng = random.Random(seed)
    ratios = []
    for _ in range(n):
        sample = [rng.choice(pairs) for _ in pairs]
        ratios.append(statistics.fmean(o for o, _ in sample)
                      / max(statistics.fmean(b for _, b in sample), 1e-9))
    ratios.sort()
    return ratios[int(0.025 * n)], ratios[min(n - 1, int(0.975 * n))]


def summarize(results: list[RunResult], target: float, hardest: list[str],
              metric: str = "success") -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for arm in dict.fromkeys(r.arm for r in results):
        runs = sorted((r for r in results if r.arm == arm), key=lambda r: r.seed)
        reached = [rollouts_to_target(r.rollouts, r.curve(metric), target) for r in runs]
        # A run that never reached the target counts with its whole budget (a lower bound).
        bounded = [x if x is not None else r.rollouts[-1] for x, r in zip(reached, runs,
                                                                           strict=True)]
        areas = [area_under(r.rollouts, r.curve(metric)) for r in runs]
        finals = [r.curve(metric)[-1] for r in runs]
        arms[arm] = {
            "seeds": [r.seed for r in runs],
            "rollouts_to_target": reached,
            "rollouts_to_target_bounded": bounded,
            "rollouts_to_target_mean": _mean_sd(bounded)[0],
            "rollouts_to_target_sd": _mean_sd(bounded)[1],
            "rollouts_to_target_ci": bootstrap_ci(bounded),
            "reached": sum(x is not None for x in reached),
            "area": areas,
            "area_mean": _mean_sd(areas)[0],
            "area_ci": bootstrap_ci(areas),
            "final_mean": _mean_sd(finals)[0],
            "final_ci": bootstrap_ci(finals),
            "final_success_mean": _mean_sd([r.success[-1] for r in runs])[0],
            "final_success_sd": _mean_sd([r.success[-1] for r in runs])[1],
            "final_clean_mean": _mean_sd([r.clean[-1] for r in runs if r.clean])[0],
            "start_clean_mean": _mean_sd([r.clean[0] for r in runs if r.clean])[0],
            "fault_share": [r.fault_share for r in runs],
            "budget": statistics.fmean(r.rollouts[-1] for r in runs),
            "skills": {s: _mean_sd([r.skills[s] for r in runs if s in r.skills])
                       for s in hardest},
            "curves": [{"seed": r.seed, "rollouts": r.rollouts, "success": r.success,
                        "recovery": r.recovery, "clean": r.clean} for r in runs],
        }
    if "failure" in arms:
        base = arms["failure"]
        for arm, a in arms.items():
            if arm != "failure" and a["seeds"] == base["seeds"]:
                a["ratio_ci"] = paired_ratio_ci(a["rollouts_to_target_bounded"],
                                                base["rollouts_to_target_bounded"])
    return {"target": target, "metric": metric, "hardest_skills": hardest, "arms": arms}


def ratio_line(summary: dict[str, Any]) -> str:
    arms = summary["arms"]
    if "failure" not in arms:
        return "rollouts-to-target ratio: n/a (no failure arm)"
    base = arms["failure"]
    parts = []
    for other in ("uniform", "exposure", "filter"):
        if other not in arms:
            continue
        a = arms[other]
        if a["reached"] == 0 and base["reached"] == 0:
            parts.append(f"{other}/failure n/a")  # neither reached the target: no ratio
            continue
        ratio = a["rollouts_to_target_mean"] / max(base["rollouts_to_target_mean"], 1e-9)
        # Unreached runs make the other arm's mean a lower bound (ratio >), the failure arm's an
        # upper bound... both at once leave it undetermined.
        flag = ""
        if a["reached"] < len(a["seeds"]) and base["reached"] == len(base["seeds"]):
            flag = ">"
        elif base["reached"] < len(base["seeds"]) and a["reached"] == len(a["seeds"]):
            flag = "<"
        elif base["reached"] < len(base["seeds"]):
            flag = "~"
        ci = a.get("ratio_ci")
        interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        parts.append(f"{other}/failure {flag}{ratio:.2f}{interval}")
    return "rollouts-to-target ratio: " + ", ".join(parts)


def _metric_name(metric: str) -> str:
    return "held-out recovery" if metric == "recovery" else "held-out success"


def markdown_table(summary: dict[str, Any]) -> str:
    hardest = summary["hardest_skills"]
    metric = summary.get("metric", "success")
    name = _metric_name(metric)
    head = (["arm", f"rollouts to {summary['target']:g} {name} (reached)",
             f"area (mean {name} over the budget)", f"final {name}", "final held-out success",
             "clean success (start → final)"]
            + [f"`{s}`" for s in hardest])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, a in summary["arms"].items():
        lo, hi = a["rollouts_to_target_ci"]
        rtt = f"{a['rollouts_to_target_mean']:.0f} [{lo:.0f}, {hi:.0f}]"
        if a["reached"] < len(a["seeds"]):
            rtt = f"≥ {rtt}"
        cells = [arm, f"{rtt} ({a['reached']}/{len(a['seeds'])})",
                 f"{a['area_mean']:.3f} [{a['area_ci'][0]:.3f}, {a['area_ci'][1]:.3f}]",
                 f"{a['final_mean']:.3f} [{a['final_ci'][0]:.3f}, {a['final_ci'][1]:.3f}]",
                 f"{a['final_success_mean']:.3f} ± {a['final_success_sd']:.3f}",
                 f"{a['start_clean_mean']:.3f} → {a['final_clean_mean']:.3f}"]
        cells += [f"{a['skills'][s][0]:.3f} ± {a['skills'][s][1]:.3f}" for s in hardest]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib
    except ImportError as exc:
        raise BenchError("plots need matplotlib: pip install 'sentinel-rl[bench]'") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for arm, a in summary["arms"].items():
        curves = a["curves"]
        grid = np.unique(np.concatenate([c["rollouts"] for c in curves]))
        key = summary.get("metric", "success")
        ys = np.stack([np.interp(grid, c["rollouts"], c[key]) for c in curves])
        line, = ax.plot(grid, ys.mean(0), marker="o", ms=3, label=f"{arm} (n={len(curves)})")
        ax.fill_between(grid, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.18)
    ax.axhline(summary["target"], ls="--", color="grey", lw=1, label="target")
    ax.set_xlabel("rollouts (training + difficulty probes)")
    label = ("held-out recovery rate" if summary.get("metric") == "recovery"
             else "held-out success")
    ax.set_ylabel(label)
    ax.set_title(f"{label} against rollouts (mean, min-max over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- driver ---------------------------------------------------------------------------------------

Job = tuple[str, int]


def next_job(pending: list[Job], done: set[Job], needs_share: bool = True) -> Job | None:
    """The job to start next: an exposure run whose seed's failure run has finished (the slowest
    runs, started as soon as they can be), else the first pending run of another arm. With
    `needs_share`, `exposure-sN` never starts before `failure-sN` is done (it copies that run's
    fault share). None when every pending run still waits."""
    for job in pending:
        if job[0] == "exposure" and (not needs_share or ("failure", job[1]) in done):
            return job
    for job in pending:
        if job[0] != "exposure":
            return job
    return None


def run_jobs(jobs: list[Job], parallel: int, fn: Callable[[Job], float],
             needs_share: bool = True) -> dict[Job, float]:
    """Run `fn(job)` for every job, `parallel` at a time, in the order `next_job` gives; returns
    each job's result. The first failure is raised once the runs already started have ended."""
    pending, done, results = list(jobs), set(), {}
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        running: dict[Future[float], Job] = {}
        while pending or running:
            while len(running) < parallel:
                job = next_job(pending, done, needs_share)
                if job is None:
                    break
                pending.remove(job)
                running[pool.submit(fn, job)] = job
            if not running:
                raise BenchError(f"runs wait on runs that never start: {pending}")
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                job = running.pop(fut)
                results[job] = fut.result()
                done.add(job)
    return results


def run_curriculum_bench(config: BenchConfig, seeds: int, out: Path, *, command: str = "",
                         console: Any = None) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from task_store import Store

    console = console or Console()
    out.mkdir(parents=True, exist_ok=True)
    b = config.bench
    started = time.time()
    cold = out / "cold-start"
    cold_cfg = config.run_config()
    cold_cfg["rounds"] = 0
    if "exposure" in b.arms and b.exposure_share is None and "failure" not in b.arms:
        raise BenchError("the exposure arm copies the failure arm's fault share: add the "
                         "failure arm or set bench.exposure_share")
    # Each exposure run copies the fault share its seed's failure run trained on, so it waits
    # for that run alone (not for every other arm): see `next_job`.
    runs = [(arm, seed) for seed in range(seeds) for arm in b.arms]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task("cold start (SFT)", total=1 + len(runs))
        # Alone: all the threads.
        _launch(cold_cfg, cold, 0, b.threads * b.parallel, ignore=COLD_START_UNUSED)
        progress.update(bar, advance=1, description="arms x seeds")
        policy = cold / "policy"

        def one(job: tuple[str, int]) -> float:
            arm, seed = job
            share = None
            if arm == "exposure":
                share = b.exposure_share
                if share is None:
                    share = read_run(out / f"failure-s{seed}", "failure", seed).fault_share
            secs = _launch(arm_config(config, arm, seed, policy, share), out / f"{arm}-s{seed}",
                           config.rounds, b.threads)
            progress.update(bar, advance=1)
            return secs

        timings = run_jobs(runs, b.parallel, one, needs_share=b.exposure_share is None)
    results = []
    for arm, seed in runs:
        r = read_run(out / f"{arm}-s{seed}", arm, seed)
        r.seconds = timings[(arm, seed)]
        results.append(r)
    start_skills = skill_success(Store(cold / "sentinel.duckdb"), 0, b.min_skill_tasks)
    hardest = sorted(start_skills, key=lambda s: (start_skills[s], s))[: b.hardest_skills]
    summary = summarize(results, b.target, hardest, b.metric)
    summary["start_success"] = results[0].success[0] if results else None
    summary["start_skills"] = {s: start_skills[s] for s in hardest}
    summary["seconds"] = time.time() - started
    summary["command"] = command
    summary["run_seconds"] = {f"{r.arm}-s{r.seed}": r.seconds for r in results}
    summary["cold_start_threads"] = _threads(cold)
    (out / "results.json").write_text(json.dumps(summary, indent=2))
    plot(summary, out / "curves.png")
    table = markdown_table(summary)
    line = ratio_line(summary)
    (out / "results.md").write_text(
        f"# Curriculum bench\n\n`{command}`\n\nTarget {_metric_name(b.metric)} {b.target:g}; "
        f"{seeds} seed(s); this invocation {summary['seconds'] / 60:.1f} min (runs found "
        f"finished in {out} were reused, not rerun); cold start made on "
        f"{summary['cold_start_threads'] or 'unrecorded'} torch thread(s).\n\n{table}\n\n"
        f"![held-out success against rollouts](curves.png)\n\n{line}\n")
    console.print(table)
    console.print(line)
    return summary
