"""`Store`: the run's DuckDB file (`<run-dir>/sentinel.duckdb`), written once per round.

Design:
- Dicts in, dicts/tuples out. This package imports nothing from the rest of Sentinel; callers pass
  the rows their `to_row()` methods produce.
- Short-lived connections. DuckDB lets ONE read-write process or MANY read-only processes open a
  file. Every method opens a connection, does its work and closes it, so the training loop holds
  the write lock only while committing a round and analysts can query between commits. Opening a
  file someone else has locked is retried with backoff for up to `lock_timeout_s` (one notice on
  stderr), then `StoreLockedError`.
- One transaction per round. `record_round` inserts the round's rows in all tables between BEGIN
  and COMMIT and rolls back on any error, so a round is either fully present or absent;
  `completed_rounds()` is the resume point.
- Columnar writes. Each table's rows become one `pyarrow.Table` with an explicit schema derived
  from `schema.COLUMNS` (converted by pyarrow in C++ when the rows need no normalising), inserted
  with one `INSERT ... SELECT`; never row by row.
- Versioned. `meta.schema_version` is checked on the first connection of a `Store`. A file of an
  older version is upgraded in place (`task_store.migrations`, one transaction) the first time a
  `Store` opens it for writing; a read-only open of an older file, and any open of a newer one, is
  refused with `SchemaVersionError`, so read-only callers never write.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from task_store import migrations
from task_store.schema import COLUMNS, DDL, SCHEMA_VERSION

DB_FILENAME = "sentinel.duckdb"

_SCALAR_ARROW: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(),
    "JSON": pa.string(),
    "INTEGER": pa.int32(),
    "UTINYINT": pa.uint8(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMP": pa.timestamp("us"),
}

# Child tables of one round, in insertion order (the `rounds` row goes first).
_ROUND_TABLES = (
    "tasks", "trajectories", "steps", "failures", "rejections", "evals", "clusters"
)


class StoreLockedError(RuntimeError):
    """Another process held the store's file lock for longer than `lock_timeout_s`."""


class SchemaVersionError(RuntimeError):
    """The file is not a Sentinel store, or its schema version cannot be used as asked: newer
    than this code, or older and opened read-only (upgrade it by opening it for writing)."""


def _arrow_type(duck_type: str) -> pa.DataType:
    if duck_type.endswith("[]"):
        return pa.list_(_SCALAR_ARROW[duck_type[:-2]])
    return _SCALAR_ARROW[duck_type]


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)  # Path, datetime, enums, ...


def _to_json(value: Any) -> str | None:
    """JSON column value: strings are taken as already-serialised JSON; anything else is dumped."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=_json_default)


def _to_timestamp(value: Any) -> datetime | None:
    """TIMESTAMP column value (naive UTC) from a datetime, an ISO string or epoch seconds."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    elif isinstance(value, int | float):
        value = datetime.fromtimestamp(value, UTC)
    if isinstance(value, datetime) and value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


_ROW_TYPES: dict[str, pa.StructType] = {
    table: pa.struct([pa.field(name, _arrow_type(t)) for name, t in cols])
    for table, cols in COLUMNS.items()
    # Timestamps always take the normalising path (aware datetimes, ISO strings, epoch seconds).
    if not any(t == "TIMESTAMP" for _, t in cols)
}


def _arrow_table(table: str, rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Rows -> `pa.Table` in DDL column order; missing keys become null, extra keys are ignored."""
    if table in _ROW_TYPES:
        # Fast path: pyarrow converts the dicts in C++ (~4x faster than column by column in
        # Python). Rows needing normalisation (a dict for a JSON column) or holding a bad value
        # fail here and take the path below, which normalises them or names the bad column.
        with suppress(pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            return pa.Table.from_struct_array(pa.array(rows, type=_ROW_TYPES[table]))
    arrays, fields = [], []
    for name, duck_type in COLUMNS[table]:
        values = [row.get(name) for row in rows]
        if duck_type == "JSON":
            values = [_to_json(v) for v in values]
        elif duck_type == "TIMESTAMP":
            values = [_to_timestamp(v) for v in values]
        type_ = _arrow_type(duck_type)
        try:
            arrays.append(pa.array(values, type=type_))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
            raise ValueError(f"{table}.{name} ({duck_type}): {exc}") from exc
        fields.append(pa.field(name, type_))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _insert(
    con: duckdb.DuckDBPyConnection,
    table: str,
    rows: Sequence[dict[str, Any]],
    *,
    ignore_existing: bool = False,
) -> None:
    """One columnar `INSERT ... SELECT` of `rows` into `table`, inside the caller's transaction."""
    if not rows:
        return
    arrow_tbl = _arrow_table(table, rows)
    view = f"_arrow_{table}"
    cols = ", ".join(f'"{name}"' for name, _ in COLUMNS[table])
    verb = "INSERT OR IGNORE INTO" if ignore_existing else "INSERT INTO"
    con.register(view, arrow_tbl)
    con.execute(f"{verb} {table} ({cols}) SELECT {cols} FROM {view}")
    # Not in a `finally`: in an aborted transaction DuckDB refuses even `unregister`, which would
    # mask the real error. The connection is closed right after a failure anyway.
    con.unregister(view)


@contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """BEGIN ... COMMIT; ROLLBACK and re-raise on any error (a failed COMMIT already rolled back,
    so a second error from ROLLBACK is suppressed rather than masking the first)."""
    con.execute("BEGIN")
    try:
        yield
        con.execute("COMMIT")
    except BaseException:
        with suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise


class Store:
    """Handle on one run's DuckDB file. Cheap to construct; holds no connection between calls."""

    def __init__(self, path: str | Path, *, lock_timeout_s: float = 60.0) -> None:
        """`path` is the database file, or an existing run directory (-> `<dir>/sentinel.duckdb`).
        `lock_timeout_s` bounds every wait for another process's lock."""
        p = Path(path)
        self._path = p / DB_FILENAME if p.is_dir() else p
        self.lock_timeout_s = lock_timeout_s
        self._version_checked = False

    @property
    def path(self) -> Path:
        return self._path

    @classmethod
    def create(
        cls, path: str | Path, run_id: str, config: dict[str, Any], *, lock_timeout_s: float = 60.0
    ) -> Store:
        """Create the file and schema if needed and record the run.

        Idempotent: on an existing store of this version the schema is left as is, one of an older
        version is upgraded in place, and an existing `run_id` row is not duplicated (the first
        config wins). Raises `SchemaVersionError` for a file of a newer schema version.
        """
        store = cls(path, lock_timeout_s=lock_timeout_s)
        store.path.parent.mkdir(parents=True, exist_ok=True)
        with store._connect(read_only=False, must_exist=False) as con, _transaction(con):
            version = store._schema_version(con)
            if version is None:
                for ddl in DDL:
                    con.execute(ddl)
                con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
            else:
                store._bring_current(con, version, read_only=False)
            created_at = datetime.now(UTC).replace(tzinfo=None)
            _insert(
                con,
                "runs",
                [
                    {
                        "run_id": run_id,
                        "created_at": created_at,
                        "config": config,
                        "schema_version": SCHEMA_VERSION,
                    }
                ],
                ignore_existing=True,
            )
        store._version_checked = True
        return store

    def record_round(
        self,
        round: int,
        round_row: dict[str, Any],
        *,
        tasks: Sequence[dict[str, Any]] = (),
        trajectories: Sequence[dict[str, Any]] = (),
        steps: Sequence[dict[str, Any]] = (),
        failures: Sequence[dict[str, Any]] = (),
        rejections: Sequence[dict[str, Any]] = (),
        evals: Sequence[dict[str, Any]] = (),
        clusters: Sequence[dict[str, Any]] = (),
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        """Write everything of round `round` in one transaction (all or nothing).

        `before_commit`, if given, runs inside the transaction after every insert and before
        COMMIT; if it raises, the round is rolled back (the loop's crash tests use it).

        `round_row` holds the `rounds` columns other than `round` (missing ones are NULL; dicts for
        `metrics`/`timings` are JSON-encoded). Raises `ValueError` if the round is already
        recorded. Tasks whose `task_id` exists (in the store or earlier in `tasks`) are skipped;
        a duplicate key in any other table is an error. On any error the transaction is rolled
        back and the exception re-raised. `clusters` (schema v2) are the analyzer's failure
        clusters of this round.
        """
        if round_row.get("round", round) != round:
            raise ValueError(f"round_row['round']={round_row['round']!r} != round={round!r}")
        first_by_id: dict[str, dict[str, Any]] = {}
        for task in tasks:
            first_by_id.setdefault(task["task_id"], task)
        batches = (
            list(first_by_id.values()), trajectories, steps, failures, rejections, evals, clusters
        )
        with self._connect(read_only=False) as con, _transaction(con):
            if con.execute("SELECT 1 FROM rounds WHERE round = ?", [round]).fetchall():
                raise ValueError(f"round {round} is already recorded in {self.path}")
            _insert(con, "rounds", [{**round_row, "round": round}])
            for table, rows in zip(_ROUND_TABLES, batches, strict=True):
                _insert(con, table, rows, ignore_existing=table == "tasks")
            if before_commit is not None:
                before_commit()

    def upgrade(self) -> int:
        """Upgrade the existing file in place to `SCHEMA_VERSION` (no-op when current); returns the
        version it had. Raises `SchemaVersionError` for a newer file."""
        if not self.path.exists():
            raise FileNotFoundError(f"no Sentinel store at {self.path}")
        with self._connect(read_only=False, must_exist=False) as con, _transaction(con):
            before = self._bring_current(con, self._schema_version(con), read_only=False)
        self._version_checked = True
        return before

    def run_ids(self) -> list[str]:
        """The ids of the runs recorded in the file (one for a store the loop wrote), oldest
        first; empty when the file holds no run yet."""
        _, rows = self.query("SELECT run_id FROM runs ORDER BY created_at, run_id")
        return [r[0] for r in rows]

    def completed_rounds(self) -> list[int]:
        """Rounds fully committed, ascending."""
        _, rows = self.query("SELECT round FROM rounds ORDER BY round")
        return [r[0] for r in rows]

    def load_tasks(
        self, *, origin: str | None = None, task_ids: Iterable[str] | None = None
    ) -> list[dict[str, Any]]:
        """Task rows as `Task.to_row()` produced them (JSON strings for `spec`/`prompt`, lists for
        `skills`/`failure_ids`), filtered by `origin` and/or `task_ids`, ordered by
        (created_round, task_id)."""
        where, params = [], []
        if origin is not None:
            where.append("origin = ?")
            params.append(origin)
        if task_ids is not None:
            ids = list(task_ids)
            if not ids:
                return []
            where.append("list_contains(?, task_id)")
            params.append(ids)
        sql = "SELECT * FROM tasks"
        if where:
            sql += " WHERE " + " AND ".join(where)
        cols, rows = self.query(sql + " ORDER BY created_round, task_id", params)
        return [dict(zip(cols, row, strict=True)) for row in rows]

    def existing_task_ids(self, task_ids: Iterable[str]) -> set[str]:
        """The subset of `task_ids` already in `tasks`."""
        ids = list(task_ids)
        if not ids:
            return set()
        _, rows = self.query("SELECT task_id FROM tasks WHERE list_contains(?, task_id)", [ids])
        return {r[0] for r in rows}

    def query(self, sql: str, params: list[Any] | None = None) -> tuple[list[str], list[tuple]]:
        """Run `sql` on a read-only connection; returns (column names, rows). DuckDB itself
        refuses writes."""
        with self.connect(read_only=True) as con:
            cur = con.execute(sql, params or [])
            cols = [d[0] for d in cur.description] if cur.description else []
            return cols, cur.fetchall()

    def connect(self, *, read_only: bool,
                config: dict[str, Any] | None = None) -> duckdb.DuckDBPyConnection:
        """Open a connection to the existing store, waiting (up to `lock_timeout_s`) while another
        process holds the lock. Use it as a context manager so it is closed promptly: an open
        connection blocks the loop (read-only) or everyone (read-write). `config`: DuckDB
        settings of the connection (`task_store.sql.QUERY_CONFIG` for user queries)."""
        return self._open(read_only=read_only, must_exist=True, config=config)

    # -- internals ------------------------------------------------------------------------

    @contextmanager
    def _connect(
        self, *, read_only: bool, must_exist: bool = True
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        con = self._open(read_only=read_only, must_exist=must_exist)
        try:
            yield con
        finally:
            con.close()

    def _open(self, *, read_only: bool, must_exist: bool,
              config: dict[str, Any] | None = None) -> duckdb.DuckDBPyConnection:
        if must_exist and not self.path.exists():
            raise FileNotFoundError(f"no Sentinel store at {self.path} (Store.create makes one)")
        deadline = time.monotonic() + self.lock_timeout_s
        delay, warned = 0.05, False
        while True:
            try:
                con = duckdb.connect(str(self.path), read_only=read_only, config=config or {})
                break
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower():
                    raise
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StoreLockedError(
                        f"sentinel: {self.path} stayed locked by another process for "
                        f"{self.lock_timeout_s:g}s; close other connections to it (a notebook, "
                        f"the duckdb CLI, a running loop) and retry. DuckDB said: {exc}"
                    ) from exc
                if not warned:
                    print(
                        "sentinel: store is locked by another process (a loop committing?); "
                        "waiting…",
                        file=sys.stderr,
                        flush=True,
                    )
                    warned = True
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 1.0)
            except duckdb.ConnectionException as exc:
                if "different configuration" not in str(exc):
                    raise
                raise StoreLockedError(
                    f"sentinel: this process already has a connection to {self.path} open in the "
                    f"other mode (read_only={not read_only}); close it first"
                ) from exc
        if must_exist and not self._version_checked:
            try:
                with _transaction(con):
                    self._bring_current(con, self._schema_version(con), read_only=read_only)
            except BaseException:
                con.close()
                raise
            self._version_checked = True
        return con

    def _bring_current(
        self, con: duckdb.DuckDBPyConnection, version: int | None, *, read_only: bool
    ) -> int:
        """Accept a current file, upgrade an older one (inside the caller's transaction), refuse
        the rest with `SchemaVersionError`. Returns `version`."""
        if version is None:
            raise SchemaVersionError(f"{self.path} is not a Sentinel store (no schema version)")
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.path} has schema version {version}, newer than this code's "
                f"{SCHEMA_VERSION}; use a newer Sentinel"
            )
        if version < SCHEMA_VERSION:
            if read_only:
                raise SchemaVersionError(
                    f"{self.path} has schema version {version}, older than this code's "
                    f"{SCHEMA_VERSION}; upgrade it in place once with "
                    f"`python -m task_store.upgrade {self.path}` (resuming the run with "
                    f"`sentinel loop` does it too)"
                )
            migrations.upgrade(con, version)
        return version

    def _schema_version(self, con: duckdb.DuckDBPyConnection) -> int | None:
        """The file's schema version (None for a file without one)."""
        # fetchall, not fetchone: DuckDB 2.0 refuses register() while a result is unfinished.
        if not con.execute("SELECT 1 FROM duckdb_tables() WHERE table_name = 'meta'").fetchall():
            return None
        rows = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
        return int(rows[0][0]) if rows else None
