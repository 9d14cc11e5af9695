"""The layering of the design, enforced: each package imports downward only.

    sentinel.cli → sentinel.loop → {trainers, generators, task_store, sentinel.env,
                                    sentinel.rollout}

`task_store` imports nothing of the others; `generators` and `trainers` see only the types in
`sentinel.tasks` / `sentinel.types`; the environment, rollout backends and task families sit
below the loop. Every module is parsed with `ast`, so imports inside functions count as much as
those at the top (a lazy import is still a dependency), and so do `importlib.import_module("...")`
calls with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sentinel", "task_store", "generators", "trainers")

# Module prefix -> the only Sentinel modules (prefixes) it may import. The most specific prefix
# of a module decides; a module under none of them may import anything except what `ABOVE`
# reserves. `sentinel.types` and `sentinel.plugins` (plugin resolution) are leaves that import
# nothing of Sentinel, so every layer but the store may use them.
ALLOWED: dict[str, tuple[str, ...]] = {
    "task_store": ("task_store",),
    "sentinel.types": (),
    "sentinel.plugins": (),
    "generators": ("generators", "sentinel.tasks", "sentinel.types", "sentinel.plugins"),
    "trainers": ("trainers", "sentinel.tasks", "sentinel.types", "sentinel.plugins"),
    "sentinel.env": ("sentinel.env", "sentinel.types", "sentinel.plugins"),
    "sentinel.tasks": ("sentinel.tasks", "sentinel.env", "sentinel.types", "sentinel.plugins"),
    "sentinel.rewards": ("sentinel.rewards", "sentinel.tasks", "sentinel.types"),
    "sentinel.rollout": ("sentinel.rollout", "sentinel.env", "sentinel.tasks", "sentinel.rewards",
                         "sentinel.types", "sentinel.plugins"),
}
# The top of the stack: module -> the only modules that may import it.
ABOVE: dict[str, tuple[str, ...]] = {
    "sentinel.cli": ("sentinel.__main__",),
    "sentinel.loop": ("sentinel.cli", "sentinel.bench"),
}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """Every Sentinel module `path` imports, wherever the import statement stands."""
    return imports_in(_module_name(path), path.read_text(), is_package=path.name == "__init__.py")


def imports_in(module: str, source: str, *, is_package: bool = False) -> set[str]:
    """Every Sentinel module that `source`, the text of `module`, imports."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                # `from sentinel import loop` imports the module sentinel.loop.
                sub = f"{base}.{alias.name}"
                found.add(sub if _is_module(sub) else base)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "__import__"))):
            found.add(node.args[0].value.partition(":")[0])
    return {name for name in found if name.split(".")[0] in PACKAGES}


def violations(modules: dict[str, set[str]]) -> list[str]:
    """`importer -> imported (rule)` for every import that breaks the layering; `modules` maps
    each module to what it imports."""
    broken = []
    for module, imports in sorted(modules.items()):
        owner = max((p for p in ALLOWED if _within(module, p)), key=len, default=None)
        for imported in sorted(imports):
            if owner and not any(_within(imported, ok) for ok in ALLOWED[owner]):
                broken.append(f"{module} -> {imported} ({owner} may import only "
                              f"{', '.join(ALLOWED[owner]) or 'outside Sentinel'})")
            for top, importers in ABOVE.items():
                if (_within(imported, top) and not _within(module, top)
                        and not any(_within(module, i) for i in importers)):
                    broken.append(f"{module} -> {imported} (only {', '.join(importers)} "
                                  f"may import {top})")
    return broken


def _sources() -> dict[str, set[str]]:
    paths = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    return {_module_name(p): imports_of(p) for p in paths}


def test_every_package_imports_downward_only():
    sources = _sources()
    assert "generators.teacher" in sources and "task_store.store" in sources
    assert violations(sources) == []


def test_no_two_modules_import_each_other():
    """No import cycle of two modules (e.g. `task_store.migrations` ⇄ `task_store.store`: now
    `migrations` holds the frozen SQL and `upgrade`, `store` uses it, and the command that opens a
    `Store` to upgrade it is `task_store.upgrade`)."""
    sources = _sources()
    assert "task_store.store" not in sources["task_store.migrations"]
    mutual = sorted((a, b) for a, imports in sources.items() for b in imports
                    if a < b and a in sources.get(b, ()))
    assert mutual == []


@pytest.mark.parametrize("source, bad", [
    # A function-level import of a trainer inside a generator (what generators/teacher.py did).
    ("def build():\n    from trainers.sft import SFTTrainer\n", "trainers.sft"),
    ("import sentinel.policy\n", "sentinel.policy"),
    ("from sentinel import analyzer\n", "sentinel.analyzer"),
    ("import importlib\nimportlib.import_module('task_store.store')\n", "task_store.store"),
    ("from ..trainers import sft\n", "trainers.sft"),
    ("from sentinel.loop import Loop\n", "sentinel.loop"),
])
def test_the_contract_catches_a_generator_reaching_sideways(source, bad):
    """The checker itself can fail: a generator module with a forbidden import is reported."""
    found = violations({"generators.probe": imports_in("generators.probe", source)})
    assert any(f"-> {bad} " in v for v in found), found


def test_the_contract_catches_the_store_importing_the_engine():
    source = "def f():\n    from sentinel.types import Task\n"
    assert violations({"task_store.probe": imports_in("task_store.probe", source)}) == [
        "task_store.probe -> sentinel.types (task_store may import only task_store)"
    ]


def test_only_the_cli_reaches_the_loop():
    source = "from sentinel.loop import Loop\n"
    assert violations({"sentinel.report": imports_in("sentinel.report", source)}) == [
        "sentinel.report -> sentinel.loop (only sentinel.cli, sentinel.bench may import "
        "sentinel.loop)"
    ]
