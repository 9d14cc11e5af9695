"""The run directory and the loop's side effects: constructing a `Loop` writes nothing, a run
writes its `runs` row once, `--resume` adds none, a finished run resumed is left byte for byte,
a second run in the same directory is refused; checkpoints are pruned and uncommitted ones
discarded; phase timings are exclusive."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from sentinel.config import load_config
from sentinel.loop import Loop, LoopError
from sentinel.record import RoundRecord
from sentinel.run_dir import RunDir
from sentinel.types import Rejection
from task_store import Store

FAST = {
    "seed": 0,
    "rounds": 0,
    "policy": {"tiny": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                        "num_attention_heads": 4}},
    "sft": {"enabled": False},
    "eval": {"num_tasks": 4, "samples": 1, "greedy": False},
    "env": {"max_turns": 2, "max_tokens": 64, "max_turn_tokens": 16},
    "generators": [],
}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_constructing_a_loop_writes_no_store(tmp_path: Path) -> None:
    Loop(load_config(data=FAST), tmp_path / "run")
    Loop(load_config(data=FAST), tmp_path / "run")
    assert not (tmp_path / "run" / "sentinel.duckdb").exists()


def test_one_runs_row_a_refused_second_run_and_a_no_op_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    Loop(load_config(data=FAST), run).run()
    store = Store(run)
    assert len(store.run_ids()) == 1 and store.completed_rounds() == [0]
    before = _digest(store.path)
    other = load_config(data={**FAST, "seed": 1})
    with pytest.raises(LoopError, match="already holds a run"):
        Loop(other, run).run()
    assert _digest(store.path) == before
    # Resuming a finished run does nothing: no row, no round, the file unchanged.
    assert Loop(load_config(data=FAST), run).run(resume=True) == []
    assert _digest(store.path) == before
    assert len(store.run_ids()) == 1


def test_resume_adds_no_runs_row(tmp_path: Path) -> None:
    run = tmp_path / "run"
    Loop(load_config(data=FAST), run).run()
    longer = load_config(data={**FAST, "rounds": 1, "batch": {
        "steps_per_round": 1, "tasks_per_step": 2, "group_size": 2}})
    Loop(longer, run).run(resume=True)
    store = Store(run)
    assert store.completed_rounds() == [0, 1]
    assert len(store.run_ids()) == 1


def test_checkpoints_pruned_and_uncommitted_ones_discarded(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    for r in range(4):
        path = rd.checkpoint_path(r)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    (rd.checkpoint_path(3).parent / "round-4.pt.tmp").write_bytes(b"half")
    rd.prune_checkpoints(keep=2)
    rd.discard_uncommitted(2)
    assert sorted(p.name for p in rd.checkpoint_path(0).parent.iterdir()) == ["round-2.pt"]


def test_phase_timings_are_exclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 2.0, 7.0, 8.0])  # generate starts, probe starts, probe ends, generate ends
    monkeypatch.setattr("sentinel.record.time.perf_counter", lambda: next(clock))
    record = RoundRecord(round=1)
    with record.timed("generate"), record.timed("probe"):
        pass
    # generate's own 3 s only: the probe's 5 s inside it are not counted again.
    assert dict(record.timings) == {"probe": 5.0, "generate": 3.0}


def test_same_seed_same_store(tmp_path: Path) -> None:
    """A run is reproducible on one machine for a given seed with one torch thread: two runs of
    one config store the same trajectories, rewards and evals. (With several threads, float
    sums vary from run to run under load; README, "Reproducibility".)"""
    cfg = {**FAST, "rounds": 1, "batch": {"steps_per_round": 1, "tasks_per_step": 2,
                                          "group_size": 2}}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = []
        for name in ("a", "b"):
            Loop(load_config(data=cfg), tmp_path / name).run()
            _, got = Store(tmp_path / name).query(
                "SELECT round, split, task_id, sample_idx, token_ids, messages, reward, success "
                "FROM trajectories ORDER BY ALL")
            rows.append(got)
        _, recorded = Store(tmp_path / "a").query(
            "SELECT DISTINCT CAST(metrics->>'torch_threads' AS INTEGER) FROM rounds")
    finally:
        torch.set_num_threads(threads)
    assert rows[0] == rows[1] and len(rows[0]) > 0
    assert recorded == [(1,)]


def test_a_generator_timeout_is_warned_about_in_the_round_line() -> None:
    record = RoundRecord(round=1, metrics={"heldout_success": 0.5})
    record.generated = {"slow": {"proposed": 1, "accepted": 0, "rejected": 1, "errors": 1}}
    assert "time_limit_s" not in record.summary(record.row())
    record.rejections.append(Rejection(round=1, generator="slow", family="", spec="null",
                                       reason="generator_timeout", detail="stopped"))
    assert "time_limit_s" in record.summary(record.row())


def test_a_redirected_run_prints_a_plain_line_when_each_phase_starts_and_ends(
        tmp_path: Path) -> None:
    """Issue #20 §4: in a log (not a terminal) every phase shows as plain lines, no bar."""
    import io

    from rich.console import Console

    out = io.StringIO()
    cfg = load_config(data={**FAST, "sft": {"enabled": True, "steps": 2, "num_examples": 4}})
    Loop(cfg, tmp_path / "run", console=Console(file=out, width=200)).run()
    lines = out.getvalue().splitlines()
    for label, total in (("SFT cold start", 2), ("round 0 held-out eval", 4)):
        assert f"{label}: {total} to do" in lines
        assert any(line.startswith(f"{label}: {total}/{total} in ") for line in lines)
    assert "\r" not in out.getvalue() and "━" not in out.getvalue()
