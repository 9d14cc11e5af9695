"""Metric loggers: the registry and config, and each tracker's files read back by the tracker's
own reader (TensorBoard's `EventAccumulator`, trackio's local SQLite storage, wandb's offline run
file). trackio and wandb run in a subprocess: both keep process-wide state (trackio reads
`TRACKIO_DIR` once, at import; wandb starts a service)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError
from rich.console import Console

from sentinel.config import ConfigError, load_config
from sentinel.loggers import (
    ConsoleLogger,
    LoggingConfig,
    MetricLogger,
    MultiLogger,
    NullLogger,
    flatten_numeric,
    logger_class,
    make_logger,
    round_scalars,
    trl_names,
)
from sentinel.plugins import PluginError

ROUND_ROW = {"heldout_success": 0.5, "train_success": None, "started_at": 1.7e9,
             "metrics": {"loss": 0.25, "failures": {"wrong_answer": 3}}, "timings": {"train": 2.0}}


class RecordingLogger(MetricLogger):
    """A plugin logger named by module:Class; keeps what it was given."""

    instances: ClassVar[list[RecordingLogger]] = []

    def __init__(self, log_dir: Path, config: LoggingConfig, run_config: Any = None) -> None:
        self.log_dir, self.config, self.calls, self.closed = log_dir, config, [], False
        RecordingLogger.instances.append(self)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.calls.append((dict(metrics), step))

    def close(self) -> None:
        self.closed = True


def test_trl_names_rename_only_what_differs():
    loop_metrics = {"loss": 0.1, "kl": 0.01, "entropy": 1.2, "clip_ratio": 0.05,
                    "grad_norm": 0.7, "reward": 0.4, "success": 0.3}
    renamed = trl_names(loop_metrics)
    assert renamed == {"loss": 0.1, "kl": 0.01, "entropy": 1.2, "clip_ratio/region_mean": 0.05,
                       "grad_norm": 0.7, "reward": 0.4, "success": 0.3}


def test_round_rows_become_scalars_without_timestamps():
    assert round_scalars(ROUND_ROW) == {
        "round/heldout_success": 0.5, "round/metrics/loss": 0.25,
        "round/metrics/failures/wrong_answer": 3.0, "round/timings/train": 2.0}
    assert flatten_numeric({"a": {"b": True, "c": "x", "d": float("nan")}}) == {"a/b": 1.0}


def test_config_section_validates_backends():
    cfg = load_config(data={"logging": {"backends": ["console", "tensorboard"], "dir": "tb"}})
    assert cfg.logging.backends == ["console", "tensorboard"] and cfg.logging.dir == "tb"
    assert load_config(data={}).logging.backends == ["console"]
    with pytest.raises(ConfigError, match=r"logging\.backends.*unknown logger 'tensorbord'"):
        load_config(data={"logging": {"backends": ["tensorbord"]}})
    with pytest.raises(ConfigError, match="appear once"):
        load_config(data={"logging": {"backends": ["console", "console"]}})
    with pytest.raises(ConfigError, match=r"unknown config key 'logging\.mode'"):
        load_config(data={"logging": {"mode": "offline"}})


def test_make_logger_builds_plugins_and_fans_out(tmp_path):
    RecordingLogger.instances.clear()
    cfg = LoggingConfig(backends=["none", "tests.test_loggers:RecordingLogger"], dir="out")
    logger = make_logger(cfg, tmp_path / "run-7")
    assert isinstance(logger, MultiLogger)
    assert isinstance(logger.loggers[0], NullLogger)
    (plugin,) = RecordingLogger.instances
    assert plugin.log_dir == tmp_path / "run-7" / "out"
    assert plugin.config.name == "run-7"  # defaults to the run directory's name
    logger.log({"loss": 1.0}, step=3)
    logger.log_round(2, ROUND_ROW)
    logger.close()
    assert plugin.calls[0] == ({"loss": 1.0}, 3)
    assert plugin.calls[1] == (round_scalars(ROUND_ROW), 2)
    assert plugin.closed
    assert isinstance(make_logger(LoggingConfig(backends=[]), tmp_path), NullLogger)
    # Checked when the config is made, through the one plugin resolver and its one error.
    with pytest.raises(ValidationError, match="logger 'pathlib:Path': Path is not a MetricLogger"):
        LoggingConfig(backends=["pathlib:Path"])
    with pytest.raises(PluginError, match="importing 'no_such_module' failed"):
        logger_class("no_such_module:Logger")


def test_console_logger_prints_trl_names_in_order(tmp_path):
    buf = io.StringIO()
    logger = make_logger(LoggingConfig(), tmp_path,
                         console=Console(file=buf, width=200, color_system=None))
    assert isinstance(logger.loggers[0], ConsoleLogger)
    logger.log(trl_names({"grad_norm": 0.5, "zeta": 1.0, "reward": 0.25, "clip_ratio": 0.0}), 4)
    logger.log_round(1, ROUND_ROW)  # the loop prints rounds itself
    line = buf.getvalue().strip()
    assert line == "step 4  reward=0.25  clip_ratio/region_mean=0  grad_norm=0.5  zeta=1"


def test_tensorboard_event_files_read_back(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install 'sentinel-rl[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = make_logger(LoggingConfig(backends=["tensorboard"]), tmp_path)
    for step in range(1, 4):
        logger.log(trl_names({"loss": 0.5 / step, "clip_ratio": 0.1}), step)
    logger.log_round(1, ROUND_ROW)
    logger.close()
    acc = EventAccumulator(str(tmp_path / "logs" / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loss", "clip_ratio/region_mean", "round/heldout_success",
            "round/timings/train"} <= tags
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("loss")] == [
        (1, 0.5), (2, 0.25), (3, round(0.5 / 3, 6))]
    assert [(e.step, e.value) for e in acc.Scalars("round/heldout_success")] == [(1, 0.5)]


def _run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=180)


def test_trackio_local_database_reads_back(tmp_path):
    pytest.importorskip("trackio", reason="pip install 'sentinel-rl[trackio]'")
    root = Path(__file__).resolve().parents[1]
    proc = _run_python(f"""
        import json, sys
        sys.path.insert(0, {str(root)!r})
        from sentinel.loggers import LoggingConfig, make_logger, trl_names
        logger = make_logger(LoggingConfig(backends=["trackio"], project="proj"), "run-a",
                             run_config={{"rounds": 2}})
        for step in (1, 2):
            logger.log(trl_names({{"reward": 0.1 * step, "clip_ratio": 0.0}}), step)
        logger.log_round(1, {{"heldout_success": 0.75}})
        logger.close()
        from trackio.sqlite_storage import SQLiteStorage  # the dashboard's own reader
        print("RESULT", json.dumps({{"runs": SQLiteStorage.get_runs("proj"),
                                    "logs": SQLiteStorage.get_logs("proj", "run-a")}},
                                   default=str))
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["runs"] == ["run-a"]
    rows = [{k: v for k, v in r.items() if k != "timestamp"} for r in result["logs"]]
    assert {"step": 1, "reward": 0.1, "clip_ratio/region_mean": 0.0} in rows
    assert {"step": 2, "reward": 0.2, "clip_ratio/region_mean": 0.0} in rows
    assert {"step": 1, "round/heldout_success": 0.75} in rows
    assert (tmp_path / "run-a" / "logs" / "trackio" / "proj.db").exists()


def test_wandb_offline_run_file_holds_the_metrics(tmp_path):
    pytest.importorskip("wandb", reason="pip install 'sentinel-rl[wandb]'")
    root = Path(__file__).resolve().parents[1]
    proc = _run_python(f"""
        import sys
        sys.path.insert(0, {str(root)!r})
        from sentinel.loggers import LoggingConfig, make_logger, trl_names
        logger = make_logger(LoggingConfig(backends=["wandb"], project="proj"), "run-b")
        logger.log(trl_names({{"clip_ratio": 0.125, "loss": 0.5}}), 1)
        logger.log_round(1, {{"heldout_success": 0.75}})
        logger.close()
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_file,) = (tmp_path / "run-b" / "logs" / "wandb").glob("offline-run-*/run-*.wandb")
    data = run_file.read_bytes()
    # The offline file is wandb's own record log (protobuf); history items keep their keys and
    # JSON values verbatim, which is what `wandb sync` uploads.
    for needle in (b"clip_ratio/region_mean", b"0.125", b"round/heldout_success", b"0.75"):
        assert needle in data, needle
