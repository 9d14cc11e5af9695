"""Task families and their config entries.

`family_class(name)` resolves a family through `sentinel.plugins.resolve`: a built-in name
(`FAMILIES`), an entry point of the group `sentinel.families` (a plugin package registers
`myfam = "my_pkg.family:MyFamily"`), then `module:Class`. See docs/families.md.

A run config's family entry is `{type: <name>, weight: <share>, ...the family's own options}`.
`family_entry(data)` validates one into a typed `FamilyEntry`: a model made from the family's
`config_model` plus `type` and `weight`, so every option is checked when the config is loaded and
a dumped config (`runs.config`) holds every default. `entry.build()` makes the family.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import InitErrorDetails, PydanticCustomError

from sentinel.plugins import PluginError, resolve
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
_ENTRY_KEYS = ("type", "weight")


def family_class(name: str) -> type[TaskFamily]:
    """The `TaskFamily` subclass `name` stands for; `PluginError` naming what was tried."""
    return resolve("task family", name, FAMILIES, ENTRY_POINT_GROUP, base=TaskFamily)


class FamilyEntry(BaseModel):
    """One member of a family mixture: which family (`type`) and its share (`weight`). The entry
    model of each family (`family_entry_model`) adds the family's own options beside them."""

    model_config = ConfigDict(extra="forbid")
    type: str = Field(description="built-in family (arith, lookup, reasoning_gym, bfcl), an "
                                  "entry point of sentinel.families, or module:Class")
    weight: float = Field(1.0, gt=0, description="share of the mixture (relative to the others)")

    def family_config(self) -> FamilyConfig:
        """The family's own config (the entry without `type` and `weight`)."""
        model = family_class(self.type).config_model
        return model.model_validate({k: getattr(self, k) for k in model.model_fields})

    def build(self) -> TaskFamily:
        """The task family this entry configures."""
        return family_class(self.type)(self.family_config())


@functools.cache
def family_entry_model(name: str) -> type[FamilyEntry]:
    """The entry model of family `name`: its `config_model` with `type` (fixed to `name`) and
    `weight`. `PluginError` if the family cannot be loaded or its options would shadow those."""
    cls = family_class(name)
    config_model = cls.config_model
    if not (isinstance(config_model, type) and issubclass(config_model, BaseModel)):
        raise PluginError("task family", name, "config_model must be a FamilyConfig subclass")
    if clash := [k for k in _ENTRY_KEYS if k in config_model.model_fields]:
        raise PluginError("task family", name, f"its config_model defines {clash}, which the "
                          "entry itself uses (type, weight): rename them")
    return create_model(
        f"{cls.__name__}Entry",
        __base__=(config_model, FamilyEntry),
        __module__=cls.__module__,
        __doc__=f"A `{name}` family entry: `type`, `weight` and the options of "
                f"{config_model.__name__}.",
        type=(Literal[name], Field(description=FamilyEntry.model_fields["type"].description)),
    )


def _legacy(data: dict[str, Any]) -> dict[str, Any]:
    """The entry shape before the options moved inline (`{name, weight, config: {...}}`), read
    as `{type, weight, ...options}`, so configs stored by older runs still load."""
    if "name" not in data or "type" in data:
        return data
    warnings.warn("a family entry's `name` is now `type`, and the options of its `config` go "
                  "inline beside it", FutureWarning, stacklevel=2)
    out = {k: v for k, v in data.items() if k not in ("name", "config")}
    out["type"] = data["name"]
    options = data.get("config") or {}
    if isinstance(options, dict):
        out.update(options)
    return out


def family_entry(data: Any) -> FamilyEntry:
    """Validate one family entry (`{type, weight, ...options}`) into the family's entry model.

    Errors are a `ValidationError` whose locations are keys of the entry (`type`, `max_value`,
    ...), so a config error names `families.N.<key>`."""
    if isinstance(data, FamilyEntry):
        return data
    if not isinstance(data, dict):
        raise ValidationError.from_exception_data("FamilyEntry", [InitErrorDetails(
            type=PydanticCustomError("family_entry", "a family entry is a mapping "
                                     "{type: <family>, weight: <share>, ...options}"),
            loc=(), input=data)])
    data = _legacy(data)
    name = data.get("type")
    if not isinstance(name, str):
        raise ValidationError.from_exception_data("FamilyEntry", [InitErrorDetails(
            type=PydanticCustomError("family_type", "a family entry needs a string `type`: "
                                     "a built-in family ({known}), an entry point of "
                                     "sentinel.families, or module:Class",
                                     {"known": ", ".join(FAMILIES)}),
            loc=("type",), input=name)])
    try:
        model = family_entry_model(name)
    except PluginError as exc:
        raise ValidationError.from_exception_data("FamilyEntry", [InitErrorDetails(
            type=PydanticCustomError("plugin", "{error}", {"error": str(exc)}),
            loc=("type",), input=name)]) from None
    return model.model_validate(data)


def load_family(family: str | FamilyEntry, config: dict[str, Any] | FamilyConfig | None = None,
                ) -> TaskFamily:
    """A task family: from a config entry (`load_family(entry)`, the same as `entry.build()`) or
    from a name and its options (`load_family("arith", {"max_operands": 4})`)."""
    if isinstance(family, FamilyEntry):
        return family.build()
    cls = family_class(family)
    if isinstance(config, FamilyConfig):
        return cls(config)
    return cls(cls.config_model(**(config or {})))


__all__ = [
    "ENTRY_POINT_GROUP",
    "FAMILIES",
    "FamilyConfig",
    "FamilyEntry",
    "PluginError",
    "ReferenceCall",
    "ReferenceSolution",
    "SpecError",
    "TaskFamily",
    "fail_first_call",
    "family_class",
    "family_entry",
    "family_entry_model",
    "load_family",
]
