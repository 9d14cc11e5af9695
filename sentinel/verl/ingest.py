"""`sentinel ingest verl-rollouts DIR --run-dir RUN`: veRL's rollout dumps into the store.

With `trainer.rollout_data_dir` set, veRL writes one JSONL file per training step,
`<global_step>.jsonl`, one line per sample: `input`, `output`, `gts`, `score`, `step` and each
`reward_extra_info` key (veRL 0.9.1's `RayPPOTrainer._write_generations`). With Sentinel's
`compute_score` those keys include `task_id` and `sentinel`, the record of the scored episode
(task row, family config, steps, tokens, terms).

`ingest_dump` turns the steps of DIR not ingested before into ONE committed round of the run's
store: the tasks, the trajectories (split `train`; a group is one task's samples within one
step), their steps, and the failures and clusters `FailureAnalyzer` mines from them, so
`sentinel sql`, `sentinel status` and the failure views work on a veRL run. The round's
`metrics.verl_dump` says which directory and steps it holds; a later ingest of the same
directory (a job still running) takes only the newer steps, and a file whose last line is not
complete yet (veRL writing it) waits for the next ingest. A store that does not exist is created.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sentinel.tasks.base import TaskFamily
from sentinel.types import Task, Trajectory, new_id
from sentinel.verl.episode import trajectory_from_record

DUMP_KEYS = ("task_id", "sentinel")


class IngestError(RuntimeError):
    """A dump that cannot be ingested; the message says why and what to change."""


def read_dump_file(path: Path) -> list[dict[str, Any]] | None:
    """The lines of one step's dump; None while the file is still being written."""
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def dump_steps(dump_dir: Path) -> dict[int, Path]:
    """`{global step: file}` of the dump directory (veRL names each file `<step>.jsonl`)."""
    if not dump_dir.is_dir():
        raise IngestError(f"no rollout dump directory at {dump_dir}")
    return {int(p.stem): p for p in sorted(dump_dir.glob("*.jsonl")) if p.stem.isdigit()}


def _ingested_steps(store: Any, dump_dir: Path) -> set[int]:
    _, rows = store.query("SELECT metrics FROM rounds")
    done: set[int] = set()
    for (metrics,) in rows:
        dump = json.loads(metrics or "{}").get("verl_dump")
        if dump and dump.get("dir") == str(dump_dir):
            done |= set(dump.get("steps", []))
    return done


@dataclass
class DumpRound:
    """What a dump holds, as Sentinel records: tasks by id, scored trajectories, the families
    that run them, and the veRL steps read."""

    tasks: dict[str, Task] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list)
    families: dict[str, TaskFamily] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)


def read_dump(dump_dir: str | Path, round_: int, *, skip: set[int] | None = None) -> DumpRound:
    """The complete step files of `dump_dir` (less the steps in `skip`) as round `round_`'s
    training trajectories."""
    from sentinel.verl.version import family_for

    dump_dir = Path(dump_dir)
    files = {s: p for s, p in dump_steps(dump_dir).items() if s not in (skip or set())}
    out = DumpRound()
    counters: dict[str, int] = defaultdict(int)
    for step, file in sorted(files.items()):
        rows = read_dump_file(file)
        if rows is None:
            continue
        out.steps.append(step)
        for n, row in enumerate(rows):
            missing = [k for k in DUMP_KEYS if k not in row]
            if missing:
                raise IngestError(
                    f"{file} line {n + 1} has no {', '.join(missing)}: the dump holds no "
                    "Sentinel record. Train with reward.custom_reward_function.path="
                    "pkg://sentinel.verl.reward and trainer.use_v1=false (veRL 0.9.1's v1 "
                    "trainer dumps no reward_extra_info)")
            stored = json.loads(row["sentinel"])
            task = Task.from_row(stored["task"])
            if task.task_id != row["task_id"]:
                raise IngestError(f"{file} line {n + 1}: task_id {row['task_id']} but its "
                                  f"record holds {task.task_id}")
            out.tasks.setdefault(task.task_id, task)
            out.families[task.family] = family_for(task.family, stored["family_config"])
            group = f"verl-s{step}-{task.task_id}"
            traj = trajectory_from_record(stored["episode"], round=round_, split="train",
                                          group_id=group, sample_idx=counters[group])
            counters[group] += 1
            traj.reward, traj.reward_terms = float(stored["reward"]), dict(stored["terms"])
            traj.success = bool(stored["success"])
            out.trajectories.append(traj)
    return out


def ingest_dump(dump_dir: str | Path, run_dir: str | Path) -> str:
    """Ingest the new steps of `dump_dir` into `<run_dir>/sentinel.duckdb` as the next round;
    returns a one-line summary."""
    from sentinel.analyzer import FailureAnalyzer
    from sentinel.record import RoundRecord
    from task_store import Store
    from task_store.store import DB_FILENAME

    dump_dir = Path(dump_dir).resolve()
    path = Path(run_dir) / DB_FILENAME
    store = (Store(path) if path.exists() else
             Store.create(path, run_id=new_id("run"),
                          config={"trainer": {"backend": "verl"}, "source": str(dump_dir)}))
    done = _ingested_steps(store, dump_dir)
    completed = store.completed_rounds()
    round_ = completed[-1] + 1 if completed else 0
    dump = read_dump(dump_dir, round_, skip=done)
    if not dump.steps:
        return f"nothing new in {dump_dir} (steps already ingested: {len(done)})"

    record = RoundRecord(round=round_, tasks=dump.tasks, trajectories=dump.trajectories)
    record.failures, record.clusters = FailureAnalyzer(dump.families).analyze(
        record.trajectories, record.tasks, round_)
    record.metrics["verl_steps"] = float(len(dump.steps))
    row = record.row()
    row["metrics"]["verl_dump"] = {"dir": str(dump_dir), "steps": dump.steps}
    store.record_round(
        round_, row, tasks=[t.to_row() for t in record.tasks.values()],
        trajectories=[t.to_row() for t in record.trajectories],
        steps=[s.to_row(t.traj_id) for t in record.trajectories for s in t.steps],
        failures=[f.to_row() for f in record.failures], clusters=record.clusters)
    return (f"round {round_}: {len(record.trajectories)} rollouts of {len(record.tasks)} tasks "
            f"from veRL steps {dump.steps[0]}..{dump.steps[-1]}, {len(record.failures)} "
            f"failures; store: {path}")
