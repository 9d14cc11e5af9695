"""The curriculum: mined first (newest first), replay, base draws; held-out and mastered tasks
skipped; state round trip."""

from __future__ import annotations

import json
import random

import pytest

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
