"""Metric loggers: where a run's numbers go besides the store.

Design (nanochat's null-object logger, trl's metric names):
- One small interface, `MetricLogger`: `log(metrics, step)` for the scalars of one update (step =
  the global GRPO update count), `log_round(round, row)` for a committed round's `rounds` row, and
  `close()`. Callers never branch on "is a tracker configured": `NullLogger` and `MultiLogger`
  make "none" and "several" look like one.
- Backends live in one registry (`LOGGERS`, name -> `module:Class`); `logging.backends` in the
  config names them, an entry point of the group `sentinel.loggers`, or any `module:Class` (all
  resolved by `sentinel.plugins.resolve`, when the config is loaded) with the same constructor
  `(log_dir: Path, config: LoggingConfig, run_config: dict | None)`.
- Names follow trl's GRPOTrainer where they mean the same thing (`trl_names` renames the loop's
  keys, e.g. `clip_ratio` -> `clip_ratio/region_mean`), so dashboards of trl and Sentinel runs
  line up. The table is in docs/report.md.
- Every tracker runs offline/local: TensorBoard event files, trackio's local SQLite
  (`TRACKIO_DIR`), wandb `mode="offline"`. Syncing is the user's business (`wandb sync`).
- Heavy or optional imports (rich, torch's SummaryWriter, trackio, wandb) happen in the
  constructors, so importing this module (done by `sentinel.config`) stays cheap; a missing
  package is an `ImportError` that names the extra to install.

Simplifications: only scalars are logged (no histograms, tables or media); `log_round` flattens
the row's numeric fields but its timestamps (nested dicts joined with `/`) under `round/` at
step = round; the
console backend prints update lines only, because the loop prints its own per-round summary.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sentinel.plugins import resolve

# Loop metric name -> trl GRPOTrainer name, where the two measure the same thing. Keys not listed
# keep their name (`loss`, `kl`, `entropy`, `grad_norm`, `reward`, `reward_std`, `learning_rate`,
# `completions/mean_length` are already trl's).
TRL_NAMES: dict[str, str] = {
    # Share of policy tokens where min() picked the clipped branch (low clip with A<0 or high clip
    # with A>0): trl's `is_region_clipped` mean.
    "clip_ratio": "clip_ratio/region_mean",
}

LOGGERS: dict[str, str] = {
    "console": "sentinel.loggers:ConsoleLogger",
    "tensorboard": "sentinel.loggers:TensorBoardLogger",
    "trackio": "sentinel.loggers:TrackioLogger",
    "wandb": "sentinel.loggers:WandbLogger",
    "none": "sentinel.loggers:NullLogger",
}
ENTRY_POINT_GROUP = "sentinel.loggers"


def logger_class(name: str) -> type[MetricLogger]:
    """The `MetricLogger` subclass `name` stands for (a `LOGGERS` name, an entry point of
    `sentinel.loggers`, or `module:Class`); `sentinel.plugins.PluginError` naming what was
    tried."""
    return resolve("logger", name, LOGGERS, ENTRY_POINT_GROUP, base=MetricLogger)


class LoggingConfig(BaseModel):
    """`logging:` section: which metric loggers a run writes to."""

    model_config = ConfigDict(extra="forbid")

    backends: list[str] = Field(
        default_factory=lambda: ["console"],
        description="loggers, each once: console, tensorboard, trackio, wandb, none, an entry "
                    "point of sentinel.loggers, or module:Class (a MetricLogger subclass)",
    )
    dir: str | None = Field(None, description="where trackers write (default <run-dir>/logs)")
    project: str = Field("sentinel", description="project name for trackio and wandb")
    name: str | None = Field(None, description="run name for trackio and wandb (default: run dir)")

    @field_validator("backends")
    @classmethod
    def _backends(cls, v: list[str]) -> list[str]:
        for name in v:
            logger_class(name)  # a typo or a broken plugin fails at load, not after round 0
        if len(set(v)) != len(v):
            raise ValueError(f"each logger may appear once, got {v}: a repeat would log twice")
        return v


def trl_names(metrics: Mapping[str, float]) -> dict[str, float]:
    """The loop's update metrics renamed to trl's names (`TRL_NAMES`); other keys unchanged.

    >>> trl_names({"clip_ratio": 0.1, "loss": 0.5})
    {'clip_ratio/region_mean': 0.1, 'loss': 0.5}
    """
    return {TRL_NAMES.get(k, k): v for k, v in metrics.items()}


def flatten_numeric(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested mapping as `{prefix + "a/b": float}`; bools become 0/1; strings,
    timestamps and None are left out; JSON text is not parsed.

    >>> flatten_numeric({"a": 1, "b": {"c": True, "d": "x"}, "e": None}, "round/")
    {'round/a': 1.0, 'round/b/c': 1.0}
    """
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_numeric(value, f"{name}/"))
        elif isinstance(value, bool | int | float) and not (
                isinstance(value, float) and math.isnan(value)):
            out[name] = float(value)
    return out


# Numeric columns of a `rounds` row that are not metrics (epoch seconds).
_NOT_METRICS = ("started_at", "finished_at")


def round_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """What `log_round` records: the row's numeric leaves under `round/`, timestamps left out.

    >>> round_scalars({"heldout_success": 0.5, "started_at": 1.7e9, "timings": {"train": 2}})
    {'round/heldout_success': 0.5, 'round/timings/train': 2.0}
    """
    return flatten_numeric({k: v for k, v in row.items() if k not in _NOT_METRICS}, "round/")


class MetricLogger:
    """Where metrics go. Subclasses implement `log`; `log_round` and `close` are optional."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record scalar `metrics` (already trl-named, see `trl_names`) at global update `step`."""
        raise NotImplementedError

    def log_round(self, round: int, row: Mapping[str, Any]) -> None:
        """Record a committed round: the `rounds` row (metrics and timings as dicts). Default: its
        numeric leaves under `round/` (`round_scalars`), at step = `round`."""
        self.log(round_scalars(row), step=round)

    def close(self) -> None:
        """Flush and release files; the logger is unusable afterwards."""


class NullLogger(MetricLogger):
    """Logs nothing (`backends: [none]` or `[]`)."""

    def __init__(self, log_dir: Path | None = None, config: LoggingConfig | None = None,
                 run_config: Mapping[str, Any] | None = None) -> None:
        pass

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_round(self, round: int, row: Mapping[str, Any]) -> None:
        pass


class MultiLogger(MetricLogger):
    """Fans every call out to several loggers, in order."""

    def __init__(self, loggers: Sequence[MetricLogger]) -> None:
        self.loggers = list(loggers)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def log_round(self, round: int, row: Mapping[str, Any]) -> None:
        for logger in self.loggers:
            logger.log_round(round, row)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


# The keys the console shows first, in this order; the rest follow alphabetically.
_CONSOLE_FIRST = ("reward", "reward_std", "success", "loss", "kl", "entropy",
                  "clip_ratio/region_mean", "grad_norm", "learning_rate", "completions/mean_length")


class ConsoleLogger(MetricLogger):
    """One dim line per update on a rich console. `log_round` prints nothing: the loop already
    prints a summary line per round."""

    def __init__(self, log_dir: Path | None = None, config: LoggingConfig | None = None,
                 run_config: Mapping[str, Any] | None = None, console: Any = None) -> None:
        from rich.console import Console

        self.console = console or Console()

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        keys = [k for k in _CONSOLE_FIRST if k in metrics]
        keys += sorted(k for k in metrics if k not in _CONSOLE_FIRST)
        body = "  ".join(f"{k}={metrics[k]:.4g}" for k in keys)
        self.console.print(f"[dim]step {step}  {body}[/dim]", highlight=False)

    def log_round(self, round: int, row: Mapping[str, Any]) -> None:
        pass


def _missing(package: str, extra: str) -> ImportError:
    return ImportError(f"the {extra} logger needs the '{package}' package: "
                       f"pip install 'sentinel-rl[{extra}]'")


class TensorBoardLogger(MetricLogger):
    """Event files under `<log_dir>/tensorboard` (torch's `SummaryWriter`)."""

    def __init__(self, log_dir: Path, config: LoggingConfig | None = None,
                 run_config: Mapping[str, Any] | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise _missing("tensorboard", "tensorboard") from exc
        self.dir = Path(log_dir) / "tensorboard"
        # A short flush period so `tensorboard --logdir` follows a live run.
        self.writer = SummaryWriter(log_dir=str(self.dir), flush_secs=10)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, float(value), global_step=step)

    def close(self) -> None:
        self.writer.close()


class TrackioLogger(MetricLogger):
    """trackio in local mode: a SQLite project database under `<log_dir>/trackio`.

    trackio reads its directory from `TRACKIO_DIR` once, at import; this logger sets it before the
    import and refuses a second directory in the same process (it would silently write elsewhere).
    """

    def __init__(self, log_dir: Path, config: LoggingConfig | None = None,
                 run_config: Mapping[str, Any] | None = None) -> None:
        config = config or LoggingConfig()
        self.dir = (Path(log_dir) / "trackio").resolve()
        os.environ.setdefault("TRACKIO_DIR", str(self.dir))
        try:
            import trackio
            import trackio.utils
        except ImportError as exc:
            raise _missing("trackio", "trackio") from exc
        if Path(trackio.utils.TRACKIO_DIR).resolve() != self.dir:
            raise RuntimeError(
                f"trackio already writes to {trackio.utils.TRACKIO_DIR} in this process (it reads "
                f"TRACKIO_DIR once, at import); cannot also log to {self.dir}")
        self.project = config.project
        self.name = config.name or Path(log_dir).resolve().name
        self.run = trackio.init(project=self.project, name=self.name,
                                config=dict(run_config or {}), embed=False,
                                auto_log_gpu=False, auto_log_cpu=False)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


class WandbLogger(MetricLogger):
    """wandb in offline mode under `<log_dir>/wandb` (upload later with `wandb sync`).

    wandb wants one monotonic step; round rows are logged without a step, against their own
    `round/round` axis (`define_metric`).
    """

    def __init__(self, log_dir: Path, config: LoggingConfig | None = None,
                 run_config: Mapping[str, Any] | None = None) -> None:
        config = config or LoggingConfig()
        try:
            import wandb
        except ImportError as exc:
            raise _missing("wandb", "wandb") from exc
        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=config.project, dir=str(self.dir), mode="offline",
                              name=config.name or self.dir.resolve().name,
                              config=dict(run_config or {}))
        self.run.define_metric("round/round")
        self.run.define_metric("round/*", step_metric="round/round")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def log_round(self, round: int, row: Mapping[str, Any]) -> None:
        self.run.log({**round_scalars(row), "round/round": float(round)})

    def close(self) -> None:
        self.run.finish()


def make_logger(config: LoggingConfig, run_dir: str | Path,
                run_config: Mapping[str, Any] | None = None, *,
                console: Any = None) -> MetricLogger:
    """The loggers `config.backends` names, as one `MultiLogger` (a `NullLogger` for none).

    Trackers write under `config.dir` (relative to `run_dir`), default `<run_dir>/logs`;
    `run_config` (the run's config as a dict) is stored with trackio and wandb runs; `console`
    (a rich Console) is the one console loggers print to, so their lines and the caller's
    progress bars do not interleave.
    """
    log_dir = Path(run_dir) / (config.dir or "logs")
    config = config.model_copy(update={"name": config.name or Path(run_dir).resolve().name})
    loggers: list[MetricLogger] = []
    for name in config.backends:
        cls = logger_class(name)
        if issubclass(cls, ConsoleLogger):
            loggers.append(cls(log_dir, config, run_config, console=console))
        else:
            loggers.append(cls(log_dir, config, run_config))
    return MultiLogger(loggers) if loggers else NullLogger()
