"""Finding and building generators from config.

`load_generator({"type": ..., **options})` resolves `type`, in this order, as:

1. a built-in name (`BUILTIN`);
2. a name registered under the Python entry-point group `sentinel.generators`, e.g. in a
   plugin's pyproject.toml: `[project.entry-points."sentinel.generators"] mine = "my_pkg:MyGen"`;
3. `module:Class` (dots after the colon reach nested attributes).

The class's `config_model` (a `GeneratorConfig` subclass; plain `GeneratorConfig` when it has
none, so unknown keys are still errors) validates the whole spec, and the class is built with the
validated config, or with no argument if its constructor takes none. Whatever goes wrong (an import
error inside the plugin, a name that is not a class, a missing `name` or `generate`, an invalid
option) raises `GeneratorLoadError` naming the generator and, for options, the key.
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from generators.base import GeneratorConfig, TaskGenerator
from generators.decompose import DecomposeGenerator
from generators.escalate import EscalateGenerator
from generators.mutate import MutateGenerator
from generators.teacher import TeacherGenerator

ENTRY_POINT_GROUP = "sentinel.generators"
BUILTIN: dict[str, type] = {
    "mutate": MutateGenerator,
    "decompose": DecomposeGenerator,
    "escalate": EscalateGenerator,
    "teacher": TeacherGenerator,
}


class GeneratorLoadError(ValueError):
    """A generator spec that cannot be turned into a generator; the message says why."""


def _import_target(target: str) -> Any:
    module_name, _, attr_path = target.partition(":")
    if not module_name or not attr_path:
        raise GeneratorLoadError(f"generator {target!r}: expected `module:Class`")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # any error while importing a plugin is a load error
        raise GeneratorLoadError(
            f"generator {target!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    for attr in attr_path.split("."):
        if not hasattr(obj, attr):
            raise GeneratorLoadError(f"generator {target!r}: {module_name!r} has no {attr_path!r}")
        obj = getattr(obj, attr)
    return obj


def _entry_point(name: str) -> Any | None:
    """The object registered as `name` in the `sentinel.generators` group, None if none is."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                return ep.load()
            except Exception as exc:  # a broken plugin is a load error
                raise GeneratorLoadError(
                    f"generator {name!r}: entry point {ep.value!r} failed to load: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
    return None


def generator_class(type_name: str) -> type:
    """Resolve a generator's `type` to its class (see the module docstring for the order)."""
    if type_name in BUILTIN:
        return BUILTIN[type_name]
    obj = _entry_point(type_name)
    if obj is None:
        if ":" not in type_name:
            plugins = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
            raise GeneratorLoadError(
                f"unknown generator {type_name!r}; built-in: {', '.join(sorted(BUILTIN))}; "
                f"entry points: {', '.join(plugins) or 'none'}; or give `module:Class`"
            )
        obj = _import_target(type_name)
    if not isinstance(obj, type):
        raise GeneratorLoadError(f"generator {type_name!r} is a {type(obj).__name__}, not a class")
    if not callable(getattr(obj, "generate", None)):
        raise GeneratorLoadError(f"generator {type_name!r}: class {obj.__name__} has no generate()")
    return obj


def _config_errors(type_name: str, exc: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<spec>'}: {err['msg']}" for err in exc.errors()
    )
    return f"generator {type_name!r}: invalid config: {problems}"


def load_generator(spec: dict[str, Any]) -> TaskGenerator:
    """Build the generator described by `spec` (`{"type": ..., **options}`)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise GeneratorLoadError(f"a generator spec needs a string 'type', got {spec!r}")
    type_name = spec["type"]
    cls = generator_class(type_name)
    config_model = getattr(cls, "config_model", GeneratorConfig)
    if not (isinstance(config_model, type) and issubclass(config_model, GeneratorConfig)):
        raise GeneratorLoadError(
            f"generator {type_name!r}: config_model must be a GeneratorConfig subclass"
        )
    try:
        config = config_model.model_validate(spec)
    except ValidationError as exc:
        raise GeneratorLoadError(_config_errors(type_name, exc)) from None
    try:
        takes_config = bool(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        takes_config = True
    try:
        generator = cls(config) if takes_config else cls()
    except Exception as exc:  # a plugin's constructor failing is a load error
        raise GeneratorLoadError(
            f"generator {type_name!r}: {cls.__name__}(config) raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(getattr(generator, "name", None), str):
        raise GeneratorLoadError(f"generator {type_name!r}: {cls.__name__} has no str `name`")
    return generator
