"""Finding and building generators from config.

`load_generator({"type": ..., **options})` resolves `type` through `sentinel.plugins.resolve`, in
this order:

1. a built-in name (`BUILTIN`);
2. a name registered under the Python entry-point group `sentinel.generators`, e.g. in a
   plugin's pyproject.toml: `[project.entry-points."sentinel.generators"] mine = "my_pkg:MyGen"`;
3. `module:Class` (dots after the colon reach nested attributes).

The class's `config_model` (a `GeneratorConfig` subclass; plain `GeneratorConfig` when it has
none, so unknown keys are still errors) validates the whole spec (`generator_config`, which the
run config uses, so a plugin's options are checked when the config is loaded), and the class is
built with the validated config, or with no argument if its constructor takes none. Whatever goes
wrong (an import error inside the plugin, a name that is not a class, a missing `name` or
`generate`, an invalid option) raises `GeneratorLoadError` (the same class as
`sentinel.plugins.PluginError`) naming the generator and, for options, the key.
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import ValidationError

from generators.base import GeneratorConfig, TaskGenerator
from generators.decompose import DecomposeGenerator
from generators.escalate import EscalateGenerator
from generators.fault import FaultGenerator
from generators.mutate import MutateGenerator
from generators.restart import RestartGenerator
from generators.teacher import TeacherGenerator
from sentinel.plugins import PluginError, resolve

ENTRY_POINT_GROUP = "sentinel.generators"
BUILTIN: dict[str, type] = {
    "mutate": MutateGenerator,
    "decompose": DecomposeGenerator,
    "escalate": EscalateGenerator,
    "teacher": TeacherGenerator,
    "fault": FaultGenerator,
    "restart": RestartGenerator,
}

# One error for every plugin kind; the old name stays for plugins and callers that catch it.
GeneratorLoadError = PluginError


def generator_class(type_name: str) -> type:
    """Resolve a generator's `type` to its class (see the module docstring for the order)."""
    return resolve("generator", type_name, BUILTIN, ENTRY_POINT_GROUP, required=("generate",))


def _config_errors(exc: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<spec>'}: {err['msg']}" for err in exc.errors()
    )
    return f"invalid config: {problems}"


def config_model_of(cls: type, type_name: str) -> type[GeneratorConfig]:
    """The config model of generator class `cls` (`GeneratorConfig` when it declares none)."""
    config_model = getattr(cls, "config_model", GeneratorConfig)
    if not (isinstance(config_model, type) and issubclass(config_model, GeneratorConfig)):
        raise GeneratorLoadError("generator", type_name,
                                 "config_model must be a GeneratorConfig subclass")
    return config_model


def generator_config(spec: Any) -> GeneratorConfig:
    """Validate `spec` (`{"type": ..., **options}`) with its generator's own config model.

    `GeneratorLoadError` if the type cannot be resolved; the config model's `ValidationError`
    (locations are keys of the spec) if an option is wrong."""
    if isinstance(spec, GeneratorConfig):
        return spec
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise GeneratorLoadError("generator", str(spec),
                                 "a generator spec needs a string 'type' (a built-in, an entry "
                                 "point of sentinel.generators, or module:Class)")
    return config_model_of(generator_class(spec["type"]), spec["type"]).model_validate(spec)


def load_generator(spec: dict[str, Any] | GeneratorConfig) -> TaskGenerator:
    """Build the generator described by `spec`: `{"type": ..., **options}`, or a config already
    validated by `generator_config` (as `SentinelConfig.generators` holds them)."""
    try:
        config = generator_config(spec)
    except ValidationError as exc:
        raise GeneratorLoadError("generator", spec["type"], _config_errors(exc)) from None
    type_name = config.type
    cls = generator_class(type_name)
    if not isinstance(config, config_model_of(cls, type_name)):
        config = config_model_of(cls, type_name).model_validate(config.model_dump())
    try:
        takes_config = bool(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        takes_config = True
    try:
        generator = cls(config) if takes_config else cls()
    except Exception as exc:  # a plugin's constructor failing is a load error
        raise GeneratorLoadError(
            "generator", type_name, f"{cls.__name__}(config) raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(getattr(generator, "name", None), str):
        raise GeneratorLoadError("generator", type_name, f"{cls.__name__} has no str `name`")
    return generator
