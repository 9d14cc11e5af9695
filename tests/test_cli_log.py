"""The CLI read from a pipe or a log: tables are not cut to 80 columns, `| head` ends quietly,
`--help` shows flags as flags."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sentinel.cli import app
from tests.test_report import synth_store

ROOT = Path(__file__).resolve().parents[1]
# What a log or a pipe gives: no terminal, and no width from the environment either.
PIPE_ENV = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("log")
    synth_store(path / "sentinel.duckdb", rounds=3)
    return path


def sentinel(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sentinel", *args], cwd=ROOT, env=PIPE_ENV,
                          capture_output=True, text=True, timeout=120)


def test_status_in_a_pipe_is_not_cut(run_dir: Path) -> None:
    proc = sentinel("status", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    assert "generated (proposed/accepted/rejected)" in proc.stdout
    # One line per round: every metric of round 1 is on the line that starts with it.
    row = next(line for line in proc.stdout.splitlines() if line.startswith("│ 1 "))
    for key in ("loss=", "kl=", "clip_ratio=", "entropy=", "grad_norm="):
        assert key in row, row


def test_sql_table_in_a_pipe_is_not_cut(run_dir: Path) -> None:
    proc = sentinel("sql", "--run-dir", str(run_dir),
                    "SELECT repeat('x', 150) AS long_text, traj_id, messages FROM trajectories "
                    "ORDER BY traj_id LIMIT 2")
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    assert "x" * 150 in proc.stdout and "long_text" in proc.stdout
    assert '"role": "assistant"' in proc.stdout


@pytest.mark.parametrize("args", [("--format", "csv"), ("--format", "table")])
def test_output_cut_short_by_the_reader_ends_quietly(run_dir: Path, args: tuple[str, ...]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "sql", "--run-dir", str(run_dir),
         "SELECT range AS n, repeat('y', 40) AS pad FROM range(100000)", *args],
        cwd=ROOT, env=PIPE_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()  # what `| head -1` reads, then it exits
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert first.strip() and err == ""


@pytest.mark.parametrize("command", ["loop", "status", "sql", "export", "report"])
def test_help_shows_flags_without_a_value(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    assert "--help" in result.output and "--run-dir" in result.output
