"""`sentinel` command line. Heavy imports (torch, transformers, duckdb) happen inside the
commands, so `sentinel --help` answers instantly."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Sentinel: a failure-driven curriculum engine for agentic RL.")

RunDir = Annotated[Path, typer.Option("--run-dir", help="run directory (holds sentinel.duckdb)")]


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@app.command()
def loop(
    config: Annotated[Path, typer.Option("--config", help="YAML config file")],
    run_dir: RunDir = Path("runs/quickstart"),
    set_: Annotated[list[str] | None, typer.Option("--set", help="override: key.path=value")] = None,
) -> None:
    """Run the loop: SFT cold start, then GRPO → analyze → generate rounds."""
    from sentinel.config import ConfigError, load_config

    try:
        cfg = load_config(config, set_ or [])
    except ConfigError as exc:
        _fail(str(exc))
    from generators import GeneratorLoadError
    from sentinel.loop import Loop

    try:
        history = Loop(cfg, run_dir).run()
    except GeneratorLoadError as exc:
        _fail(str(exc))
    if history:
        first, last = history[0]["heldout_success"], history[-1]["heldout_success"]
        typer.echo(f"held-out success: round 0 {first:.3f} -> round {len(history) - 1} "
                   f"{last:.3f}; store: {run_dir / 'sentinel.duckdb'}")


def _store(run_dir: Path):
    from task_store import Store

    path = run_dir / "sentinel.duckdb"
    if not path.exists():
        _fail(f"no store at {path}; run `sentinel loop` first")
    return Store(path)


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="SQL to run (read-only)")],
    run_dir: RunDir = Path("runs/quickstart"),
) -> None:
    """Run a read-only SQL query on a run's store and print the result as a table."""
    import duckdb
    from rich.console import Console
    from rich.table import Table

    try:
        columns, rows = _store(run_dir).query(query)
    except duckdb.Error as exc:
        _fail(f"{type(exc).__name__}: {exc}")
    table = Table(*columns)
    for row in rows:
        table.add_row(*("NULL" if v is None else str(v) for v in row))
    Console().print(table)


@app.command()
def status(run_dir: RunDir = Path("runs/quickstart")) -> None:
    """One line per round: held-out success, failures by mode, tasks generated."""
    from rich.console import Console
    from rich.table import Table

    store = _store(run_dir)
    _, rounds = store.query(
        "SELECT round, heldout_success, heldout_greedy, train_success, n_proposed, n_accepted, "
        "n_rejected FROM rounds ORDER BY round")
    _, modes = store.query(
        "SELECT round, mode, count(*) FROM failures GROUP BY ALL ORDER BY round, 3 DESC")
    by_round: dict[int, list[str]] = {}
    for r, mode, n in modes:
        by_round.setdefault(r, []).append(f"{mode}={n}")
    table = Table("round", "held-out", "greedy", "train", "failures by mode",
                  "generated (proposed/accepted/rejected)")

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    for r, held, greedy, train, proposed, accepted, rejected in rounds:
        table.add_row(str(r), pct(held), pct(greedy), pct(train), ", ".join(by_round.get(r, [])),
                      "-" if r == 0 else f"{proposed}/{accepted}/{rejected}")
    Console().print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
