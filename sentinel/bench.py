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
     again.
   Every arm runs the same rounds, steps, tasks per step and group size, so the same number of
   training rollouts; the `failure` arm's difficulty-probe rollouts are added to its count (they
   are rollouts it spent), so its curve is charged for them.
3. The held-out set is the config's `eval` section, the same fixed seeded tasks for every run
   (configs/bench_arith.yaml adds a harder tail: more operands, larger numbers).

Outputs in OUT: `results.json` (every curve and figure), `results.md` (the table), `curves.png`
(held-out success against rollouts, mean and min-max band over seeds per arm). The last line
printed is `rollouts-to-target ratio: uniform/failure N.NN, filter/failure N.NN`; a run that
never reaches the target counts with its whole budget there (a lower bound, marked `>`; `<` when
only the failure arm fell short, `~` when both partly did, `n/a` when neither arm ever reached
it).

Runs already complete in OUT are reused and a run that died is resumed, so an interrupted bench
continues where it stopped.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from sentinel.config import Section, SentinelConfig, load_config

ARMS = ("failure", "uniform", "filter")
Arm = Literal["failure", "uniform", "filter"]


class BenchSection(Section):
    arms: list[Arm] = Field(default_factory=lambda: list(ARMS), description="arms to run")
    target: float = Field(0.5, gt=0, le=1, description="held-out success to reach")
    hardest_skills: int = Field(4, ge=1, description="skills reported per arm (lowest at start)")
    min_skill_tasks: int = Field(8, ge=1, description="held-out tasks a reported skill needs")
    parallel: int = Field(2, ge=1, description="runs at once (processes)")
    threads: int = Field(1, ge=1, description="torch threads per run")


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


def arm_config(config: BenchConfig, arm: str, seed: int, policy: Path) -> dict[str, Any]:
    """The loop config of one run: the bench config with the arm's sampling and the shared start."""
    data = config.run_config()
    data["seed"] = seed
    data["policy"]["model"] = str(policy.resolve())
    data["sft"]["enabled"] = False
    cur = data["curriculum"]
    if arm == "uniform":
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


def _launch(config: dict[str, Any], run_dir: Path, rounds: int, threads: int) -> float:
    """Run (or resume, or skip) one `sentinel loop`; returns its wall seconds."""
    done = _completed(run_dir)
    if done and done[-1] >= rounds:
        return 0.0
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "bench-config.yaml"
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
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


@dataclass
class RunResult:
    arm: str
    seed: int
    rollouts: list[float] = field(default_factory=list)  # cumulative, after each round
    success: list[float] = field(default_factory=list)  # held-out success after each round
    skills: dict[str, float] = field(default_factory=dict)  # final held-out success per skill
    seconds: float = 0.0


def read_run(run_dir: Path, arm: str, seed: int) -> RunResult:
    from task_store import Store

    store = Store(run_dir / "sentinel.duckdb")
    _, rows = store.query(
        "SELECT round, n_train_rollouts, heldout_success, "
        "coalesce(TRY_CAST(metrics->>'probe_rollouts' AS DOUBLE), 0) FROM rounds ORDER BY round")
    result = RunResult(arm, seed)
    total = 0.0
    for _, n_train, success, probe in rows:
        total += (n_train or 0) + probe
        result.rollouts.append(total)
        result.success.append(float(success))
    result.skills = skill_success(store, rows[-1][0])
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


def summarize(results: list[RunResult], target: float, hardest: list[str]) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for arm in dict.fromkeys(r.arm for r in results):
        runs = [r for r in results if r.arm == arm]
        reached = [rollouts_to_target(r.rollouts, r.success, target) for r in runs]
        # A run that never reached the target counts with its whole budget (a lower bound).
        bounded = [x if x is not None else r.rollouts[-1] for x, r in zip(reached, runs,
                                                                           strict=True)]
        arms[arm] = {
            "seeds": [r.seed for r in runs],
            "rollouts_to_target": reached,
            "rollouts_to_target_mean": _mean_sd(bounded)[0],
            "rollouts_to_target_sd": _mean_sd(bounded)[1],
            "reached": sum(x is not None for x in reached),
            "final_success_mean": _mean_sd([r.success[-1] for r in runs])[0],
            "final_success_sd": _mean_sd([r.success[-1] for r in runs])[1],
            "budget": statistics.fmean(r.rollouts[-1] for r in runs),
            "skills": {s: _mean_sd([r.skills[s] for r in runs if s in r.skills])
                       for s in hardest},
            "curves": [{"seed": r.seed, "rollouts": r.rollouts, "success": r.success}
                       for r in runs],
        }
    return {"target": target, "hardest_skills": hardest, "arms": arms}


def ratio_line(summary: dict[str, Any]) -> str:
    arms = summary["arms"]
    if "failure" not in arms:
        return "rollouts-to-target ratio: n/a (no failure arm)"
    base = arms["failure"]
    parts = []
    for other in ("uniform", "filter"):
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
        parts.append(f"{other}/failure {flag}{ratio:.2f}")
    return "rollouts-to-target ratio: " + ", ".join(parts)


def markdown_table(summary: dict[str, Any]) -> str:
    hardest = summary["hardest_skills"]
    head = (["arm", f"rollouts to {summary['target']:.2f} (reached)", "final held-out success"]
            + [f"`{s}`" for s in hardest])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, a in summary["arms"].items():
        rtt = f"{a['rollouts_to_target_mean']:.0f} ± {a['rollouts_to_target_sd']:.0f}"
        if a["reached"] < len(a["seeds"]):
            rtt = f"≥ {rtt}"
        cells = [arm, f"{rtt} ({a['reached']}/{len(a['seeds'])})",
                 f"{a['final_success_mean']:.3f} ± {a['final_success_sd']:.3f}"]
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
        ys = np.stack([np.interp(grid, c["rollouts"], c["success"]) for c in curves])
        line, = ax.plot(grid, ys.mean(0), marker="o", ms=3, label=f"{arm} (n={len(curves)})")
        ax.fill_between(grid, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.18)
    ax.axhline(summary["target"], ls="--", color="grey", lw=1, label="target")
    ax.set_xlabel("rollouts (training + difficulty probes)")
    ax.set_ylabel("held-out success")
    ax.set_title("held-out success against rollouts (mean, min-max over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- driver ---------------------------------------------------------------------------------------

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
    runs = [(arm, seed) for seed in range(seeds) for arm in b.arms]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task("cold start (SFT)", total=1 + len(runs))
        _launch(cold_cfg, cold, 0, b.threads * b.parallel)  # alone: all the threads
        progress.update(bar, advance=1, description="arms x seeds")
        policy = cold / "policy"

        def one(job: tuple[str, int]) -> tuple[str, int, float]:
            arm, seed = job
            secs = _launch(arm_config(config, arm, seed, policy), out / f"{arm}-s{seed}",
                           config.rounds, b.threads)
            progress.update(bar, advance=1)
            return arm, seed, secs

        with ThreadPoolExecutor(max_workers=b.parallel) as pool:
            timings = list(pool.map(one, runs))
    results = []
    for (arm, seed), (_, _, secs) in zip(runs, timings, strict=True):
        r = read_run(out / f"{arm}-s{seed}", arm, seed)
        r.seconds = secs
        results.append(r)
    start_skills = skill_success(Store(cold / "sentinel.duckdb"), 0, b.min_skill_tasks)
    hardest = sorted(start_skills, key=lambda s: (start_skills[s], s))[: b.hardest_skills]
    summary = summarize(results, b.target, hardest)
    summary["start_success"] = results[0].success[0] if results else None
    summary["start_skills"] = {s: start_skills[s] for s in hardest}
    summary["seconds"] = time.time() - started
    summary["command"] = command
    summary["run_seconds"] = {f"{r.arm}-s{r.seed}": r.seconds for r in results}
    (out / "results.json").write_text(json.dumps(summary, indent=2))
    plot(summary, out / "curves.png")
    table = markdown_table(summary)
    line = ratio_line(summary)
    (out / "results.md").write_text(
        f"# Curriculum bench\n\n`{command}`\n\nTarget held-out success {b.target:.2f}; "
        f"{seeds} seed(s); this invocation {summary['seconds'] / 60:.1f} min (runs found "
        f"finished in {out} were reused, not rerun).\n\n{table}\n\n"
        f"![held-out success against rollouts](curves.png)\n\n{line}\n")
    console.print(table)
    console.print(line)
    return summary
