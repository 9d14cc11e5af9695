"""The command line answers fast (no torch at import) and fails clearly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


# `sentinel --help` run as `python -m sentinel` does, then what it imported.
HELP_THEN_MODULES = """
import runpy, sys
sys.argv = ["sentinel", "--help"]
try:
    runpy.run_module("sentinel", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
print("EXIT", code or 0, "torch" in sys.modules, "transformers" in sys.modules)
"""


def test_help_lists_the_commands_without_importing_torch() -> None:
    """What keeps `--help` fast (benchmarks/cli_startup.py measures it): no torch, no
    transformers on the way to the help text."""
    proc = _run("-m", "sentinel", "--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("loop", "sql", "status"):
        assert command in proc.stdout
    assert "failure-driven curriculum" in proc.stdout
    proc = _run("-c", HELP_THEN_MODULES)
    assert proc.returncode == 0, proc.stderr
    assert "failure-driven curriculum" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "EXIT 0 False False"


def test_cli_module_does_not_import_torch() -> None:
    script = ("import sys, sentinel.cli; "
              "print('torch' in sys.modules, 'transformers' in sys.modules, "
              "'duckdb' in sys.modules)")
    proc = _run("-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False", "False"]


def test_sql_on_missing_run_dir_fails_clearly(tmp_path: Path) -> None:
    run_dir = tmp_path / "no-such-run"
    proc = _run("-m", "sentinel", "sql", "SELECT 1", "--run-dir", str(run_dir))
    assert proc.returncode == 2
    assert "error: no store at" in proc.stderr
    assert str(run_dir / "sentinel.duckdb") in proc.stderr
    assert "sentinel loop" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists()  # a failed query does not create the run directory


def test_status_on_missing_run_dir_fails_clearly(tmp_path: Path) -> None:
    proc = _run("-m", "sentinel", "status", "--run-dir", str(tmp_path / "nothing"))
    assert proc.returncode == 2
    assert "error: no store at" in proc.stderr and "Traceback" not in proc.stderr


def test_loop_with_a_bad_config_names_the_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("rounds: 1\ngrpo: {lrr: 1}\n")
    proc = _run("-m", "sentinel", "loop", "--config", str(config),
                   "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "unknown config key 'grpo.lrr'" in proc.stderr
    assert "Traceback" not in proc.stderr
