"""`RoundRecord`: everything one round will commit, gathered in memory until the round's
transaction, and the `rounds` row and console line made from it."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sentinel.analyzer import fault_types
from sentinel.types import Failure, Rejection, Task, Trajectory


def _torch_threads() -> int | None:
    import sys

    torch = sys.modules.get("torch")  # the loop has imported it; nothing here needs to
    return torch.get_num_threads() if torch is not None else None


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def average(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each key's mean over the rows that have it (a round's metrics from its steps')."""
    return {key: sum(vals) / len(vals)
            for key in {k for row in rows for k in row}
            for vals in [[row[key] for row in rows if key in row]]}


@dataclass
class RoundRecord:
    """Everything one round will commit, gathered in memory until the round's transaction."""

    round: int
    tasks: dict[str, Task] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    clusters: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    generated: dict[str, dict[str, int]] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    _inner: list[float] = field(default_factory=list)

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the block's wall time to `timings[phase]`, exclusive of phases timed inside it
        (the probe inside generation), so the phases add up to the round's time."""
        start = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.timings[phase] += elapsed - self._inner.pop()
            if self._inner:
                self._inner[-1] += elapsed

    def add_eval(self, tasks: list[Task], sampled: list[Trajectory],
                 greedy: list[Trajectory]) -> None:
        """Record a held-out evaluation: every task's `evals` row (its sampled successes out of
        its samples, and its greedy verdict), the trajectories, `heldout_success` and, with
        greedy rollouts, `heldout_greedy`. When some tasks carry fault types (`recover:T`
        skills), also `recovery/<T>` (sampled successes / samples over the tasks carrying T, as
        the store's `recovery_rates` view) and `recovery/mean` (their unweighted mean)."""
        self.trajectories += sampled + greedy
        k = Counter(t.task_id for t in sampled)
        ok = Counter(t.task_id for t in sampled if t.success)
        greedy_ok = {t.task_id: t.success for t in greedy}
        for task in tasks:
            self.tasks.setdefault(task.task_id, task)
            self.evals.append({
                "round": self.round, "task_id": task.task_id, "k": k[task.task_id],
                "successes": ok[task.task_id], "success_rate": ok[task.task_id] / k[task.task_id],
                "greedy_success": greedy_ok.get(task.task_id),
            })
        self.metrics["heldout_success"] = mean([float(t.success) for t in sampled]) or 0.0
        attempts: Counter[str] = Counter()
        recovered: Counter[str] = Counter()
        for task in tasks:
            for fault in fault_types(task.skills):
                attempts[fault] += k[task.task_id]
                recovered[fault] += ok[task.task_id]
        rates = {fault: recovered[fault] / n for fault, n in sorted(attempts.items()) if n}
        self.metrics |= {f"recovery/{fault}": rate for fault, rate in rates.items()}
        if rates:
            self.metrics["recovery/mean"] = sum(rates.values()) / len(rates)
        if greedy:
            self.metrics["heldout_greedy"] = mean([float(t.success) for t in greedy]) or 0.0

    def train(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.split == "train"]

    def row(self) -> dict[str, Any]:
        """The `rounds` row (docs/schema.md)."""
        train = self.train()
        metrics: dict[str, Any] = {k: v for k, v in self.metrics.items()
                                   if k not in ("heldout_success", "heldout_greedy")}
        metrics["failures"] = dict(Counter(f.mode for f in self.failures))
        metrics["generators"] = self.generated
        # A generator that crashed or timed out proposed no candidate: an error, not a rejection,
        # so that n_proposed = n_accepted + n_rejected (as in the generator_yield view).
        metrics["generator_errors"] = sum(c.get("errors", 0) for c in self.generated.values())
        # A run is bit-reproducible for a given seed with one thread; with several, float sums
        # vary from run to run under load, which sampling amplifies (README, "Reproducibility").
        metrics["torch_threads"] = _torch_threads()
        return {
            "started_at": self.started, "finished_at": time.time(), "n_train_rollouts": len(train),
            "train_success": mean([float(t.success) for t in train]),
            "train_reward": mean([t.reward for t in train]),
            "heldout_success": self.metrics.get("heldout_success"),
            "heldout_greedy": self.metrics.get("heldout_greedy"),
            "n_proposed": sum(c.get("proposed", 0) for c in self.generated.values()),
            "n_accepted": sum(c.get("accepted", 0) for c in self.generated.values()),
            "n_rejected": sum(c.get("rejected", 0) for c in self.generated.values()),
            "metrics": metrics, "timings": dict(self.timings),
        }

    def summary(self, row: dict[str, Any]) -> str:
        """One console line: held-out success, held-out recovery (the mean over fault types,
        then each), failures by mode, generation, seconds."""
        modes = Counter(f.mode for f in self.failures)
        parts = [f"[bold]round {self.round}[/bold]",
                 f"held-out success {row['heldout_success']:.3f}"]
        if row["heldout_greedy"] is not None:
            parts.append(f"(greedy {row['heldout_greedy']:.3f})")
        if row["train_success"] is not None:
            parts.append(f"train success {row['train_success']:.3f}")
        recovery = {k.removeprefix("recovery/"): v for k, v in row["metrics"].items()
                    if k.startswith("recovery/") and k != "recovery/mean"}
        if recovery:
            parts.append(f"recovery {row['metrics']['recovery/mean']:.3f} ("
                         + " ".join(f"{t} {v:.2f}" for t, v in recovery.items()) + ")")
        if modes:
            parts.append("failures " + ", ".join(f"{m}={n}" for m, n in modes.most_common()))
        if self.round > 0:
            parts.append(f"generated {row['n_accepted']} accepted / {row['n_rejected']} rejected")
            if row["metrics"]["generator_errors"]:
                parts.append(f"{row['metrics']['generator_errors']} generator errors")
            if any(r.reason == "generator_timeout" for r in self.rejections):
                parts.append("[yellow]a generator hit generation.time_limit_s: this round's "
                             "tasks depend on the machine's speed[/yellow]")
        parts.append(f"[dim]{sum(self.timings.values()):.0f}s[/dim]")
        return "  ".join(parts)
