"""How much a run's held-out results changed between two rounds, with the noise stated.

The held-out set is the same tasks every round, so the change is a paired difference: per task,
its success rate in the last round minus its rate in the first. `heldout_change` gives the mean
of those differences with a 95 % percentile bootstrap CI over the tasks (resampled with a fixed
seed), for held-out success (all tasks) and, when tasks carry fault types (`recover:T` skills),
for the mean recovery rate over the fault types: each type's mean over its tasks, then their
unweighted mean (as `recovery/mean` and the `recovery_rates` view), the tasks resampled within
each type. The CI is over the tasks of one run: it states the evaluation's sampling noise, not
the spread over training seeds (the bench's paired seeds measure that).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any

from sentinel.analyzer import fault_types

BOOTSTRAP = 2000


@dataclass
class Change:
    first: float
    last: float
    low: float  # 95 % CI of last - first
    high: float
    tasks: int

    @property
    def diff(self) -> float:
        return self.last - self.first

    def __str__(self) -> str:
        return (f"{self.first:.3f} -> {self.last:.3f} ({self.diff:+.3f}, 95 % CI "
                f"[{self.low:+.3f}, {self.high:+.3f}] over {self.tasks} paired tasks)")


def _change(strata: list[list[tuple[float, float]]], n: int, seed: int) -> Change:
    """Mean over strata of each stratum's mean; pairs (first, last) resampled within strata."""
    def stat(groups: list[list[tuple[float, float]]], i: int) -> float:
        return statistics.fmean(statistics.fmean(p[i] for p in g) for g in groups)

    rng = random.Random(seed)
    diffs = sorted(stat(s, 1) - stat(s, 0) for s in
                   ([rng.choices(g, k=len(g)) for g in strata] for _ in range(n)))
    return Change(stat(strata, 0), stat(strata, 1), diffs[int(0.025 * n)],
                  diffs[min(n - 1, int(0.975 * n))], sum(len(g) for g in strata))


def paired_rates(store: Any, first: int, last: int) -> list[tuple[float, float, list[str]]]:
    """(success rate at `first`, at `last`, the task's fault types) of every held-out task
    evaluated in both rounds, in task-id order."""
    _, rows = store.query(
        "SELECT e0.task_id, e0.success_rate, e1.success_rate, t.skills FROM evals e0 "
        "JOIN evals e1 ON e1.task_id = e0.task_id AND e1.round = ? "
        "JOIN tasks t ON t.task_id = e0.task_id "
        "WHERE e0.round = ? AND e0.k > 0 AND e1.k > 0 ORDER BY e0.task_id", [last, first])
    return [(a, b, fault_types(skills)) for _, a, b, skills in rows]


def paired_change(strata: list[list[tuple[float, float]]], *, n: int = BOOTSTRAP,
                  seed: int = 0) -> Change:
    """The change of the mean over `strata` of each stratum's mean (of its (first, last)
    pairs), with a 95 % CI from resampling the pairs within each stratum."""
    return _change(strata, n, seed)


def heldout_change(store: Any, first: int, last: int, *, n: int = BOOTSTRAP,
                   seed: int = 0) -> dict[str, Change]:
    """{'success': Change, 'recovery': Change (only when some held-out tasks carry a fault
    type)} between rounds `first` and `last` over the tasks evaluated in both; {} when none
    were."""
    rows = paired_rates(store, first, last)
    if not rows:
        return {}
    out = {"success": _change([[(a, b) for a, b, _ in rows]], n, seed)}
    by_type: dict[str, list[tuple[float, float]]] = {}
    for a, b, faults in rows:
        for fault in faults:
            by_type.setdefault(fault, []).append((a, b))
    if by_type:
        out["recovery"] = _change([by_type[t] for t in sorted(by_type)], n, seed)
    return out
