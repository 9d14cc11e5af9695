"""Crash and resume: the loop is killed with SIGKILL at exact points (the `SENTINEL_FAULT_AT` hook
of sentinel.loop.fault_point), resumed with `sentinel loop --resume`, and compared with an
uninterrupted run of the same config: same rounds, no lost or doubled rows, the same tasks sampled
in every round, the same held-out results, and checkpoints consistent with the store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from task_store import Store

pytestmark = pytest.mark.slow

CONFIG = {
    "seed": 5,
    "rounds": 2,
    "policy": {"tiny": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                        "num_attention_heads": 4}},
    "families": [{"type": "arith", "max_operands": 3, "instruction": ""}],
    "env": {"max_turns": 3, "max_tokens": 160, "max_turn_tokens": 24},
    "sft": {"steps": 8, "batch_size": 8, "num_examples": 16},
    "batch": {"steps_per_round": 2, "tasks_per_step": 3, "group_size": 2},
    "eval": {"num_tasks": 3, "samples": 1, "greedy": False},
    "generators": [{"type": "mutate", "per_failure": 1}],
}


def loop(run_dir: Path, config: Path | None, *args: str,
         fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SENTINEL_FAULT_AT"}
    if fault:
        env["SENTINEL_FAULT_AT"] = fault
    cmd = [sys.executable, "-m", "sentinel", "loop", "--run-dir", str(run_dir), *args]
    if config is not None:
        cmd += ["--config", str(config)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def fingerprint(run_dir: Path) -> dict:
    store = Store(run_dir / "sentinel.duckdb")
    q = lambda sql: store.query(sql)[1]  # noqa: E731
    return {
        "rounds": [r[0] for r in q("SELECT round FROM rounds ORDER BY round")],
        "train_tasks": q("SELECT round, list(task_id ORDER BY group_id, sample_idx) "
                         "FROM trajectories WHERE split = 'train' GROUP BY round ORDER BY round"),
        "train_success": q("SELECT round, list(success ORDER BY group_id, sample_idx) "
                           "FROM trajectories WHERE split = 'train' GROUP BY round ORDER BY round"),
        "heldout": q("SELECT round, heldout_success FROM rounds ORDER BY round"),
        "generated": q("SELECT created_round, list(task_id ORDER BY task_id) FROM tasks "
                       "WHERE origin = 'generated' GROUP BY ALL ORDER BY 1"),
        "failures": q("SELECT round, count(*) FROM failures GROUP BY round ORDER BY round"),
    }


def assert_no_duplicates(run_dir: Path) -> None:
    store = Store(run_dir / "sentinel.duckdb")
    for table, key in [("trajectories", "traj_id"), ("failures", "failure_id"),
                       ("tasks", "task_id"), ("rounds", "round"),
                       ("steps", "traj_id || '/' || step"), ("evals", "round || '/' || task_id")]:
        (n, distinct), = store.query(f"SELECT count(*), count(DISTINCT {key}) FROM {table}")[1]
        assert n == distinct, f"{table} has doubled rows"


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "resume.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory, config_file) -> dict:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    out = loop(run_dir, config_file)
    assert out.returncode == 0, out.stderr[-2000:]
    return fingerprint(run_dir)


@pytest.mark.parametrize("fault", ["rollout:2", "train:1", "checkpoint:2", "commit:1",
                                   "in_commit:2"])
def test_killed_run_resumes_exactly(tmp_path, config_file, reference, fault):
    killed = loop(tmp_path, config_file, fault=fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    crashed_round = int(fault.split(":")[1])
    committed = Store(tmp_path / "sentinel.duckdb").completed_rounds()
    assert committed == list(range(crashed_round)), "the interrupted round must not be committed"

    resumed = loop(tmp_path, None, "--resume")  # config comes from the store
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming" in resumed.stdout
    assert_no_duplicates(tmp_path)
    assert fingerprint(tmp_path) == reference
    # Checkpoints: the last committed round's, nothing newer, nothing half-written.
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == [f"round-{CONFIG['rounds']}.pt"]


def test_failure_inside_the_commit_stores_nothing_and_resumes(tmp_path, config_file, reference):
    failed = loop(tmp_path, config_file, fault="disk_full:2")
    assert failed.returncode not in (0, -signal.SIGKILL)
    assert "No space left on device" in failed.stderr
    assert Store(tmp_path / "sentinel.duckdb").completed_rounds() == [0, 1]
    assert_no_duplicates(tmp_path)
    resumed = loop(tmp_path, None, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert fingerprint(tmp_path) == reference


def test_resume_of_a_finished_run_adds_nothing(tmp_path, config_file):
    assert loop(tmp_path, config_file).returncode == 0
    before = fingerprint(tmp_path)
    again = loop(tmp_path, None, "--resume")
    assert again.returncode == 0, again.stderr[-2000:]
    assert fingerprint(tmp_path) == before


def test_second_loop_without_resume_is_refused(tmp_path, config_file):
    assert loop(tmp_path, config_file, fault="rollout:1").returncode == -signal.SIGKILL
    out = loop(tmp_path, config_file)
    assert out.returncode == 2
    assert "--resume" in out.stderr
    assert json.loads(json.dumps(Store(tmp_path / "sentinel.duckdb").completed_rounds())) == [0]
