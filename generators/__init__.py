"""Task generators: turn failures into new, verified training tasks.

- `base`: the `TaskGenerator` protocol, `GenerationContext`, `GeneratorConfig`, `BaseGenerator`,
  `Unparseable`, `Replay`;
- `registry`: `load_generator` (built-ins, entry points `sentinel.generators`, `module:Class`);
- built-ins: `mutate`, `decompose`, `escalate`, `teacher`, `restart`;
- `validate`: the pipeline every candidate passes (`validate_candidates`, `probe_tasks`);
- `run`: `run_generators`, which isolates faulty or slow generators and runs the probe.

See docs/generators.md for the plugin guide.
"""

from generators.base import (
    BaseGenerator,
    GenerationContext,
    GeneratorConfig,
    Replay,
    TaskGenerator,
    Unparseable,
)
from generators.decompose import DecomposeConfig, DecomposeGenerator
from generators.escalate import EscalateConfig, EscalateGenerator
from generators.mutate import MutateConfig, MutateGenerator
from generators.registry import (
    BUILTIN,
    ENTRY_POINT_GROUP,
    GeneratorLoadError,
    generator_class,
    load_generator,
)
from generators.restart import RestartConfig, RestartGenerator
from generators.run import run_generators
from generators.teacher import TeacherConfig, TeacherGenerator, parse_specs
from generators.validate import REJECTION_REASONS, probe_tasks, validate_candidates

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "REJECTION_REASONS",
    "BaseGenerator",
    "DecomposeConfig",
    "DecomposeGenerator",
    "EscalateConfig",
    "EscalateGenerator",
    "GenerationContext",
    "GeneratorConfig",
    "GeneratorLoadError",
    "MutateConfig",
    "MutateGenerator",
    "Replay",
    "RestartConfig",
    "RestartGenerator",
    "TaskGenerator",
    "TeacherConfig",
    "TeacherGenerator",
    "Unparseable",
    "generator_class",
    "load_generator",
    "parse_specs",
    "probe_tasks",
    "run_generators",
    "validate_candidates",
]
