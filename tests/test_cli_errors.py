"""Bad input to the CLI is one clear line (rc 2), never a traceback, and leaves nothing behind:
a config file that is empty, a directory, a device, huge or not UTF-8; a config string that is
not Unicode text; a `policy.model` that cannot be loaded (a broken config.json too); a
`--run-dir` that is a file; a file that is not a store, and `--run-dir` given the store file
instead of its directory. `sentinel sql` reads nothing but the store (no file, URL or extension)
and its table format renders at most 1,000 rows."""

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
                                   "a-directory-without-config", "config-not-json",
                                   "config-without-model-type"])
def test_an_unloadable_policy_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub is never asked: only the cache is
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-directory-without-config").mkdir()
    _model_dirs(tmp_path)
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


def _model_dirs(base: Path) -> None:
    """Model directories whose config.json is not JSON, and JSON without a model_type."""
    for name, text in (("config-not-json", '{"model_type": "llama",'),
                       ("config-without-model-type", '{"architectures": ["LlamaForCausalLM"]}')):
        (base / name).mkdir()
        (base / name / "config.json").write_text(text)


def _loop_inputs(base: Path) -> None:
    """The files the `BAD_LOOP_INPUTS` rows name, in `base`."""
    (base / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    (base / "a-file").write_text("I am a file\n")
    (base / "config-dir").mkdir()
    (base / "huge.yaml").write_text("rounds: 1\n" + "# padding\n" * 110_000)  # > 1 MiB
    (base / "latin1.yaml").write_bytes(b"rounds: 1\nseed: 0  # caf\xe9\n")
    # "\ud800" in a YAML double-quoted string: PyYAML makes it a lone surrogate
    entry = {"type": "arith", "max_operands": 2, "instruction": "SURROGATE"}
    (base / "surrogate.yaml").write_text(
        yaml.safe_dump({**TINY, "families": [entry]}).replace("SURROGATE", '"\\ud800"'))
    _model_dirs(base)


# `sentinel loop` given bad input: (arguments, a fragment of the one error line); "{tmp}" is the
# test's folder, which holds the files `_loop_inputs` makes; the run directory is {tmp}/run
# unless a row gives --run-dir. Every row fails before anything is written (issue #42).
TINY_ARGS = ["--config", "{tmp}/tiny.yaml"]
BAD_LOOP_INPUTS: dict[str, tuple[list[str], str]] = {
    "run dir is a file": ([*TINY_ARGS, "--run-dir", "{tmp}/a-file"],
                          "--run-dir {tmp}/a-file is a file; give a run directory"),
    "run dir under a file": ([*TINY_ARGS, "--run-dir", "{tmp}/a-file/run"],
                             "{tmp}/a-file is a file, so no run directory can be made"),
    "config is a directory": (["--config", "{tmp}/config-dir"],
                              "config file {tmp}/config-dir is a directory"),
    "config is a device": (["--config", "/dev/zero"],
                           "config file /dev/zero is not a regular file"),
    "config over 1 MiB": (["--config", "{tmp}/huge.yaml"],
                          "config file {tmp}/huge.yaml is larger than 1 MiB"),
    "config not UTF-8": (["--config", "{tmp}/latin1.yaml"],
                         "config file {tmp}/latin1.yaml is not UTF-8 text (byte 24: b'\\xe9')"),
    "lone surrogate from a YAML escape": (["--config", "{tmp}/surrogate.yaml"],
                                          "config key 'families.0.instruction': contains a lone "
                                          "surrogate ('\\ud800'"),
    "instruction of 5,000 characters": (
        [*TINY_ARGS, "--set", "families.0.instruction=" + "x" * 5000],
        "config key 'families.0.instruction': String should have at most 4000 characters"),
    "10^26 rounds": ([*TINY_ARGS, "--set", "rounds=1" + "0" * 26],
                     "config key 'rounds': Input should be less than or equal to 10000"),
    "group of 10^9": ([*TINY_ARGS, "--set", "batch.group_size=1000000000"],
                      "config key 'batch.group_size': Input should be less than or equal to 1024"),
    "policy.model config.json not JSON": (
        [*TINY_ARGS, "--set", "policy.model={tmp}/config-not-json"],
        "policy.model: {tmp}/config-not-json/config.json is not valid JSON"),
    "policy.model config.json without model_type": (
        [*TINY_ARGS, "--set", "policy.model={tmp}/config-without-model-type"],
        "policy.model: {tmp}/config-without-model-type/config.json has no model_type"),
}


@pytest.mark.parametrize("name", list(BAD_LOOP_INPUTS))
def test_bad_loop_input_is_one_line_and_writes_nothing(tmp_path: Path, name: str) -> None:
    args, fragment = BAD_LOOP_INPUTS[name]
    _loop_inputs(tmp_path)
    args = [a.format(tmp=tmp_path) for a in args]
    if "--run-dir" not in args:
        args += ["--run-dir", str(tmp_path / "run")]
    result = cli("loop", *args)
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert fragment.format(tmp=tmp_path) in lines[0], lines[0]
    assert "--resume" not in lines[0]
    assert not (tmp_path / "run").exists()  # no run directory, so no store
    assert (tmp_path / "a-file").read_text() == "I am a file\n"


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


# `sentinel sql` reads the store and nothing else: (query, what the error line names).
OUTSIDE_READS = {
    "a URL (httpfs would be installed)": ("SELECT count(*) FROM read_csv('http://127.0.0.1:9/x.csv')",
                                          "http://127.0.0.1:9/x.csv"),
    "a local file": ("SELECT * FROM read_csv('{tmp}/rows.csv')", "{tmp}/rows.csv"),
    "a file by its name": ("SELECT * FROM '{tmp}/rows.csv'", "{tmp}/rows.csv"),
}


@pytest.mark.parametrize("name", list(OUTSIDE_READS))
def test_sql_reads_no_file_url_or_extension(stores: dict[str, Path], tmp_path: Path,
                                            name: str) -> None:
    """No extension is installed or autoloaded (DuckDB would download httpfs into
    ~/.duckdb/extensions for the URL) and no file but the store is read: one error line."""
    query, named = (x.format(tmp=tmp_path) for x in OUTSIDE_READS[name])
    (tmp_path / "rows.csv").write_text("a\n1\n")
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "sentinel", "sql", query, "--run-dir", str(stores["real"])],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "HOME": str(home)})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: sentinel sql reads only the run's store"), lines[0]
    assert named in lines[0]
    assert proc.stdout == ""
    assert list(home.iterdir()) == []  # no ~/.duckdb/extensions


@pytest.mark.parametrize("rows", [5000, 1000])
def test_sql_table_shows_at_most_1000_rows(stores: dict[str, Path], rows: int) -> None:
    """A large result in the table format: the first 1,000 rows and a line saying how many were
    left out; csv writes every row."""
    query = f"SELECT range AS n FROM range({rows})"
    result = cli("sql", query, "--run-dir", str(stores["real"]))
    assert result.exit_code == 0, (result.output, result.exception)
    cells = [line.strip("│ ") for line in result.output.splitlines() if line.startswith("│")]
    assert cells == [str(i) for i in range(1000)]  # the body; the header row is drawn with ┃
    last = result.output.strip().splitlines()[-1]
    if rows > 1000:
        assert last == ("... 4,000 more rows not shown: the table format shows the first 1,000; "
                        "--format csv or json writes them all")
    else:
        assert "not shown" not in result.output
    csv_out = cli("sql", query, "--run-dir", str(stores["real"]), "--format", "csv")
    assert csv_out.stdout.splitlines() == ["n", *(str(i) for i in range(rows))]
