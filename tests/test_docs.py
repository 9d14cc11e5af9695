"""Public interfaces are documented: every config key (the loop's and the
curriculum bench's) appears in docs/configuration.md and every
store column in docs/schema.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sentinel.bench import BenchConfig

DOCS = Path(__file__).resolve().parents[1] / "docs"


def dotted_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        ann: Any = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += dotted_keys(ann, f"{prefix}{name}.")
    return keys


def test_every_config_key_is_documented() -> None:
    text = (DOCS / "configuration.md").read_text()
    missing = [k for k in dotted_keys(BenchConfig) if f"`{k}`" not in text]
    assert not missing, f"undocumented config keys: {missing}"


def test_every_store_column_is_documented() -> None:
    from task_store.schema import COLUMNS

    text = (DOCS / "schema.md").read_text()
    missing = [f"{table}.{col[0]}" for table, cols in COLUMNS.items() for col in cols
               if f"`{col[0]}`" not in text]
    assert not missing, f"undocumented columns: {missing}"
