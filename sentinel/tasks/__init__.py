"""Task families. `FAMILIES` maps a family name to its class; `load_family` also accepts
`module:Class` so a family can live outside Sentinel."""

from __future__ import annotations

from typing import Any

from sentinel.tasks.arith import ArithFamily
from sentinel.tasks.base import (
    FamilyConfig,
    ReferenceCall,
    ReferenceSolution,
    SpecError,
    TaskFamily,
)

FAMILIES: dict[str, type[TaskFamily]] = {"arith": ArithFamily}


def family_class(name: str) -> type[TaskFamily]:
    if name in FAMILIES:
        return FAMILIES[name]
    if ":" in name:
        import importlib

        module, _, attr = name.partition(":")
        cls = getattr(importlib.import_module(module), attr)
        if not (isinstance(cls, type) and issubclass(cls, TaskFamily)):
            raise TypeError(f"{name} is not a TaskFamily subclass")
        return cls
    raise KeyError(f"unknown task family {name!r}; known: {', '.join(sorted(FAMILIES))}")


def load_family(name: str, config: dict[str, Any] | None = None) -> TaskFamily:
    cls = family_class(name)
    return cls(cls.config_model(**(config or {})))


__all__ = [
    "FAMILIES",
    "FamilyConfig",
    "ReferenceCall",
    "ReferenceSolution",
    "SpecError",
    "TaskFamily",
    "family_class",
    "load_family",
]
