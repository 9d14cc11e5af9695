"""Task generators: turn failures into new, verified training tasks.

- `base`: the `TaskGenerator` protocol, `GenerationContext`, `GeneratorConfig`, `BaseGenerator`;
- `registry`: `load_generator` (built-ins, entry points `sentinel.generators`, `module:Class`);
- `mutate`: the built-in `mutate` generator;
- `validate`: the pipeline every candidate passes (`validate_candidates`);
- `run`: `run_generators`, which isolates faulty or slow generators.

See docs/generators.md for the plugin guide.
"""

from generators.base import BaseGenerator, GenerationContext, GeneratorConfig, TaskGenerator
from generators.mutate import MutateConfig, MutateGenerator
from generators.registry import (
    BUILTIN,
    ENTRY_POINT_GROUP,
    GeneratorLoadError,
    generator_class,
    load_generator,
)
from generators.run import run_generators
from generators.validate import REJECTION_REASONS, validate_candidates

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "REJECTION_REASONS",
    "BaseGenerator",
    "GenerationContext",
    "GeneratorConfig",
    "GeneratorLoadError",
    "MutateConfig",
    "MutateGenerator",
    "TaskGenerator",
    "generator_class",
    "load_generator",
    "run_generators",
    "validate_candidates",
]
