"""One way to find a plugin class by name: task families, generators, metric loggers and tool-call
parsers all resolve through `resolve`.

A name resolves, in this order, as:

1. a built-in name (the caller's `builtins` table, values a class or a `module:Class` string);
2. a Python entry point of the kind's group (`sentinel.families`, `sentinel.generators`,
   `sentinel.loggers`, `sentinel.parsers`), e.g. in a plugin's pyproject.toml:
   `[project.entry-points."sentinel.generators"] mine = "my_pkg:MyGenerator"`;
3. `module:Class`, where dots after the colon reach nested attributes (`pkg.mod:Outer.Inner`).

Whatever goes wrong is one `PluginError` (a `ValueError`) that names the kind, the name and what
was tried: an unknown name lists the built-ins and the installed entry points; any exception
raised while importing a plugin's module is wrapped with its type and message, so a broken
plugin cannot surface as an unrelated traceback. The class found is checked against `base` (a
subclass) and `required` (callable attributes, for protocols such as `generate` or `parse`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

GROUPS = {
    "task family": "sentinel.families",
    "generator": "sentinel.generators",
    "logger": "sentinel.loggers",
    "tool-call parser": "sentinel.parsers",
}


class PluginError(ValueError):
    """A plugin name that cannot be turned into a class; the message names the kind, the name
    and what was tried."""

    def __init__(self, kind: str, name: str, problem: str) -> None:
        super().__init__(f"{kind} {name!r}: {problem}")
        self.kind, self.name, self.problem = kind, name, problem


class UnknownPlugin(PluginError):
    """A name that is no built-in, no entry point and not `module:Class`."""

    def __init__(self, kind: str, name: str, tried: str) -> None:
        ValueError.__init__(self, f"unknown {kind} {name!r}; {tried}")
        self.kind, self.name, self.problem = kind, name, tried


def import_target(kind: str, name: str, target: str) -> Any:
    """The object `module:attr.path` names; `PluginError` if the module does not import (any
    exception inside it) or lacks the attribute."""
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise PluginError(kind, name, f"expected `module:Class`, got {target!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # any error while importing a plugin is the plugin's load error
        raise PluginError(kind, name, f"importing {module_name!r} failed: "
                                      f"{type(exc).__name__}: {exc}") from exc
    for attr in attr_path.split("."):
        if not hasattr(obj, attr):
            raise PluginError(kind, name, f"{module_name!r} has no {attr_path!r}")
        obj = getattr(obj, attr)
    return obj


def _entry_point(kind: str, name: str, group: str) -> Any | None:
    """The object registered as `name` in `group`, None if nothing is."""
    for ep in entry_points(group=group, name=name):
        try:
            return ep.load()
        except Exception as exc:  # a broken plugin is a load error, whatever it raised
            raise PluginError(kind, name, f"entry point {ep.value!r} of group {group!r} failed "
                                          f"to load: {type(exc).__name__}: {exc}") from exc
    return None


def resolve(kind: str, name: str, builtins: Mapping[str, type | str], group: str,
            base: type | None = None, required: tuple[str, ...] = ()) -> type:
    """The class `name` stands for (see the module docstring for the order and the errors).

    `kind` is how errors call the thing ("task family", "generator", ...); `group` is the entry
    point group; `base`, when given, must be a superclass of the result; every name in `required`
    must be a callable attribute of it.

    >>> resolve("logger", "collections:OrderedDict", {}, "sentinel.loggers", base=dict).__name__
    'OrderedDict'
    >>> try:
    ...     resolve("logger", "nope", {"console": dict}, "sentinel.loggers")
    ... except PluginError as exc:
    ...     print(str(exc).replace("; ", ";\\n"))
    unknown logger 'nope';
    built-in: console;
    entry points of 'sentinel.loggers': none;
    or give module:Class
    """
    if not isinstance(name, str) or not name:
        raise PluginError(kind, str(name), "the name must be a non-empty string")
    if name in builtins:
        obj: Any = builtins[name]
        if isinstance(obj, str):
            obj = import_target(kind, name, obj)
    else:
        obj = _entry_point(kind, name, group)
        if obj is None:
            if ":" not in name:
                installed = sorted(ep.name for ep in entry_points(group=group))
                raise UnknownPlugin(kind, name, (
                    f"built-in: {', '.join(sorted(builtins)) or 'none'}; "
                    f"entry points of {group!r}: {', '.join(installed) or 'none'}; "
                    "or give module:Class"))
            obj = import_target(kind, name, name)
    if not isinstance(obj, type):
        raise PluginError(kind, name, f"is a {type(obj).__name__}, not a class")
    if base is not None and not issubclass(obj, base):
        raise PluginError(kind, name, f"{obj.__name__} is not a {base.__name__} subclass")
    for attr in required:
        if not callable(getattr(obj, attr, None)):
            raise PluginError(kind, name, f"class {obj.__name__} has no {attr}()")
    return obj
