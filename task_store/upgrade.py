"""`python -m task_store.upgrade RUN_DIR_OR_FILE...`: upgrade each store in place to the current
schema version (`Store.upgrade`, one transaction per file; see `task_store.migrations`)."""

from __future__ import annotations

import sys

from task_store.schema import SCHEMA_VERSION
from task_store.store import Store


def main(argv: list[str] | None = None) -> int:
    """Upgrade each store (file or run directory) named in `argv`; 2 without any."""
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m task_store.upgrade RUN_DIR_OR_FILE...", file=sys.stderr)
        return 2
    for path in paths:
        store = Store(path)
        before = store.upgrade()
        verb = "upgraded" if before < SCHEMA_VERSION else "already at"
        print(f"{store.path}: {verb} schema version {SCHEMA_VERSION} (was {before})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
