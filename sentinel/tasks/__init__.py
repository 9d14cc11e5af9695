"""Task families. `family_class(name)` resolves, in this order: a built-in name (`FAMILIES`), an
entry point of the group `sentinel.families` (a plugin package registers
`myfam = "my_pkg.family:MyFamily"`), then `module:Class`. See docs/families.md."""

from __future__ import annotations

from typing import Any

from sentinel.tasks.arith import ArithFamily
from sentinel.tasks.base import (
    FamilyConfig,
    ReferenceCall,
    ReferenceSolution,
    SpecError,
    TaskFamily,
    fail_first_call,
)
from sentinel.tasks.bfcl import BFCLFamily
from sentinel.tasks.lookup import LookupFamily
from sentinel.tasks.reasoning_gym import ReasoningGymFamily

# The reasoning_gym and bfcl modules import their packages (extras) only when used.
FAMILIES: dict[str, type[TaskFamily]] = {
    "arith": ArithFamily,
    "lookup": LookupFamily,
    "reasoning_gym": ReasoningGymFamily,
    "bfcl": BFCLFamily,
}
ENTRY_POINT_GROUP = "sentinel.families"


def _checked(name: str, cls: object) -> type[TaskFamily]:
    if not (isinstance(cls, type) and issubclass(cls, TaskFamily)):
        raise TypeError(f"{name} is not a TaskFamily subclass")
    return cls


def family_class(name: str) -> type[TaskFamily]:
    if name in FAMILIES:
        return FAMILIES[name]
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        return _checked(name, ep.load())
    if ":" in name:
        import importlib

        module, _, attr = name.partition(":")
        return _checked(name, getattr(importlib.import_module(module), attr))
    raise KeyError(f"unknown task family {name!r}; known: {', '.join(sorted(FAMILIES))} "
                   f"(or an entry point of {ENTRY_POINT_GROUP!r}, or module:Class)")


def load_family(name: str, config: dict[str, Any] | None = None) -> TaskFamily:
    cls = family_class(name)
    return cls(cls.config_model(**(config or {})))


__all__ = [
    "ENTRY_POINT_GROUP",
    "FAMILIES",
    "FamilyConfig",
    "ReferenceCall",
    "ReferenceSolution",
    "SpecError",
    "TaskFamily",
    "fail_first_call",
    "family_class",
    "load_family",
]
