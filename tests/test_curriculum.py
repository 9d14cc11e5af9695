"""The curriculum: mined first (newest first), replay, base draws; held-out and mastered tasks
skipped; state round trip."""

from __future__ import annotations

import json
import random

import pytest

from sentinel.config import ConfigError, load_config
from sentinel.curriculum import Curriculum, ZeroVarianceGate, group_signal
from sentinel.tasks import load_family
from sentinel.types import Task, Trajectory

ARITH = load_family("arith")
# a base distribution of exactly nine tasks (a+b, a and b in 1..3), so coverage is checkable
SMALL = load_family("arith", {"max_operands": 2, "max_value": 3, "ops": "+"})
SMALL_IDS = {SMALL.make_task({"expr": f"{a}+{b}"}).task_id for a in (1, 2, 3) for b in (1, 2, 3)}


def _curriculum(family=ARITH, *, seed: int = 0, mined: float = 0.5, replay: float = 0.0,
                excluded: set[str] | None = None, min_samples: int = 4,
                drop_zero_variance: bool = False, on: str = "reward") -> Curriculum:
    return Curriculum(family.sample_task, mined_fraction=mined, replay_fraction=replay,
                      mastery_threshold=0.75, mastery_min_samples=min_samples, seed=seed,
                      excluded_ids=excluded,
                      gate=ZeroVarianceGate(drop=drop_zero_variance, on=on))


def _generated(n: int) -> list[Task]:
    return [ARITH.make_task({"expr": f"{i}*{i + 1}+{i}"}, origin="generated", created_round=1)
            for i in range(1, n + 1)]


def _ids(tasks: list[Task]) -> list[str]:
    return [t.task_id for t in tasks]


def test_mined_tasks_come_first_newest_first() -> None:
    cur = _curriculum()
    mined = _generated(5)
    cur.add_mined(mined[:3])
    cur.add_mined(mined[3:])
    batch = cur.sample(8)
    assert len(set(_ids(batch))) == 8
    assert _ids(batch[:4]) == _ids(mined[::-1][:4])  # round(8 * 0.5) = 4, newest first
    assert all(t.origin == "seed" for t in batch[4:])
    assert not set(_ids(batch[4:])) & set(_ids(mined))
    metrics = cur.metrics()
    assert metrics["curriculum/mined_in_batch"] == 4.0
    assert metrics["curriculum/base_in_batch"] == 4.0
    assert metrics["curriculum/replay_in_batch"] == 0.0
    assert metrics["curriculum/mined_pool"] == 5.0


@pytest.mark.parametrize(("fraction", "n", "expected"), [(0.25, 8, 2), (1.0, 4, 4), (0.0, 8, 0)])
def test_mined_fraction(fraction: float, n: int, expected: int) -> None:
    cur = _curriculum(mined=fraction)
    cur.add_mined(_generated(6))
    batch = cur.sample(n)
    assert len(batch) == n
    assert sum(t.origin == "generated" for t in batch) == expected


def test_tried_mined_tasks_go_after_untried() -> None:
    cur = _curriculum()
    mined = _generated(4)
    cur.add_mined(mined)
    cur.record(mined[3].task_id, 0, 1)  # the newest was tried (and failed)
    assert _ids(cur.sample(6)[:3]) == [mined[2].task_id, mined[1].task_id, mined[0].task_id]


def test_add_mined_deduplicates() -> None:
    cur = _curriculum()
    mined = _generated(2)
    cur.add_mined(mined)
    cur.add_mined(mined)
    assert cur.mined == _ids(mined)


def test_held_out_tasks_are_never_sampled() -> None:
    excluded = set(sorted(SMALL_IDS)[:4])
    cur = _curriculum(SMALL, excluded=excluded, mined=0.0)
    held_out_task = next(t for t in _small_tasks() if t.task_id in excluded)
    cur.add_mined([held_out_task])
    assert cur.mined == []
    seen: set[str] = set()
    for _ in range(20):
        seen |= set(_ids(cur.sample(3)))
    assert seen == SMALL_IDS - excluded  # every other task is reachable, no held-out one
    assert len(cur.sample(9)) == 5  # the pool runs dry instead of repeating or leaking


def _small_tasks() -> list[Task]:
    return [SMALL.make_task({"expr": f"{a}+{b}"}) for a in (1, 2, 3) for b in (1, 2, 3)]


def test_mastered_tasks_are_skipped() -> None:
    cur = _curriculum(SMALL, mined=0.5, min_samples=4)
    tasks = _small_tasks()
    mastered, almost = tasks[0].task_id, tasks[1].task_id
    cur.record(mastered, 3, 4)  # 0.75 over 4 samples: mastered
    cur.record(almost, 3, 3)  # too few samples to count
    assert cur.mastered(mastered) and not cur.mastered(almost)
    mined = SMALL.make_task({"expr": "3+3"}, origin="generated")
    cur.add_mined([mined])
    cur.record(mined.task_id, 4, 4)
    seen: set[str] = set()
    for _ in range(20):
        seen |= set(_ids(cur.sample(4)))
    assert mastered not in seen and mined.task_id not in seen
    assert almost in seen
    assert cur.metrics()["curriculum/mastered"] == 2.0


def test_replay_of_failed_tasks() -> None:
    cur = _curriculum(SMALL, mined=0.0, replay=0.5)
    first = cur.sample(4)
    failed, passed = first[0].task_id, first[1].task_id
    cur.record(failed, 1, 4)
    cur.record(passed, 4, 4)
    for _ in range(5):
        batch = _ids(cur.sample(4))
        assert batch[0] == failed  # the only replayable task leads every batch
        assert cur.metrics()["curriculum/replay_in_batch"] == 1.0


def test_replay_draws_among_failed_tasks_by_the_seed() -> None:
    """More failed tasks than replay slots: which ones come back is the seeded rng's choice, so
    different seeds replay different tasks (not always the same ones, e.g. the first ids)."""
    failed = sorted(SMALL_IDS)[:6]
    picks = set()
    for seed in range(8):
        cur = _curriculum(SMALL, seed=seed, mined=0.0, replay=0.5)
        cur.sample(9)  # every task of SMALL, so all six are known
        for task_id in failed:
            cur.record(task_id, 1, 4)
        picks.add(frozenset(_ids(cur.sample(4))[:2]))
    assert all(p <= set(failed) for p in picks)
    assert len(picks) > 1


def test_a_task_never_failed_is_not_replayed_even_before_mastery() -> None:
    cur = _curriculum(SMALL, mined=0.0, replay=0.5, min_samples=100)
    solved = cur.sample(4)[0].task_id
    cur.record(solved, 4, 4)  # 4 of 4: not mastered yet (100 samples needed), never failed
    for _ in range(5):
        cur.sample(4)
        assert cur.metrics()["curriculum/replay_in_batch"] == 0.0


def test_state_dict_round_trip_samples_the_same_batches() -> None:
    original = _curriculum(seed=3, mined=0.25)
    original.add_mined(_generated(6))
    for batch_no in range(2):
        for i, task in enumerate(original.sample(8)):
            original.record(task.task_id, (i + batch_no) % 2, 2)
    state = json.loads(json.dumps(original.state_dict()))  # must survive JSON
    restored = _curriculum(seed=999, mined=0.25)
    restored.load_state_dict(state)
    assert restored.mined == original.mined
    assert {t: (s.attempts, s.successes) for t, s in restored.stats.items()} == {
        t: (s.attempts, s.successes) for t, s in original.stats.items()}
    for _ in range(3):
        a, b = original.sample(8), restored.sample(8)
        assert _ids(a) == _ids(b)
        assert [t.spec for t in a] == [t.spec for t in b]
        for task in a:
            original.record(task.task_id, 0, 1)
            restored.record(task.task_id, 0, 1)


def test_a_state_saved_with_the_removed_balance_by_and_max_draws_counts_loads() -> None:
    """A checkpoint of a run made before `balance_by` and `max_draws` were removed holds their
    counts (`stratum_stats`, `stratum_fast`, `draws`); they are ignored, nothing else changes."""
    original = _curriculum(seed=3, mined=0.25)
    original.add_mined(_generated(6))
    first = original.sample(8)
    state = json.loads(json.dumps(original.state_dict()))
    old = {**state, "stratum_stats": {"": [1.0, 2.0]}, "stratum_fast": {"": [0.5, 1.0]},
           "draws": {first[0].task_id: 1}}
    restored = _curriculum(seed=999, mined=0.25)
    restored.load_state_dict(old)
    assert restored.state_dict() == original.state_dict()
    assert _ids(restored.sample(8)) == _ids(original.sample(8))

def test_restore_without_state_differs() -> None:
    """The round trip above is not trivial: without the state the batches differ."""
    original = _curriculum(seed=3)
    original.sample(8)
    other = _curriculum(seed=3)
    assert _ids(original.sample(8)) != _ids(other.sample(8))


def test_state_dict_round_trip_with_replay() -> None:
    original = _curriculum(seed=1, mined=0.0, replay=0.5)
    for task in original.sample(4):
        original.record(task.task_id, 0, 2)
    restored = _curriculum(seed=1, mined=0.0, replay=0.5)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert _ids(restored.sample(4)) == _ids(original.sample(4))


def test_sample_uses_the_seed() -> None:
    assert _ids(_curriculum(seed=5).sample(6)) == _ids(_curriculum(seed=5).sample(6))
    assert _ids(_curriculum(seed=5).sample(6)) != _ids(_curriculum(seed=6).sample(6))


def test_metrics_before_sampling() -> None:
    assert _curriculum().metrics() == {
        "curriculum/mined_in_batch": 0.0, "curriculum/replay_in_batch": 0.0,
        "curriculum/base_in_batch": 0.0, "curriculum/mined_pool": 0.0,
        "curriculum/mastered": 0.0, "curriculum/zero_variance_groups": 0.0,
        "curriculum/zero_variance_dropped": 0.0}


def test_base_sampler_draws_from_the_curriculum_rng() -> None:
    seen: list[random.Random] = []

    def sampler(rng: random.Random) -> Task:
        seen.append(rng)
        return ARITH.sample_task(rng)

    cur = Curriculum(sampler, mined_fraction=0.0, replay_fraction=0.0, mastery_threshold=0.9,
                     mastery_min_samples=8, seed=0)
    cur.sample(2)
    assert seen and all(r is cur.rng for r in seen)


def _traj(group: str, reward: float, success: bool, task_id: str | None = None) -> Trajectory:
    return Trajectory(task_id=task_id or group, messages=[], token_ids=[1], loss_mask=[1],
                      logprobs=[0.0], steps=[], finish_reason="answer", reward=reward,
                      success=success, group_id=group)


def _groups(spec: dict[str, list[float]]) -> list[Trajectory]:
    return [_traj(g, r, r >= 1.0) for g, rewards in spec.items() for r in rewards]


def test_metrics_count_zero_variance_groups() -> None:
    groups = {"g-flat": [1.0, 1.0, 1.0], "g-mixed": [0.0, 1.0, 1.0], "g-zero": [0.2, 0.2]}
    batch = _groups(groups)
    keep_all = _curriculum()
    assert keep_all.observe(batch) == batch
    assert keep_all.metrics()["curriculum/zero_variance_groups"] == 2.0
    assert keep_all.metrics()["curriculum/zero_variance_dropped"] == 0.0
    dropping = _curriculum(mined=0.0, drop_zero_variance=True)
    kept = dropping.observe(batch)
    assert kept == [t for t in batch if t.group_id == "g-mixed"]
    assert {t.group_id for t in dropping.observe(_groups({"g-new": [0.0, 0.5]}))} == {"g-new"}
    metrics = dropping.metrics()
    assert metrics["curriculum/zero_variance_groups"] == 0.0  # this step's
    assert metrics["curriculum/zero_variance_dropped"] == 2.0  # the run's
    restored = _curriculum(mined=0.0, drop_zero_variance=True)
    restored.load_state_dict(json.loads(json.dumps(dropping.state_dict())))
    assert restored.metrics()["curriculum/zero_variance_dropped"] == 2.0


def test_observe_records_every_task_also_of_dropped_groups() -> None:
    """Pass rates count every rollout paid for, admitted or not: mastery and replay see them."""
    cur = _curriculum(mined=0.0, drop_zero_variance=True, min_samples=2)
    batch = [_traj("g1", 1.0, True, "t1"), _traj("g1", 1.0, True, "t1"),
             _traj("g2", 0.0, False, "t2"), _traj("g2", 1.0, True, "t2")]
    assert [t.group_id for t in cur.observe(batch)] == ["g2", "g2"]
    assert (cur.stats["t1"].attempts, cur.stats["t1"].successes) == (2, 2)
    assert (cur.stats["t2"].attempts, cur.stats["t2"].successes) == (2, 1)
    assert cur.mastered("t1") and not cur.mastered("t2")


def test_mastered_tasks_lists_the_tasks_to_escalate() -> None:
    cur = _curriculum(SMALL, mined=0.0, min_samples=4)
    batch = cur.sample(4)
    cur.record(batch[2].task_id, 4, 4)
    cur.record(batch[0].task_id, 1, 4)
    cur.record(batch[1].task_id, 3, 4)
    assert _ids(cur.mastered_tasks()) == [batch[2].task_id, batch[1].task_id]
    restored = _curriculum(SMALL, mined=0.0, min_samples=4)
    restored.load_state_dict(json.loads(json.dumps(cur.state_dict())))
    assert [t.spec for t in restored.mastered_tasks()] == [t.spec for t in cur.mastered_tasks()]


def test_zero_variance_on_success_drops_groups_whose_rewards_differ_only_in_format_terms() -> None:
    """DAPO's filter judges accuracy: a group that always fails is dropped on `success` even when
    format/process terms make its rewards differ; on `reward` it is kept (non-zero advantages)."""
    def traj(group: str, reward: float, success: bool) -> Trajectory:
        return Trajectory(task_id=group, messages=[], token_ids=[1], loss_mask=[1],
                          logprobs=[0.0], steps=[], finish_reason="answer", reward=reward,
                          success=success, group_id=group)

    batch = [traj("g-fail", 0.1, False), traj("g-fail", 0.3, False),
             traj("g-mixed", 1.3, True), traj("g-mixed", 0.2, False)]
    kept = {on: {t.group_id for t in _curriculum(mined=0.0, drop_zero_variance=True,
                                                 on=on).observe(batch)}
            for on in ("reward", "success")}
    assert kept == {"reward": {"g-fail", "g-mixed"}, "success": {"g-mixed"}}
    with pytest.raises(ValueError, match="zero_variance_on"):
        group_signal(batch[0], "advantage")


# -- weighting: learnability --------------------------------------------------------------------

def _learnability(*, seed: int = 0, mined: float = 1.0, replay: float = 0.0,
                  min_samples: int = 1000, prior: float = 1.0,
                  floor: float = 0.01) -> Curriculum:
    return Curriculum(ARITH.sample_task, mined_fraction=mined, replay_fraction=replay,
                      mastery_threshold=0.75, mastery_min_samples=min_samples, seed=seed,
                      weighting="learnability", learnability_prior=prior,
                      learnability_floor=floor)


def _clustered(i: int, cluster: str | None, parent: str | None = None) -> Task:
    task = ARITH.make_task({"expr": f"{i}*{i + 2}-{i}"}, origin="generated", created_round=1,
                           parent_task_id=parent)
    task.target_cluster_id = cluster
    return task


def _observed(task: Task, successes: int, attempts: int, group: str) -> list[Trajectory]:
    return [_traj(group, float(k < successes), k < successes, task.task_id)
            for k in range(attempts)]


def _weights(rates: list[tuple[int, int]], prior: float = 1.0, floor: float = 0.01,
             ) -> list[float]:
    """p(1-p) + floor with p the Beta-posterior mean, written out independently of the code."""
    ps = [(s + prior) / (n + 2 * prior) for s, n in rates]
    return [p * (1 - p) + floor for p in ps]


def _chi_square(counts: list[int], weights: list[float]) -> float:
    total = sum(counts)
    expected = [total * w / sum(weights) for w in weights]
    return sum((c - e) ** 2 / e for c, e in zip(counts, expected, strict=True))


CHI2_DF2_P001 = 13.82  # the chi-square quantile at 0.999 with 2 degrees of freedom


@pytest.mark.parametrize(("prior", "floor"), [(1.0, 0.01), (1e-3, 0.05)])
def test_learnability_draws_mined_tasks_in_proportion_to_p_times_one_minus_p(
        prior: float, floor: float) -> None:
    """Pass rates 0.0, 0.5 and 1.0 (seen by `observe`, as training groups): one mined slot per
    batch is drawn with probability proportional to p(1-p) + floor, so the 0.5 task dominates
    and the others are still drawn now and then (with a weak prior, only thanks to the floor)."""
    cur = _learnability(seed=7, prior=prior, floor=floor)
    tasks = [_clustered(i, None) for i in (1, 2, 3)]
    cur.add_mined(tasks)
    rates = [(0, 40), (20, 40), (40, 40)]
    for task, (s, n) in zip(tasks, rates, strict=True):
        cur.observe(_observed(task, s, n, f"g-{task.task_id}"))
    draws = 3000
    counts = dict.fromkeys(_ids(tasks), 0)
    for _ in range(draws):
        (picked,) = cur.sample(1)
        counts[picked.task_id] += 1
    observed = [counts[t.task_id] for t in tasks]
    weights = _weights(rates, prior, floor)
    assert _chi_square(observed, weights) < CHI2_DF2_P001
    assert observed[1] > 0.7 * draws and min(observed) > 0.05 * draws  # 0.5 leads, none starves
    metrics = cur.metrics()
    assert metrics["curriculum/learnability_pool"] == pytest.approx(
        sum(w - floor for w in weights) / 3)
    last = _ids(tasks).index(picked.task_id)
    assert metrics["curriculum/learnability_mean"] == pytest.approx(weights[last] - floor)


def test_learnability_weighs_the_replay_share_too() -> None:
    cur = _learnability(seed=3, mined=0.0, replay=1.0)
    tasks = [_clustered(i, None) for i in (4, 5, 6)]
    rates = [(0, 40), (20, 40), (39, 40)]
    for task, (s, n) in zip(tasks, rates, strict=True):
        cur.tasks[task.task_id] = task  # a task the curriculum has handed out before
        cur.record(task.task_id, s, n)
    counts = dict.fromkeys(_ids(tasks), 0)
    for _ in range(3000):
        (picked,) = cur.sample(1)
        counts[picked.task_id] += 1
    observed = [counts[t.task_id] for t in tasks]
    assert _chi_square(observed, _weights(rates)) < CHI2_DF2_P001
    assert cur.metrics()["curriculum/replay_in_batch"] == 1.0


def test_learnability_draws_without_replacement_and_skips_mastered_tasks() -> None:
    cur = _learnability(seed=1, mined=1.0, min_samples=8)
    tasks = [_clustered(i, None) for i in range(1, 7)]
    cur.add_mined(tasks)
    cur.record(tasks[0].task_id, 8, 8)  # mastered
    for _ in range(50):
        batch = _ids(cur.sample(5))
        assert len(set(batch)) == 5
        assert set(batch) == set(_ids(tasks[1:]))  # the five unmastered ones, each once


def test_an_untried_task_inherits_its_generators_estimate_in_its_cluster() -> None:
    """Generators aiming at one cluster make tasks of different difficulty: an untried task
    takes the outcomes of its own generator's tasks of the cluster first; a generator with none
    tried yet takes the whole cluster's."""
    cur = _learnability(seed=3)
    made = {}
    for i, (name, gen) in enumerate([("restart", "restart"), ("fault", "fault"),
                                     ("new_restart", "restart"), ("new_fault", "fault"),
                                     ("new_mutate", "mutate")], start=1):
        made[name] = _clustered(i, "cl")
        made[name].generator = gen
    cur.add_mined(list(made.values()))
    cur.observe(_observed(made["restart"], 0, 8, "g1") + _observed(made["fault"], 6, 8, "g2"))
    assert cur.pass_rate_estimate(made["new_restart"].task_id) == pytest.approx(1 / 10)
    assert cur.pass_rate_estimate(made["new_fault"].task_id) == pytest.approx(7 / 10)
    assert cur.pass_rate_estimate(made["new_mutate"].task_id) == pytest.approx(7 / 18)
    assert set(cur.cluster_learnability()) == {"cl"}


def test_an_untried_task_inherits_its_clusters_estimate() -> None:
    """Never-tried tasks take the pooled outcomes of their cluster, else of their parent task,
    else the prior; so the untried sibling of a half-solved cluster is drawn far more often
    than the untried sibling of a never-solved one."""
    cur = _learnability(seed=11)
    half, zero = _clustered(1, "cl-half"), _clustered(2, "cl-zero")
    half_b = _clustered(3, "cl-half")
    new_half, new_zero = _clustered(4, "cl-half"), _clustered(5, "cl-zero")
    parent = ARITH.make_task({"expr": "7*8+9"})
    orphan = _clustered(6, "cl-new", parent=parent.task_id)
    unknown = _clustered(7, "cl-other", parent="no-such-task")
    cur.add_mined([half, zero, half_b, new_half, new_zero, orphan, unknown])
    cur.observe(_observed(half, 6, 8, "g1") + _observed(half_b, 0, 8, "g2")
                + _observed(zero, 0, 16, "g3") + _observed(parent, 2, 8, "g4"))
    assert cur.pass_rate_estimate(new_half.task_id) == pytest.approx((6 + 1) / (16 + 2))
    assert cur.pass_rate_estimate(new_zero.task_id) == pytest.approx(1 / 18)
    assert cur.pass_rate_estimate(orphan.task_id) == pytest.approx(3 / 10)  # the parent's
    assert cur.pass_rate_estimate(unknown.task_id) == 0.5  # the prior
    assert cur.pass_rate_estimate(half.task_id) == pytest.approx(7 / 10)  # its own
    learn = cur.cluster_learnability()
    assert set(learn) == {"cl-half", "cl-zero", "cl-new", "cl-other"}
    assert learn["cl-half"] == pytest.approx(7 / 18 * 11 / 18)
    assert learn["cl-zero"] == pytest.approx(1 / 18 * 17 / 18)
    assert learn["cl-new"] == learn["cl-other"] == 0.25  # nothing observed: the prior
    pair = Curriculum(ARITH.sample_task, mined_fraction=1.0, replay_fraction=0.0,
                      mastery_threshold=0.75, mastery_min_samples=1000, seed=5,
                      weighting="learnability")
    pair.add_mined([half, zero, new_half, new_zero])
    pair.record(half.task_id, 8, 16)
    pair.record(zero.task_id, 0, 16)
    pair.mined = [new_half.task_id, new_zero.task_id]  # draw among the untried two only
    counts = {new_half.task_id: 0, new_zero.task_id: 0}
    for _ in range(2000):
        counts[pair.sample(1)[0].task_id] += 1
    ratio = counts[new_half.task_id] / counts[new_zero.task_id]
    expected = (0.25 + 0.01) / (1 / 18 * 17 / 18 + 0.01)  # about 4.0
    assert expected * 0.8 < ratio < expected * 1.25


def test_learnability_state_round_trip_samples_the_same_batches() -> None:
    def run(cur: Curriculum, batches: int) -> list[list[str]]:
        out = []
        for b in range(batches):
            tasks = cur.sample(6)
            out.append(_ids(tasks))
            for i, task in enumerate(tasks):
                cur.record(task.task_id, (i + b) % 3, 3)
        return out

    def fresh(seed: int) -> Curriculum:
        cur = _learnability(seed=seed, mined=0.5, replay=0.34, min_samples=9)
        mined = [_clustered(i, f"cl-{i % 3}") for i in range(1, 13)]
        cur.add_mined(mined)
        return cur

    uninterrupted = fresh(2)
    expected = run(uninterrupted, 6)
    interrupted = fresh(2)
    first = run(interrupted, 3)
    restored = fresh(999)
    restored.load_state_dict(json.loads(json.dumps(interrupted.state_dict())))
    assert first + run(restored, 3) == expected
    assert restored.cluster_learnability() == uninterrupted.cluster_learnability()
    assert fresh(3).sample(6) != fresh(2).sample(6)  # the seed matters, so the check is not empty


def test_newest_reports_no_learnability_metrics() -> None:
    cur = _curriculum()
    cur.add_mined(_generated(3))
    cur.sample(4)
    assert not any("learnability" in k for k in cur.metrics())


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"weighting": "oldest"}, "curriculum.weighting"),
    ({"learnability_prior": 0.0}, "curriculum.learnability_prior"),
    ({"learnability_floor": -0.1}, "curriculum.learnability_floor"),
    ({"learnability_floor": 0.0}, "curriculum.learnability_floor"),
])
def test_bad_learnability_settings_name_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        Curriculum(ARITH.sample_task, mined_fraction=0.5, replay_fraction=0.0,
                   mastery_threshold=0.9, mastery_min_samples=8, seed=0, **kwargs)


@pytest.mark.parametrize(("override", "key"), [
    ("curriculum.weighting=plr", "curriculum.weighting"),
    ("curriculum.learnability_prior=0", "curriculum.learnability_prior"),
    ("curriculum.learnability_floor=0", "curriculum.learnability_floor"),
    ("curriculum.learnability_floor=lots", "curriculum.learnability_floor"),
])
def test_bad_learnability_config_names_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        load_config(data={}, overrides=[override])


def test_from_config_passes_the_learnability_keys() -> None:
    config = load_config(data={}, overrides=["curriculum.weighting=learnability",
                                             "curriculum.learnability_prior=2.5",
                                             "curriculum.learnability_floor=0.05"])
    cur = Curriculum.from_config(config.curriculum, ARITH.sample_task, seed=0, excluded_ids=set())
    assert (cur.weighting, cur.prior, cur.floor) == ("learnability", 2.5, 0.05)
    assert Curriculum.from_config(load_config(data={}).curriculum, ARITH.sample_task, seed=0,
                                  excluded_ids=set()).weighting == "newest"


# -- balance_skills ------------------------------------------------------------------------------

def _typed(i: int, fault: str | None) -> Task:
    task = ARITH.make_task({"expr": f"{i}*{i + 3}+{i}"}, origin="generated", created_round=1)
    if fault is not None:
        task.skills = [*task.skills, f"recover:{fault}"]
    return task


@pytest.mark.parametrize("weighting", ["newest", "learnability"])
def test_balance_skills_deals_the_mined_share_evenly_over_fault_types(weighting: str) -> None:
    """Twenty rate-limit tasks, two notation tasks and two tasks with no fault skill are mined;
    eight mined slots: without balancing the rate-limit tasks take (nearly) all of them, with
    `balance_skills: recover` each stratum gets its even share, capped by its size, and the
    slots a small stratum cannot use go to the others."""
    tasks = ([_typed(i, "notation") for i in range(21, 23)]
             + [_typed(i, None) for i in range(23, 25)]
             + [_typed(i, "rate_limit") for i in range(1, 21)])  # the newest

    def counts(balance: str | None, seed: int) -> dict[str, int]:
        cur = Curriculum(ARITH.sample_task, mined_fraction=0.5, replay_fraction=0.0,
                         mastery_threshold=0.75, mastery_min_samples=1000, seed=seed,
                         weighting=weighting, balance_skills=balance)
        cur.add_mined(tasks)
        batch = cur.sample(16)
        assert cur.metrics()["curriculum/mined_in_batch"] == 8
        mined = [t for t in batch if t.origin == "generated"]
        out: dict[str, int] = {}
        for t in mined:
            key = next((s for s in t.skills if s.startswith("recover:")), "none")
            out[key] = out.get(key, 0) + 1
        return out

    for seed in range(5):
        assert counts("recover", seed) == {"recover:rate_limit": 4, "recover:notation": 2,
                                            "none": 2}
    unbalanced = counts(None, 0)
    assert unbalanced.get("recover:rate_limit", 0) >= 6


def test_balance_skills_keeps_learnability_within_a_stratum() -> None:
    """Within one stratum the learnability draw still decides: of two rate-limit tasks seen at
    0/40 and 20/40, the one slot the stratum gets goes to the 20/40 task with probability
    0.26 / (0.26 + 0.033) = 0.89 (p(1-p) + floor), not 0.5."""
    cur = Curriculum(ARITH.sample_task, mined_fraction=1.0, replay_fraction=0.0,
                     mastery_threshold=0.99, mastery_min_samples=1000, seed=0,
                     weighting="learnability", balance_skills="recover")
    hard, mid, other = _typed(1, "rate_limit"), _typed(2, "rate_limit"), _typed(3, "timeout")
    cur.add_mined([hard, mid, other])
    cur.observe(_observed(hard, 0, 40, "g1") + _observed(mid, 20, 40, "g2"))
    picks = [_ids(cur.sample(2)) for _ in range(200)]
    assert all(other.task_id in p for p in picks)
    share_mid = sum(mid.task_id in p for p in picks) / len(picks)
    assert share_mid > 0.8


def test_balance_skills_config_key() -> None:
    config = load_config(data={}, overrides=["curriculum.balance_skills=recover"])
    cur = Curriculum.from_config(config.curriculum, ARITH.sample_task, seed=0, excluded_ids=set())
    assert cur.balance_skills == "recover"
    assert load_config(data={}).curriculum.balance_skills is None
    for bad in ("''", "'recover:'"):
        with pytest.raises(ConfigError, match=r"config key 'curriculum\.balance_skills'"):
            load_config(data={}, overrides=[f"curriculum.balance_skills={bad}"])
