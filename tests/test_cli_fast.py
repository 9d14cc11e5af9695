"""The command line answers fast (no torch at import) and fails clearly."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    return proc, time.perf_counter() - start


def test_help_is_fast() -> None:
    proc, seconds = _run("-m", "sentinel", "--help")
    assert proc.returncode == 0, proc.stderr
    assert seconds < 3.0
    for command in ("loop", "sql", "status"):
        assert command in proc.stdout
    assert "failure-driven curriculum" in proc.stdout


def test_cli_module_does_not_import_torch() -> None:
    script = ("import sys, sentinel.cli; "
              "print('torch' in sys.modules, 'transformers' in sys.modules, "
              "'duckdb' in sys.modules)")
    proc, _ = _run("-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False", "False"]


def test_sql_on_missing_run_dir_fails_clearly(tmp_path: Path) -> None:
    run_dir = tmp_path / "no-such-run"
    proc, _ = _run("-m", "sentinel", "sql", "SELECT 1", "--run-dir", str(run_dir))
    assert proc.returncode == 2
    assert "error: no store at" in proc.stderr
    assert str(run_dir / "sentinel.duckdb") in proc.stderr
    assert "sentinel loop" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists()  # a failed query does not create the run directory


def test_status_on_missing_run_dir_fails_clearly(tmp_path: Path) -> None:
    proc, _ = _run("-m", "sentinel", "status", "--run-dir", str(tmp_path / "nothing"))
    assert proc.returncode == 2
    assert "error: no store at" in proc.stderr and "Traceback" not in proc.stderr


def test_loop_with_a_bad_config_names_the_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("rounds: 1\ngrpo: {lrr: 1}\n")
    proc, _ = _run("-m", "sentinel", "loop", "--config", str(config),
                   "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "unknown config key 'grpo.lrr'" in proc.stderr
    assert "Traceback" not in proc.stderr
