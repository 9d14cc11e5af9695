"""What each training step trains on.

`Curriculum` mixes three sources into a batch of tasks:
- **mined**: tasks the generators made from recent failures (newest first, so tasks generated in
  round r are trained on in round r+1);
- **replay**: tasks the policy failed on earlier and has not mastered yet;
- **base**: fresh draws from the families' base distribution (weighted by family), never a
  held-out task.
Tasks the policy has mastered (pass rate at least `mastery_threshold` over at least
`mastery_min_samples` samples) are skipped; `mastered_tasks()` lists them for the `escalate`
generator. Interface (as prime-rl's samplers): `sample`, `observe`, `state_dict` /
`load_state_dict`, `metrics`.

`weighting` says which mined and replayed tasks fill their shares. `newest`: mined tasks newest
first, untried before tried; replay a seeded shuffle. `learnability` (PLR / SFL): both shares are
drawn without replacement with probability proportional to p(1-p) + `learnability_floor`, where p
is the task's pass rate estimated only from the rollouts `observe` has already seen (no probe
rollouts): the posterior mean (successes + a) / (attempts + 2a) under a Beta(a, a) prior,
a = `learnability_prior`. A task never tried takes the pooled outcomes of the tasks of the same
generator sharing its `target_cluster_id` (generators aiming at one cluster can make tasks of
very different difficulty, so each generator's outcomes are pooled apart first; docs/results.md,
"The third run"), else of all the tasks sharing its `target_cluster_id`, else of its parent task,
else the prior alone (p = 0.5, the largest weight: what nobody has tried yet is tried first). So
a group the policy always or never solves (no GRPO signal) makes its task, and untried tasks of
its cluster, unlikely to be drawn again, while the floor keeps every task reachable.

With `balance_skills` (a skill namespace such as `recover`), the mined share is first dealt out
evenly over the strata of the mined pool, a stratum being a task's first skill in it (`recover:T`;
tasks without one form a stratum of their own), and `weighting` chooses within each stratum, so
every stratum with tasks left gets its turn whatever `weighting` would prefer (docs/results.md,
"The third run" and "The fifth run"). The slots are dealt one at a time, round robin over the
strata in sorted order, a stratum with no task left passing its slots on. Every draw comes from
the curriculum's own rng, which the state holds, so a resumed run draws as an uninterrupted one.
Simplifications: a task's own outcomes are not shrunk towards its cluster's, and they do not decay
with age.

`observe(trajectories) -> kept` takes a step's scored rollouts whole: it updates each task's pass
rate (mastery, replay) and passes the groups through the admission gate, returning the
trajectories worth training on. The gate is `ZeroVarianceGate` (DAPO dynamic sampling): a group
whose signal is all equal has zero advantage everywhere; with `drop` it is dropped, so it does not
dilute a token-mean loss. Unlike DAPO, no extra groups are sampled to refill the batch (a step may
train on fewer groups, or on none). Dropped groups are counted in `metrics` either way
(`zero_variance_groups`: this step; `zero_variance_dropped`: the run so far). What "all equal" is
judged on is `on` (`group_signal`): the total reward (the group adds nothing to the loss) or the
verifier's success (DAPO's rule, accuracy 0 or 1: with format/process reward terms such a group
still has small non-zero advantages).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sentinel.types import Task, Trajectory

WEIGHTINGS = ("newest", "learnability")  # `curriculum.weighting`, see the module docstring


@dataclass
class TaskStats:
    attempts: int = 0
    successes: int = 0

    @property
    def pass_rate(self) -> float:
        return self.successes / self.attempts if self.attempts else 0.0


class Curriculum:
    def __init__(self, base_sampler: Callable[[random.Random], Task], *, mined_fraction: float,
                 replay_fraction: float, mastery_threshold: float, mastery_min_samples: int,
                 seed: int, excluded_ids: set[str] | None = None,
                 gate: ZeroVarianceGate | None = None, weighting: str = "newest",
                 learnability_prior: float = 1.0, learnability_floor: float = 0.01,
                 balance_skills: str | None = None) -> None:
        if balance_skills is not None and not balance_skills:
            raise ValueError("curriculum.balance_skills must be a skill namespace (such as "
                             "'recover', for the skills 'recover:*') or null")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"curriculum.weighting must be one of {', '.join(WEIGHTINGS)}, "
                             f"got {weighting!r}")
        if not learnability_prior > 0:
            raise ValueError("curriculum.learnability_prior must be > 0 (a Beta prior's "
                             f"pseudo-count), got {learnability_prior!r}")
        if not learnability_floor > 0:
            raise ValueError("curriculum.learnability_floor must be > 0 (so no task starves), "
                             f"got {learnability_floor!r}")
        self.weighting = weighting
        self.balance_skills = balance_skills
        self.prior, self.floor = learnability_prior, learnability_floor
        self.base_sampler = base_sampler
        self.mined_fraction, self.replay_fraction = mined_fraction, replay_fraction
        self.mastery_threshold, self.mastery_min_samples = mastery_threshold, mastery_min_samples
        self.excluded_ids = set(excluded_ids or ())
        self.rng = random.Random(seed)
        self.tasks: dict[str, Task] = {}
        self.mined: list[str] = []  # generated task ids, oldest first
        self.stats: dict[str, TaskStats] = {}
        self._last: dict[str, int] = {"mined": 0, "replay": 0, "base": 0}
        # p(1-p) of the last sample's mined + replay picks and of the pools they were drawn
        # from, by task id (their means are metrics)
        self._last_learnability: dict[str, dict[str, float]] = {"chosen": {}, "pool": {}}
        self.gate = gate or ZeroVarianceGate()

    @classmethod
    def from_config(cls, config: Any, base_sampler: Callable[[random.Random], Task], *,
                    seed: int, excluded_ids: set[str]) -> Curriculum:
        """From the config's `curriculum:` section (`sentinel.config.CurriculumConfig`)."""
        return cls(base_sampler, mined_fraction=config.mined_fraction,
                   replay_fraction=config.replay_fraction,
                   mastery_threshold=config.mastery_threshold,
                   mastery_min_samples=config.mastery_min_samples, seed=seed,
                   excluded_ids=excluded_ids,
                   gate=ZeroVarianceGate(drop=config.drop_zero_variance,
                                         on=config.zero_variance_on),
                   weighting=config.weighting, learnability_prior=config.learnability_prior,
                   learnability_floor=config.learnability_floor,
                   balance_skills=config.balance_skills)

    def add_mined(self, tasks: list[Task]) -> None:
        for task in tasks:
            if task.task_id not in self.tasks and task.task_id not in self.excluded_ids:
                self.tasks[task.task_id] = task
                self.mined.append(task.task_id)

    def mastered(self, task_id: str) -> bool:
        s = self.stats.get(task_id)
        return (s is not None and s.attempts >= self.mastery_min_samples
                and s.pass_rate >= self.mastery_threshold)

    def mastered_tasks(self) -> list[Task]:
        """Tasks the policy has mastered (see `mastered`), in the order they were first seen."""
        return [self.tasks[t] for t in self.stats if t in self.tasks and self.mastered(t)]

    def _fresh_mined(self) -> list[str]:
        """Unmastered generated tasks, newest first, untried before tried."""
        pool = [t for t in reversed(self.mined) if not self.mastered(t)]
        return sorted(pool, key=lambda t: self.stats.get(t, TaskStats()).attempts > 0)

    def _replayable(self, exclude: set[str]) -> list[str]:
        return [t for t, s in self.stats.items()
                if t not in exclude and s.attempts and s.successes < s.attempts
                and not self.mastered(t)]

    def _posterior(self, successes: int, attempts: int) -> float:
        return (successes + self.prior) / (attempts + 2 * self.prior)

    def _cluster_outcomes(self) -> dict[Any, tuple[int, int]]:
        """(successes, attempts) pooled over the known tasks of each target cluster (key: the
        cluster id) and of each (cluster id, generator) pair (key: the tuple)."""
        pooled: dict[Any, tuple[int, int]] = {}
        for task_id, task in self.tasks.items():
            cluster = task.target_cluster_id
            if cluster is None:
                continue
            s = self.stats.get(task_id, TaskStats())
            for key in (cluster, (cluster, task.generator)):
                done, tried = pooled.get(key, (0, 0))
                pooled[key] = (done + s.successes, tried + s.attempts)
        return pooled

    def pass_rate_estimate(self, task_id: str) -> float:
        """p of `task_id` as `learnability` weighs it (module docstring): its own outcomes, else
        those pooled over its generator's tasks of its cluster, else over its cluster's, else its
        parent task's, each under the Beta prior; else the prior's mean 0.5."""
        return self._estimate(task_id, self._cluster_outcomes())

    def _estimate(self, task_id: str, clusters: dict[Any, tuple[int, int]]) -> float:
        """`pass_rate_estimate` with the clusters' outcomes pooled once per batch."""
        s = self.stats.get(task_id)
        if s is not None and s.attempts:
            return self._posterior(s.successes, s.attempts)
        task = self.tasks.get(task_id)
        if task is not None and task.target_cluster_id is not None:
            for key in ((task.target_cluster_id, task.generator), task.target_cluster_id):
                done, tried = clusters.get(key, (0, 0))
                if tried:
                    return self._posterior(done, tried)
        if task is not None:
            parent = self.stats.get(task.parent_task_id or "")
            if parent is not None and parent.attempts:
                return self._posterior(parent.successes, parent.attempts)
        return self._posterior(0, 0)

    def cluster_learnability(self) -> dict[str, float]:
        """{target cluster id: p(1-p)} over the clusters of the known tasks (in the order their
        first task arrived), p pooled over the cluster's observed outcomes under the prior; a
        cluster whose tasks the policy always or never solves scores near 0."""
        return {cluster: p * (1 - p) for cluster, (done, tried) in self._cluster_outcomes().items()
                if isinstance(cluster, str) for p in [self._posterior(done, tried)]}

    def _draw(self, pool: list[str], k: int, clusters: dict[Any, tuple[int, int]],
              ) -> list[str]:
        """`k` of `pool` without replacement, each draw with probability proportional to
        p(1-p) + floor among those left (Efraimidis-Spirakis keys: log(u) / weight, largest
        first; one rng draw per pool task, in pool order). Records the learnability of the pool
        and of the drawn tasks for `metrics`."""
        learn = {t: p * (1 - p) for t in pool for p in [self._estimate(t, clusters)]}
        keys = {t: math.log(1.0 - self.rng.random()) / (learn[t] + self.floor) for t in pool}
        chosen = sorted(pool, key=lambda t: keys[t], reverse=True)[:k]
        self._last_learnability["pool"].update(learn)
        self._last_learnability["chosen"].update((t, learn[t]) for t in chosen)
        return chosen

    def stratum(self, task_id: str) -> str:
        """The `balance_skills` stratum of a task: its first skill in that namespace (`ns:...`),
        else ''."""
        return self._stratum_of(self.tasks[task_id])

    def _stratum_of(self, task: Task) -> str:
        prefix = f"{self.balance_skills}:"
        return next((s for s in task.skills if s.startswith(prefix)), "")

    def _slots(self, strata: dict[str, list[str]], k: int) -> dict[str, int]:
        """How many of `k` slots each stratum gets, capped by its size (a full stratum passes
        its slots on): dealt one at a time to the open stratum with the fewest slots so far,
        ties to the first in sorted order (round robin)."""
        slots = dict.fromkeys(sorted(strata), 0)
        for _ in range(min(k, sum(len(pool) for pool in strata.values()))):
            open_ = [name for name in slots if slots[name] < len(strata[name])]
            best = min(open_, key=lambda name: slots[name])
            slots[best] += 1
        return slots

    def _balanced(self, pool: list[str], k: int,
                  choose: Callable[[list[str], int], list[str]]) -> list[str]:
        """`k` of `pool` (in pool order), picked by `choose(subpool, k)`. Without
        `balance_skills`, one call on the whole pool. With it, the slots are dealt out over the
        strata present (`_slots`, evenly), no stratum taking more than it holds, and `choose`
        picks within each stratum."""
        if self.balance_skills is None or k <= 0:
            return choose(pool, k)
        strata: dict[str, list[str]] = defaultdict(list)
        for t in pool:
            strata[self.stratum(t)].append(t)
        slots = self._slots(strata, k)
        picked = {t for name, m in slots.items() if m for t in choose(strata[name], m)}
        return [t for t in pool if t in picked]

    def sample(self, n: int) -> list[Task]:
        """`n` distinct tasks: mined, then replay (each share chosen as `weighting` says), then
        base draws fill the rest."""
        n_mined_slots = round(n * self.mined_fraction)
        n_replay_slots = round(n * self.replay_fraction)
        if self.weighting == "learnability":
            self._last_learnability = {"chosen": {}, "pool": {}}
            clusters = self._cluster_outcomes()
            chosen = self._balanced([t for t in self.mined if not self.mastered(t)],
                                    n_mined_slots, lambda pool, k: self._draw(pool, k, clusters))
            n_mined = len(chosen)
            chosen += self._draw(self._replayable(set(chosen)), n_replay_slots, clusters)
        else:
            chosen = self._balanced(self._fresh_mined(), n_mined_slots,
                                    lambda pool, k: pool[:k])
            n_mined = len(chosen)
            replay = self._replayable(set(chosen))
            self.rng.shuffle(replay)
            chosen += replay[:n_replay_slots]
        n_replay = len(chosen) - n_mined
        seen = set(chosen)
        for _ in range(50 * n):
            if len(chosen) >= n:
                break
            task = self.base_sampler(self.rng)
            if task.task_id in seen or task.task_id in self.excluded_ids:
                continue
            if self.mastered(task.task_id):
                continue
            self.tasks.setdefault(task.task_id, task)
            chosen.append(task.task_id)
            seen.add(task.task_id)
        n_base = len(chosen) - n_mined - n_replay
        self._last = {"mined": n_mined, "replay": n_replay, "base": n_base}
        return [self.tasks[t] for t in chosen]

    def observe(self, trajectories: Sequence[Trajectory]) -> list[Trajectory]:
        """Take one step's scored rollouts: record each task's outcomes, then return the
        trajectories of the groups the gate admits (in their order)."""
        by_task: dict[str, list[bool]] = defaultdict(list)
        for t in trajectories:
            by_task[t.task_id].append(t.success)
        for task_id, outcomes in by_task.items():
            self.record(task_id, sum(outcomes), len(outcomes))
        keep = self.gate(trajectories)
        return [t for t in trajectories if t.group_id in keep]

    def record(self, task_id: str, successes: int, attempts: int) -> None:
        """Add `successes` out of `attempts` to a task's pass-rate statistics."""
        s = self.stats.setdefault(task_id, TaskStats())
        s.attempts += attempts
        s.successes += successes

    def metrics(self) -> dict[str, float]:
        """Batch composition, mastery and gate counts; with `learnability`, also
        `learnability_mean` (mean p(1-p) of the mined + replay tasks the last `sample` chose) and
        `learnability_pool` (mean over the pools it drew from), each absent when its set was
        empty (a mean of nothing is not 0)."""
        metrics = {
            "curriculum/mined_in_batch": float(self._last["mined"]),
            "curriculum/replay_in_batch": float(self._last["replay"]),
            "curriculum/base_in_batch": float(self._last["base"]),
            "curriculum/mined_pool": float(len(self.mined)),
            "curriculum/mastered": float(sum(self.mastered(t) for t in self.stats)),
            **self.gate.metrics(),
        }
        for name, values in (("mean", self._last_learnability["chosen"]),
                             ("pool", self._last_learnability["pool"])):
            if values:
                metrics[f"curriculum/learnability_{name}"] = sum(values.values()) / len(values)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.getstate(),
            "mined": list(self.mined),
            # Every task the sampler may return again: mined ones and any with stats (replay).
            "tasks": {t: self.tasks[t].to_row() for t in {*self.mined, *self.stats}
                      if t in self.tasks},
            "stats": {t: [s.attempts, s.successes] for t, s in self.stats.items()},
            "zero_variance_dropped": self.gate.dropped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.mined = list(state["mined"])
        self.tasks.update({t: Task.from_row(row) for t, row in state["tasks"].items()})
        self.stats = {t: TaskStats(a, s) for t, (a, s) in state["stats"].items()}
        self.gate.dropped = int(state.get("zero_variance_dropped", 0))


class ZeroVarianceGate:
    """Admission gate over a step's groups: with `drop`, the groups whose `group_signal` is all
    equal (within 1e-9) are refused; without, every group is admitted. Counts the zero-variance
    groups either way (`metrics`)."""

    def __init__(self, *, drop: bool = False, on: str = "reward") -> None:
        if on not in ("reward", "success"):
            raise ValueError(f"zero_variance_on must be 'reward' or 'success', got {on!r}")
        self.drop, self.on = drop, on
        self.last = 0  # zero-variance groups in the latest step
        self.dropped = 0  # dropped over the run

    def __call__(self, trajectories: Sequence[Trajectory]) -> set[str]:
        """The group ids admitted."""
        signals: dict[str, list[float]] = defaultdict(list)
        for t in trajectories:
            signals[t.group_id].append(group_signal(t, self.on))
        flat = {g for g, values in signals.items() if max(values) - min(values) <= 1e-9}
        self.last = len(flat)
        if not self.drop:
            return set(signals)
        self.dropped += len(flat)
        return set(signals) - flat

    def metrics(self) -> dict[str, float]:
        return {"curriculum/zero_variance_groups": float(self.last),
                "curriculum/zero_variance_dropped": float(self.dropped)}


def group_signal(trajectory: Trajectory, on: str) -> float:
    """The value `filter_zero_variance` compares within a group: the trajectory's total reward
    (`on="reward"`) or its verified success as 0.0/1.0 (`on="success"`, DAPO's accuracy)."""
    if on == "reward":
        return float(trajectory.reward)
    if on == "success":
        return float(trajectory.success)
    raise ValueError(f"zero_variance_on must be 'reward' or 'success', got {on!r}")
