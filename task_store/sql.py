"""Read-only SQL on a store: the statement guard and result writers behind `sentinel sql`.

Two locks keep `sentinel sql` from ever writing. The query runs on a read-only DuckDB connection
(DuckDB refuses writes to the database), and before that `check_read_only` refuses, with a message
naming the statement, anything that is not a plain read. The guard uses DuckDB's own parser
(`duckdb.extract_statements` gives each statement's type), not regular expressions over the text:

- SELECT-type statements (SELECT, WITH, FROM-first, VALUES, DESCRIBE, SHOW, SUMMARIZE) pass after
  their syntax tree (`json_serialize_sql`) is searched for data-modifying CTEs
  (`WITH d AS (DELETE ... RETURNING *) SELECT ...`), which DuckDB also types as SELECT. A SELECT
  the serializer cannot render is let through to the read-only connection, which still guards it.
- EXPLAIN [ANALYZE] passes when the statement it explains does (ANALYZE executes it).
- PRAGMA passes only for the metadata pragmas in `READ_ONLY_PRAGMAS`.
- Everything else is refused by type: INSERT, UPDATE, DELETE, CREATE, DROP, ALTER, COPY (it writes
  files even on a read-only connection), EXPORT, ATTACH, DETACH, INSTALL/LOAD, SET/RESET/USE,
  CALL, transactions, PREPARE/EXECUTE, VACUUM/ANALYZE/CHECKPOINT, multi-statement PIVOT.

One statement per call, so "the result" is unambiguous in every output format.

A query reads the store and nothing else: the connection is opened with `QUERY_CONFIG`, so
DuckDB neither installs nor autoloads an extension (`read_csv('http://...')` would otherwise
download httpfs into ~/.duckdb/extensions) and refuses every file, URL and directory outside the
database (`enable_external_access`); the settings are locked, so the query cannot turn them back.

Results stream: `csv` and `json` write chunk by chunk, so a result larger than memory still
comes out; `table` renders at most `TABLE_ROWS` rows and says how many it left out.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import re
import textwrap
from collections.abc import Iterable, Iterator, Sequence
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, TextIO

import duckdb

FORMATS = ("table", "csv", "json", "parquet")

# DuckDB settings of every connection a user's SQL runs on (the store's, and the in-memory one
# that parses it): no extension installed or autoloaded, no file or URL but the database itself.
QUERY_CONFIG = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "enable_external_access": False,
    "lock_configuration": True,
}
TABLE_ROWS = 1_000  # rows the `table` format renders; csv/json/parquet write them all
COUNT_LIMIT = 10_000_000  # rows left out of a table that are counted before "more than"
_CHUNK = 10_000  # rows fetched at a time

READ_ONLY_PRAGMAS = frozenset({
    "collations", "database_list", "database_size", "functions", "metadata_info", "platform",
    "show", "show_databases", "show_tables", "show_tables_expanded", "storage_info",
    "table_info", "user_agent", "version",
})

_ALLOWED = "SELECT/WITH/FROM/VALUES, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN and metadata PRAGMAs"
_EXPLAIN = re.compile(r"^\s*EXPLAIN(\s+ANALY[SZ]E)?\b", re.IGNORECASE)
_PRAGMA = re.compile(r"^\s*PRAGMA\s+(\w+)", re.IGNORECASE)


class ReadOnlyQueryError(ValueError):
    """The SQL is not exactly one plain read statement; the message says which part and why."""


def check_read_only(sql: str) -> str:
    """Return the single statement of `sql` if it only reads; raise `ReadOnlyQueryError`
    otherwise (several statements, an unparsable text, or any statement that could write)."""
    statements = _parse(sql)
    if not statements:
        raise ReadOnlyQueryError("no SQL statement given")
    if len(statements) > 1:
        raise ReadOnlyQueryError(
            f"one statement per call, got {len(statements)}; run them one at a time"
        )
    _check_statement(statements[0])
    return statements[0].query


def _parse(sql: str) -> list[Any]:
    try:
        return duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ReadOnlyQueryError(f"cannot parse the SQL: {exc}") from exc


def _strip_leading_comments(text: str) -> str:
    """`text` without the `-- ...` and `/* ... */` comments before its first keyword (DuckDB keeps
    them in each statement's text)."""
    while True:
        text = text.lstrip()
        if text.startswith("--"):
            text = text.partition("\n")[2]
        elif text.startswith("/*"):
            text = text.partition("*/")[2]
        else:
            return text


def _check_statement(statement: Any) -> None:
    kind = statement.type.name
    text = _strip_leading_comments(statement.query)
    if kind == "SELECT":
        writes = _data_modifying_nodes(text)
        if writes:
            raise ReadOnlyQueryError(
                f"sentinel sql is read-only: the query contains {', '.join(sorted(writes))} "
                f"(a data-modifying WITH clause)"
            )
    elif kind == "EXPLAIN":
        if not _EXPLAIN.match(text):
            raise ReadOnlyQueryError("cannot find the statement this EXPLAIN explains")
        inner = _parse(_EXPLAIN.sub("", text, count=1))
        if len(inner) != 1:
            raise ReadOnlyQueryError("EXPLAIN takes exactly one statement")
        _check_statement(inner[0])
    elif kind == "PRAGMA":
        match = _PRAGMA.match(text)
        name = match.group(1).lower() if match else "?"
        if name not in READ_ONLY_PRAGMAS:
            raise ReadOnlyQueryError(
                f"sentinel sql is read-only: PRAGMA {name} is refused "
                f"(allowed pragmas: {', '.join(sorted(READ_ONLY_PRAGMAS))})"
            )
    else:
        keyword = (text.split() or ["?"])[0].upper()
        raise ReadOnlyQueryError(
            f"sentinel sql is read-only: {keyword} statements are refused "
            f"(statement type {kind}); allowed: {_ALLOWED}"
        )


def _data_modifying_nodes(select_sql: str) -> set[str]:
    """INSERT/UPDATE/DELETE/MERGE nodes anywhere in the syntax tree of a SELECT-type statement."""
    with duckdb.connect(config=QUERY_CONFIG) as con:  # in-memory: only the parser is used
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [select_sql]).fetchone()[0])
    if tree.get("error"):
        return set()  # not serializable; the read-only connection still refuses any write
    found: set[str] = set()
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            kind = node.get("type")
            if isinstance(kind, str) and kind.endswith("_QUERY_NODE"):
                found.add(kind.removesuffix("_QUERY_NODE"))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


# -- result writers ------------------------------------------------------------------------------


def _plain(value: Any, *, json_column: bool = False) -> Any:
    """A JSON-serialisable form of one DuckDB value (JSON-typed text is parsed)."""
    if json_column and isinstance(value, str):
        return json.loads(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _chunks(cursor: Any) -> Iterator[list[tuple]]:
    """The rows a DuckDB result has left, `_CHUNK` at a time."""
    while chunk := cursor.fetchmany(_CHUNK):
        yield chunk


def write_json(columns: Sequence[str], types: Sequence[str], rows: Iterable[tuple],
               out: TextIO) -> None:
    """A JSON array of objects, one per row, written row by row (the text `json.dump(records,
    indent=1)` gives). `JSON` columns are embedded as JSON values rather than strings;
    timestamps are ISO 8601; anything else without a JSON form becomes a string."""
    is_json = [t == "JSON" for t in types]
    first = True
    for row in rows:
        record = {c: _plain(v, json_column=j)
                  for c, v, j in zip(columns, row, is_json, strict=True)}
        text = json.dumps(record, ensure_ascii=False, default=str, indent=1)
        out.write(("[\n" if first else ",\n") + textwrap.indent(text, " ", lambda _: True))
        first = False
    out.write("[]\n" if first else "\n]\n")


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list | tuple):
        return json.dumps(_plain(value), ensure_ascii=False, default=str)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    return str(value)


def write_csv(columns: Sequence[str], rows: Iterable[tuple], out: TextIO) -> None:
    """RFC 4180 CSV with a header, written row by row. NULL is an empty field, booleans are
    `true`/`false`, lists and structs are JSON text, timestamps ISO 8601."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_cell(v) for v in row])


def write_table(columns: Sequence[str], rows: Sequence[tuple], console: Any) -> None:
    """A rich table on `console`; NULL shown as `NULL`."""
    from rich.table import Table

    table = Table(*columns)
    for row in rows:
        table.add_row(*("NULL" if v is None else str(v) for v in row))
    console.print(table)


def _left_out(cursor: Any) -> str:
    """How many rows `cursor` has left, counted up to `COUNT_LIMIT` (fetched in chunks and
    dropped: memory stays bounded), as text."""
    left = 0
    for chunk in _chunks(cursor):
        left += len(chunk)
        if left > COUNT_LIMIT:
            return f"more than {COUNT_LIMIT:,}"
    return f"{left:,}"


def run_query(con: duckdb.DuckDBPyConnection, sql: str, fmt: str, output: Path | None,
              stdout: TextIO) -> int:
    """Check `sql` with `check_read_only`, run it on `con`, and write the result as `fmt` to
    `output` (or `stdout`; `parquet` needs `output`). Returns the number of rows written (for
    `table`, the rows shown: at most `TABLE_ROWS`, then a line saying how many were left out)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "parquet" and output is None:
        raise ValueError("--format parquet needs --output PATH")
    statement = check_read_only(sql)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table = con.sql(statement).to_arrow_table()  # a relation: Arrow without a row copy
        pq.write_table(table, output)
        return table.num_rows
    cursor = con.execute(statement)
    columns = [d[0] for d in cursor.description]
    types = [str(d[1]) for d in cursor.description]
    with (open(output, "w", encoding="utf-8", newline="") if output else
          contextlib.nullcontext(stdout)) as out:
        if fmt == "table":
            from rich.console import Console

            rows = cursor.fetchmany(TABLE_ROWS)
            # A terminal gets its own width; a file or a pipe a table whose cells are never cut
            # (rich sizes the table to its content, so nothing is padded).
            to_terminal = output is None and out.isatty()
            write_table(columns, rows, Console(file=out, width=None if to_terminal else 100_000))
            if len(rows) == TABLE_ROWS and (left := _left_out(cursor)) != "0":
                out.write(f"... {left} more rows not shown: the table format shows the first "
                          f"{TABLE_ROWS:,}; --format csv or json writes them all\n")
            return len(rows)
        counted = _Counted(itertools.chain.from_iterable(_chunks(cursor)))
        if fmt == "json":
            write_json(columns, types, counted, out)
        else:
            write_csv(columns, counted, out)
    return counted.n


class _Counted:
    """An iterator that counts what it yields (`n`)."""

    def __init__(self, items: Iterator[tuple]) -> None:
        self.items, self.n = items, 0

    def __iter__(self) -> Iterator[tuple]:
        for item in self.items:
            self.n += 1
            yield item
