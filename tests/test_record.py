"""`RoundRecord.add_eval`: held-out recovery per fault type in the round's metrics and line,
the same numbers the store's `recovery_rates` view gives for the stored round."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel.record import RoundRecord
from sentinel.types import Task, Trajectory
from task_store import Store


def eval_task(n: int, *skills: str) -> Task:
    return Task(family="arith", spec={"n": n}, prompt=[{"role": "user", "content": f"{n}+1"}],
                answer=str(n + 1), skills=sorted(["op:add", *skills]), origin="eval")


def rollouts(task: Task, outcomes: list[bool], *, greedy: bool = False) -> list[Trajectory]:
    group = f"r2{'greedy' if greedy else 'eval'}-{task.spec['n']}"
    return [Trajectory(task_id=task.task_id, messages=[], token_ids=[1], loss_mask=[1],
                       logprobs=[0.0], steps=[], finish_reason="answer", success=ok, round=2,
                       split="eval", group_id=group, sample_idx=i)
            for i, ok in enumerate(outcomes)]


TIMEOUT_1 = eval_task(1, "recover:timeout")
TIMEOUT_2 = eval_task(2, "recover:timeout")
RENAMED = eval_task(3, "recover:renamed")
BOTH = eval_task(4, "recover:notation", "recover:timeout")
CLEAN = eval_task(5)
SAMPLED = [(TIMEOUT_1, [True, False, False, False]), (TIMEOUT_2, [True, True]),
           (RENAMED, [False, False, False, False]), (BOTH, [True, True, False, False]),
           (CLEAN, [True, True, True, True])]


def recorded() -> RoundRecord:
    record = RoundRecord(round=2)
    tasks = [task for task, _ in SAMPLED]
    record.add_eval(tasks, [t for task, o in SAMPLED for t in rollouts(task, o)],
                    [t for task in tasks for t in rollouts(task, [True], greedy=True)])
    return record


def test_add_eval_puts_recovery_per_fault_type_and_its_mean_in_the_metrics() -> None:
    metrics = recorded().row()["metrics"]
    recovery = {k: v for k, v in metrics.items() if k.startswith("recovery/")}
    # timeout: 1 of 4 + 2 of 2 + 2 of 4 (BOTH carries it too) = 5 of 10 (pooled over samples,
    # not a mean of task rates); renamed 0 of 4; notation: BOTH's 2 of 4.
    # The mean weighs each type once: (1/2 + 0 + 1/2) / 3. The clean task counts for none.
    assert recovery == {"recovery/timeout": 0.5, "recovery/renamed": 0.0,
                        "recovery/notation": 0.5, "recovery/mean": pytest.approx(1 / 3)}


def test_round_line_shows_the_mean_then_each_fault_type() -> None:
    record = recorded()
    line = record.summary(record.row())
    assert "recovery 0.333 (notation 0.50 renamed 0.00 timeout 0.50)" in line


def test_no_fault_task_no_recovery() -> None:
    record = RoundRecord(round=0)
    record.add_eval([CLEAN], rollouts(CLEAN, [True, False]), [])
    assert not [k for k in record.row()["metrics"] if k.startswith("recovery/")]
    assert "recovery" not in record.summary(record.row())


def test_stored_round_gives_the_same_rates_in_the_view(tmp_path: Path) -> None:
    record = recorded()
    row = record.row()
    store = Store.create(tmp_path / "sentinel.duckdb", "run", {})
    store.record_round(2, row, tasks=[t.to_row() for t in record.tasks.values()],
                       trajectories=[t.to_row() for t in record.trajectories],
                       evals=record.evals)
    _, rates = store.query("SELECT fault_type, recovery_rate, greedy_rate FROM recovery_rates "
                           "WHERE split = 'eval' AND round = 2")
    per_type = {k: v for k, v in row["metrics"].items()
                if k.startswith("recovery/") and k != "recovery/mean"}
    assert {f"recovery/{fault}": rate for fault, rate, _ in rates} == per_type
    assert all(greedy == 1.0 for _, _, greedy in rates)
    _, stored = store.query("SELECT metrics->>'recovery/mean' FROM rounds WHERE round = 2")
    assert float(stored[0][0]) == pytest.approx(1 / 3)
