"""Bad input to the CLI is one clear line (rc 2), never a traceback, and leaves nothing behind:
a config file that is empty, a `policy.model` that cannot be loaded, a file that is not a store,
and `--run-dir` given the store file instead of its directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml
from typer.testing import CliRunner

from sentinel.cli import app
from sentinel.config import ConfigError, load_config
from sentinel.loop import Loop, LoopError
from task_store import Store
from tests.test_store import full_round, round_row

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "rounds": 1,
    "policy": {"tiny": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                        "num_attention_heads": 2}},
    "families": [{"type": "arith", "max_operands": 2}],
    "sft": {"steps": 1, "batch_size": 2, "num_examples": 2},
    "batch": {"steps_per_round": 1, "tasks_per_step": 2, "group_size": 2},
    "eval": {"num_tasks": 2, "samples": 1},
    "generators": [],
}


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def test_an_empty_config_file_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here yet\n")
    with pytest.raises(ConfigError, match=r"empty\.yaml is empty"):
        load_config(empty)
    result = cli("loop", "--config", str(empty), "--run-dir", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output
    assert "is empty" in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("model", ["no/such/model/here", "nobody-xyz/no-such-model",
                                   "a-directory-without-config"])
def test_an_unloadable_policy_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub is never asked: only the cache is
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-directory-without-config").mkdir()
    cfg = load_config(data={**TINY, "policy": {**TINY["policy"], "model": model}})
    run_dir = tmp_path / "run"
    with pytest.raises(LoopError, match=r"^policy\.model") as info:
        Loop(cfg, run_dir).run()
    assert model in str(info.value) or "config.json" in str(info.value)
    assert list(run_dir.iterdir()) == []  # no store, no policy, no log


def test_the_cli_names_policy_model_and_does_not_advise_resume(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**TINY, "policy": {"model": "nobody-xyz/no-such-model"}}))
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "sentinel", "loop", "--config", str(config), "--run-dir",
         str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: policy.model"), proc.stderr
    assert "nobody-xyz/no-such-model" in lines[0] and "cache" in lines[0]
    assert "--resume" not in proc.stderr
    assert not (run_dir / "sentinel.duckdb").exists()


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run directories whose `sentinel.duckdb` is: text, a DuckDB file without Sentinel's
    schema, and a real store (two rounds)."""
    base = tmp_path_factory.mktemp("stores")
    (base / "text").mkdir()
    (base / "text" / "sentinel.duckdb").write_text("hello, I am not a database\n")
    (base / "foreign").mkdir()
    with duckdb.connect(str(base / "foreign" / "sentinel.duckdb")) as con:
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
    store = Store.create(base / "real" / "sentinel.duckdb", "run-1", {})
    store.record_round(0, round_row(), **full_round(0))
    store.record_round(1, round_row(), **full_round(1))
    return {"text": base / "text", "foreign": base / "foreign", "real": base / "real"}


COMMANDS = [("status",), ("report",), ("export", "parquet", "--out", "{tmp}/pq"),
            ("sql", "SELECT 1")]


@pytest.mark.parametrize("kind", ["text", "foreign"])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_file_that_is_not_a_store_is_one_line(
        stores: dict[str, Path], tmp_path: Path, kind: str, command: tuple[str, ...]) -> None:
    args = [a.format(tmp=tmp_path) for a in command]
    result = cli(*args, "--run-dir", str(stores[kind]))
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and "is not a Sentinel store" in lines[0]
    assert str(stores[kind] / "sentinel.duckdb") in lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_run_dir_may_be_the_store_file_itself(
        stores: dict[str, Path], tmp_path: Path, command: tuple[str, ...]) -> None:
    args = [a.format(tmp=tmp_path) for a in command]
    result = cli(*args, "--run-dir", str(stores["real"] / "sentinel.duckdb"))
    assert result.exit_code == 0, (result.output, result.exception)


def test_loop_given_the_store_file_says_which_directory_to_give(stores: dict[str, Path]) -> None:
    store_file = stores["real"] / "sentinel.duckdb"
    result = cli("loop", "--resume", "--run-dir", str(store_file))
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"--run-dir {stores['real']}" in result.output
    assert "Traceback" not in result.output
