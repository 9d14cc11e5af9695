"""Sentinel's run store: one DuckDB file per run, written one round per transaction.

The name is historical: the package began as the store of generated tasks, and now holds the
whole run (the run's config, rounds, tasks with their lineage, trajectories and their steps,
failures and clusters, rejections, evals). The docs call it "the run store"; the package keeps
its name so that imports, `python -m task_store.upgrade` and existing run directories still work.

Takes and returns plain dicts; imports nothing from the rest of Sentinel (tests/test_layers.py
enforces it). See docs/schema.md. Modules: `schema` (tables, keys, views), `store` (`Store`),
`migrations` (the frozen SQL steps that upgrade older files), `upgrade`
(`python -m task_store.upgrade RUN_DIR`), `sql` (the read-only guard and result writers behind
`sentinel sql`).
"""

from task_store.schema import SCHEMA_VERSION
from task_store.store import SchemaVersionError, Store, StoreLockedError

__all__ = ["SCHEMA_VERSION", "SchemaVersionError", "Store", "StoreLockedError"]
