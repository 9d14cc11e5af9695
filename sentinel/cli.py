"""`sentinel` command line. Heavy imports (torch, transformers, duckdb) happen inside the
commands, so `sentinel --help` answers instantly."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

# Plain (click) help: flags shown as flags, no box drawing, readable in a log.
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Sentinel: a failure-driven curriculum engine for agentic RL.")

RunDir = Annotated[Path, typer.Option(
    "--run-dir", metavar="DIR",
    help="run directory (holds sentinel.duckdb); reading commands also take the file itself")]

# Width of tables written to a pipe or a file: wide enough that no cell is cut; rich sizes each
# table to its content, so nothing is padded to it.
PIPE_WIDTH = 100_000


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _reader_gone() -> None:
    """The reader of stdout left (`... | head`): stop quietly, as a successful command. Later
    writes, including the interpreter's final flush, go to /dev/null."""
    import os

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise typer.Exit(0)


def _console() -> Any:
    """A rich console on stdout that cuts no table cell when stdout is not a terminal."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=PIPE_WIDTH)


@app.command()
def loop(
    config: Annotated[Path | None, typer.Option("--config", metavar="FILE",
                                                help="YAML config file")] = None,
    run_dir: RunDir = Path("runs/quickstart"),
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE", help="override a config key (repeatable)")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="continue a run that died; without --config, reuse the run's config")
    ] = False,
) -> None:
    """Run the loop: SFT cold start, then GRPO → analyze → generate rounds."""
    from sentinel.config import ConfigError, load_config

    if config is None and not resume:
        _fail("give --config FILE (or --resume to continue the run in --run-dir)")
    if run_dir.suffix == ".duckdb":
        _fail(f"--run-dir takes the run directory, not its store file: give --run-dir "
              f"{run_dir.parent}" if run_dir.name == "sentinel.duckdb" else
              f"--run-dir takes a run directory (it will hold sentinel.duckdb), not {run_dir}")
    if blocker := _not_a_directory(run_dir):
        what = "is a file" if blocker.is_file() else "exists and is not a directory"
        _fail(f"--run-dir {run_dir} {what}; give a run directory (it will hold sentinel.duckdb)"
              if blocker == run_dir else
              f"--run-dir {run_dir}: {blocker} {what}, so no run directory can be made under it")
    made = _first_missing(run_dir)  # removed again if the run fails before writing anything
    try:
        if config is None:
            import json

            _, rows = _store(run_dir).query("SELECT config FROM runs ORDER BY created_at LIMIT 1")
            cfg = load_config(data=json.loads(rows[0][0]), overrides=set_ or [])
        else:
            cfg = load_config(config, set_ or [])
    except ConfigError as exc:
        _fail(str(exc))
    from generators import GeneratorLoadError
    from sentinel.loop import Loop, LoopError
    from task_store import StoreLockedError

    try:
        runner = Loop(cfg, run_dir)
    except (GeneratorLoadError, LoopError) as exc:
        _remove_empty(run_dir, made)
        _fail(str(exc))
    except OSError as exc:  # the run directory cannot be made: nothing ran, nothing to resume
        _remove_empty(run_dir, made)
        _fail(f"--run-dir {run_dir}: {exc}")
    try:
        runner.run(resume=resume)
    except (GeneratorLoadError, LoopError) as exc:
        _remove_empty(run_dir, made)  # refused before the store (policy, veRL): nothing left
        _fail(str(exc))
    except (OSError, StoreLockedError) as exc:
        _fail(f"{exc}\nthe interrupted round was not stored; once the cause is fixed, continue "
              f"with: sentinel loop --resume --run-dir {run_dir}")
    from trainers import distributed

    if not distributed.is_main():  # under a launcher rank 0 reports
        return
    store = _store(run_dir)
    _, rows = store.query("SELECT round, heldout_success FROM rounds ORDER BY round")
    (r0, first), (rn, last) = rows[0], rows[-1]
    typer.echo(f"held-out success: round {r0} {first:.3f} -> round {rn} {last:.3f}; "
               f"store: {run_dir / 'sentinel.duckdb'}")
    for line in _changes(store, r0, rn):
        typer.echo(line)


def _not_a_directory(run_dir: Path) -> Path | None:
    """The path that keeps `run_dir` from being a directory: `run_dir` itself or the nearest
    existing folder above it, when that is a file (or anything else that is not a directory);
    None when `run_dir` is, or can be made, a directory."""
    for path in (run_dir, *run_dir.parents):
        if path.exists() or path.is_symlink():
            return None if path.is_dir() else path
    return None


def _first_missing(run_dir: Path) -> Path | None:
    """The outermost of `run_dir` and its parents that does not exist yet (None: it exists)."""
    missing = None
    for path in (run_dir, *run_dir.parents):
        if path.exists() or path.is_symlink():
            return missing
        missing = path
    return missing


def _remove_empty(run_dir: Path, made: Path | None) -> None:
    """Remove the folders this run made (`run_dir` up to `made`) while they are empty: a run
    refused before it wrote anything leaves no directory behind."""
    if made is None:
        return
    path = run_dir
    while True:
        try:
            path.rmdir()  # only ever removes an empty folder
        except OSError:
            return
        if path == made or path == path.parent:
            return
        path = path.parent


def _changes(store: Any, first: int, last: int) -> list[str]:
    """Lines stating the paired change of held-out success (and mean recovery) between two
    rounds with its 95 % CI over the held-out tasks (`sentinel.heldout`); none for one round."""
    from sentinel.heldout import heldout_change

    if last <= first:
        return []
    names = {"success": "held-out success", "recovery": "mean held-out recovery"}
    return [f"round {first} -> {last}, {names[k]}: {c}"
            for k, c in heldout_change(store, first, last).items()]


def _store(run_dir: Path) -> Any:
    """The run's `Store`, checked to open as one (read-only); `run_dir` may also be the store
    file itself. Fails with one line when it is missing, locked or not a Sentinel store."""
    import duckdb

    from task_store import SchemaVersionError, Store, StoreLockedError

    path = run_dir if run_dir.is_file() else run_dir / "sentinel.duckdb"
    if not path.exists():
        _fail(f"no store at {path}; run `sentinel loop` first")
    store = Store(path)
    try:
        with store.connect(read_only=True):
            pass
    except SchemaVersionError as exc:
        _fail(str(exc))
    except StoreLockedError as exc:
        _fail(str(exc))
    except duckdb.Error as exc:
        _fail(f"{path} is not a Sentinel store: {exc}")
    return store


@app.command()
def sql(
    query: Annotated[str | None, typer.Argument(
        metavar="QUERY", help="one read-only SQL statement")] = None,
    run_dir: RunDir = Path("runs/quickstart"),
    file: Annotated[Path | None, typer.Option("--file", metavar="FILE",
                                              help="read the SQL from this file")] = None,
    format_: Annotated[str, typer.Option("--format", metavar="table|csv|json|parquet",
                                         help="output format")] = "table",
    output: Annotated[Path | None, typer.Option(
        "--output", metavar="PATH",
        help="write the result here instead of stdout (required for parquet)")] = None,
) -> None:
    """Run one read-only SQL statement on a run's store (tables and views: docs/schema.md).

    Anything but a plain read (INSERT, CREATE, COPY ... TO, ATTACH, SET, ...) is refused before it
    runs, and the store is opened read-only. While a loop commits a round the query waits for it.
    """
    import duckdb

    from task_store import SchemaVersionError, StoreLockedError
    from task_store.sql import (
        FORMATS,
        QUERY_CONFIG,
        ReadOnlyQueryError,
        check_read_only,
        run_query,
    )

    if (query is None) == (file is None):
        _fail("give the SQL either as the QUERY argument or with --file, not both or neither")
    if format_ not in FORMATS:
        _fail(f"unknown --format {format_!r}; choose one of {', '.join(FORMATS)}")
    if format_ == "parquet" and output is None:
        _fail("--format parquet writes a file: add --output PATH")
    if file is not None:
        if not file.is_file():
            _fail(f"no SQL file at {file}")
        query = file.read_text(encoding="utf-8")
    store = _store(run_dir)
    try:
        check_read_only(query or "")  # before opening the store: a refusal never waits on a lock
        # QUERY_CONFIG: no extension installed or loaded, no file or URL but the store
        with store.connect(read_only=True, config=QUERY_CONFIG) as con:
            run_query(con, query or "", format_, output, sys.stdout)
    except BrokenPipeError:
        _reader_gone()
    except (ReadOnlyQueryError, SchemaVersionError, StoreLockedError, OSError) as exc:
        _fail(str(exc))
    except duckdb.PermissionException as exc:  # a file, a URL, an extension: one line
        _fail(f"sentinel sql reads only the run's store (no files, URLs or extensions): "
              f"{str(exc).splitlines()[0]}")
    except duckdb.Error as exc:
        _fail(f"{type(exc).__name__}: {exc}")


@app.command()
def export(
    kind: Annotated[str, typer.Argument(metavar="KIND", help="parquet | hf | dpo | verl")],
    out: Annotated[Path, typer.Option("--out", metavar="PATH",
                                      help="where to write (folder or file, per kind)")],
    run_dir: RunDir = Path("runs/quickstart"),
) -> None:
    """Export a run's store: `parquet` (every table), `hf` (tasks as a datasets.Dataset), `dpo`
    (preference pairs from GRPO groups, JSONL) or `verl` (active tasks as veRL RL Parquet)."""
    from sentinel.export import EXPORTERS, ExportError
    from task_store import SchemaVersionError, StoreLockedError

    if kind not in EXPORTERS:
        _fail(f"unknown export kind {kind!r}; choose one of {', '.join(EXPORTERS)}")
    store = _store(run_dir)
    try:
        summary = EXPORTERS[kind](store, out)
    except (ExportError, SchemaVersionError, StoreLockedError) as exc:
        _fail(str(exc))
    typer.echo(summary)


@app.command()
def status(
    run_dir: RunDir = Path("runs/quickstart"),
    watch: Annotated[bool, typer.Option("--watch", help="refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.2, metavar="SECONDS",
                                            help="seconds between refreshes")] = 5.0,
) -> None:
    """One line per round: held-out success, failures, generation, training metrics; when the
    held-out set holds fault tasks, a second table: held-out recovery per fault type and round.

    `--watch` refreshes while a loop runs (read-only; waits while a commit holds the store)."""
    import json
    import time

    from rich.console import Group
    from rich.table import Table

    store = _store(run_dir)
    console = _console()

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    def train_metrics(text: str | None) -> str:
        m = json.loads(text or "{}")
        keys = ("loss", "kl", "clip_ratio", "entropy", "grad_norm")
        if not any(k in m for k in keys):  # round 0: the SFT cold start's own metrics
            keys = ("sft/loss", "sft/grad_norm")
        return " ".join(f"{k}={m[k]:.3g}" for k in keys if isinstance(m.get(k), int | float))

    def recovery(rounds: list[int]) -> Table | None:
        """Held-out recovery rate (sampled) per fault type, their mean, and the mean greedy rate
        beside it (`recovery_rates`, docs/schema.md); None without held-out fault tasks."""
        _, rows = store.query(
            "SELECT round, fault_type, recovery_rate, greedy_rate FROM recovery_rates "
            "WHERE split = 'eval' AND list_contains(?, round) ORDER BY round, fault_type",
            [rounds])
        if not rows:
            return None
        types = sorted({t for _, t, _, _ in rows})
        by_round: dict[int, dict[str, tuple[float, float | None]]] = {}
        for r, fault, rate, greedy in rows:
            by_round.setdefault(r, {})[fault] = (rate, greedy)
        out = Table("round", "mean (greedy)", *types,
                    title="held-out recovery per fault type")
        for r, rates in by_round.items():
            greedy = [g for _, g in rates.values() if g is not None]
            mean = sum(v for v, _ in rates.values()) / len(rates)
            mean_cell = pct(mean) + (f" ({sum(greedy) / len(greedy):.3f})" if greedy else "")
            out.add_row(str(r), mean_cell,
                        *(pct(rates[t][0]) if t in rates else "-" for t in types))
        return out

    def table(last: int | None = None) -> Table | Group:
        _, rounds = store.query(
            "SELECT round, heldout_success, heldout_greedy, train_success, n_proposed, "
            "n_accepted, n_rejected, metrics FROM rounds ORDER BY round")
        _, modes = store.query(
            "SELECT round, mode, count(*) FROM failures GROUP BY ALL ORDER BY round, 3 DESC")
        by_round: dict[int, list[str]] = {}
        for r, mode, n in modes:
            by_round.setdefault(r, []).append(f"{mode}={n}")
        out = Table("round", "held-out", "greedy", "train", "failures by mode",
                    "generated (proposed/accepted/rejected)", "training metrics")
        shown = rounds if last is None else rounds[-last:]
        for r, held, greedy, train, proposed, accepted, rejected, metrics in shown:
            out.add_row(str(r), pct(held), pct(greedy), pct(train),
                        ", ".join(by_round.get(r, [])),
                        "-" if r == 0 else f"{proposed}/{accepted}/{rejected}",
                        train_metrics(metrics))
        faults = recovery([row[0] for row in shown])
        return out if faults is None else Group(out, faults)

    if not watch:
        console.print(table())
        _, ends = store.query("SELECT min(round), max(round) FROM rounds")
        if ends and ends[0][0] is not None:
            for line in _changes(store, *ends[0]):
                console.print(line, highlight=False)
        return
    from rich.live import Live

    # Show the latest rounds that fit the terminal (rows may wrap to two lines); the store is
    # reopened read-only on every refresh.
    fit = max((console.height - 7) // 2, 3) if console.is_terminal else None
    import signal

    # A shell running us in the background without job control leaves SIGINT ignored, and
    # Python then never raises KeyboardInterrupt: the watch says Ctrl-C stops it, so make it so.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # On stderr, at once: says how to stop, and tells a caller that the watch has started.
        print(f"sentinel status: watching {run_dir} every {interval:g}s; Ctrl-C stops",
              file=sys.stderr, flush=True)
        with Live(table(fit), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(table(fit), refresh=True)
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:
        # Ctrl-C while a refresh's query runs: DuckDB turns SIGINT into this, not into
        # KeyboardInterrupt.
        if str(exc) != "Query interrupted":
            raise


@app.command()
def report(
    run_dir: RunDir = Path("runs/quickstart"),
    out: Annotated[Path | None, typer.Option("--out", metavar="FILE", help="HTML file "
                                             "(default: report.html beside the store)")] = None,
) -> None:
    """Write a self-contained HTML report of a run (plots, lineage gallery, config, timing)."""
    from sentinel.report import build_report

    path = build_report(_store(run_dir).path, out)
    typer.echo(f"report: {path} ({path.stat().st_size / 1024:.0f} KiB)")


bench_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                        help="Benchmarks of the training loop itself.")
app.add_typer(bench_app, name="bench")


@bench_app.command("curriculum")
def bench_curriculum(
    config: Annotated[Path, typer.Option("--config", metavar="FILE",
                                         help="bench YAML (a loop config plus a "
                                         "`bench` section)")] = Path("configs/bench_arith.yaml"),
    seeds: Annotated[int, typer.Option("--seeds", min=1, metavar="N", help="seeds per arm")] = 3,
    out: Annotated[Path, typer.Option("--out", metavar="DIR",
                                      help="output directory (runs, results, plots); "
                                      "finished runs in it are reused")] = Path("runs/bench"),
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE", help="override a config key (repeatable)")] = None,
) -> None:
    """Failure-driven curriculum vs uniform sampling vs online difficulty filtering, at equal
    rollout budget from one shared SFT cold start (see docs/results.md)."""
    import shlex

    from sentinel.bench import BenchError, load_bench_config, run_curriculum_bench
    from sentinel.config import ConfigError

    try:
        cfg = load_bench_config(config, set_ or [])
    except ConfigError as exc:
        _fail(str(exc))
    command = "sentinel " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        run_curriculum_bench(cfg, seeds, out, command=command)
    except BenchError as exc:
        _fail(str(exc))


ingest_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                         help="Bring rollouts of another trainer into a run's store.")
app.add_typer(ingest_app, name="ingest")


@ingest_app.command("verl-rollouts")
def ingest_verl_rollouts(
    dump_dir: Annotated[Path, typer.Argument(
        metavar="DIR", help="veRL's trainer.rollout_data_dir (one <step>.jsonl per step)")],
    run_dir: RunDir = Path("runs/quickstart"),
) -> None:
    """Ingest veRL's rollout dumps as the next committed round: tasks, trajectories, steps and
    the failures mined from them (docs/verl.md). Steps ingested before are skipped, so a running
    job can be ingested again and again."""
    from sentinel.verl.ingest import IngestError, ingest_dump
    from task_store import SchemaVersionError, StoreLockedError

    try:
        typer.echo(ingest_dump(dump_dir, run_dir))
    except (IngestError, SchemaVersionError, StoreLockedError, ValueError) as exc:
        _fail(str(exc))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
