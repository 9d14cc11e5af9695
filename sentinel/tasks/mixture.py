"""`TaskMixture`: several task families mixed by weight, the one place that does it (as
nanochat's `TaskMixture`).

The loop builds two: the training mixture (`families:` in the config), whose `sample` is the
curriculum's base distribution, and the held-out mixture (`eval.families`, default the training
ones), whose `draw` makes the fixed held-out set. Each member samples with its own family config,
so a held-out member may reach past the training range (more operands, larger numbers); a task
is verified and run by its family, whose checks depend on the task's spec, not on the sampling
config.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sentinel.tasks.base import TaskFamily
from sentinel.types import Origin, Task


class TaskMixture:
    """`members`: (name, family, weight); names are how tasks find their family (`Task.family`)."""

    def __init__(self, members: Sequence[tuple[str, TaskFamily, float]]) -> None:
        if not members:
            raise ValueError("a task mixture needs at least one family")
        self.names = [name for name, _, _ in members]
        self.members = [family for _, family, _ in members]
        self.weights = [weight for _, _, weight in members]

    @classmethod
    def from_entries(cls, entries: Iterable[Any]) -> TaskMixture:
        """From config family entries (`sentinel.tasks.FamilyEntry`: type, weight, build())."""
        return cls([(e.type, e.build(), e.weight) for e in entries])

    @property
    def families(self) -> dict[str, TaskFamily]:
        """The members by name (the first member of a name wins)."""
        out: dict[str, TaskFamily] = {}
        for name, family in zip(self.names, self.members, strict=True):
            out.setdefault(name, family)
        return out

    def sample(self, rng: random.Random, origin: Origin = "seed") -> Task:
        """One task: a member chosen by weight, then a task from its base distribution."""
        k = rng.choices(range(len(self.members)), weights=self.weights)[0]
        return self.members[k].sample_task(rng, origin=origin)

    def draw(self, n: int, seed: int, origin: Origin = "eval", *,
             stratified: bool = False) -> list[Task]:
        """`n` distinct tasks from a fresh `Random(seed)` (fewer if the mixture has fewer: at
        most `100 * n` draws are tried). `stratified`: member i contributes exactly its share
        `n * w_i / sum(w)` (largest remainders), so a held-out suite of 5 fault types x 40 tasks
        is exactly that; otherwise each task's member is chosen by weight."""
        rng = random.Random(seed)
        tasks: dict[str, Task] = {}
        if not stratified:
            _fill(tasks, n, lambda: self.sample(rng, origin=origin), 100 * n)
            return list(tasks.values())
        for member, count in zip(self.members, _apportion(n, self.weights), strict=True):
            _fill(tasks, len(tasks) + count, lambda m=member: m.sample_task(rng, origin=origin),
                  100 * count)
        return list(tasks.values())


def _fill(tasks: dict[str, Task], want: int, draw: Callable[[], Task], tries: int) -> None:
    """Add distinct tasks from `draw` to `tasks` until it holds `want`, at most `tries` draws."""
    for _ in range(tries):
        if len(tasks) >= want:
            return
        task = draw()
        tasks.setdefault(task.task_id, task)


def _apportion(n: int, weights: Sequence[float]) -> list[int]:
    """`n` split in proportion to `weights` by largest remainders (ties: the earlier member).

    >>> _apportion(10, [1, 1, 1])
    [4, 3, 3]
    """
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts
