"""Print the package's dependencies pinned at their lower bounds (`name>=X` -> `name==X`), one per
line, for `make lower-bounds`: the environment that shows the declared ranges are true.

torch is left out (the Makefile installs the CPU build first, at its lower bound); a dependency
without a `>=` bound is an error, so every range in pyproject.toml is one that gets tested.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

SKIP = {"torch"}


def lower_bounds(pyproject: Path) -> list[str]:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    pins = []
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)", dep.strip())
        if not m:
            raise SystemExit(f"pyproject.toml: {dep!r} has no plain `>=` lower bound to test")
        if m.group(1).lower() not in SKIP:
            pins.append(f"{m.group(1)}=={m.group(2)}")
    return pins


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    print("\n".join(lower_bounds(root / "pyproject.toml")))
