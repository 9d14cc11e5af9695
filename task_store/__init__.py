"""Sentinel's run store: one DuckDB file per run, written one round per transaction.

Takes and returns plain dicts; imports nothing from the rest of Sentinel. See docs/schema.md.
Modules: `schema` (tables, keys, views), `store` (`Store`), `migrations` (in-place upgrades of
older files; `python -m task_store.migrations RUN_DIR`), `sql` (the read-only guard and result
writers behind `sentinel sql`).
"""

from task_store.schema import SCHEMA_VERSION
from task_store.store import SchemaVersionError, Store, StoreLockedError

__all__ = ["SCHEMA_VERSION", "SchemaVersionError", "Store", "StoreLockedError"]
