"""The example plugin package (examples/sentinel-generator-example) installed for real with pip,
found by its `sentinel.generators` entry point, and run on real failures next to a broken
generator.

The package is copied to a temporary directory (so the build leaves nothing in the repository)
and installed with `pip install --no-deps --no-build-isolation --target <tmp>/site`: nothing is
downloaded and the venv is untouched. Putting that directory on `sys.path` makes its
`.dist-info/entry_points.txt` visible to `importlib.metadata`, exactly as an installed package's.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from generators import GenerationContext, load_generator, run_generators
from sentinel.config import ConfigError, load_config
from sentinel.tasks import load_family
from sentinel.types import Candidate, Failure

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sentinel-generator-example"
ARITH = load_family("arith")


class Broken:
    name = "broken"

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        raise ZeroDivisionError("a plugin bug")


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    source = shutil.copytree(EXAMPLE, tmp_path / "src")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(source)],
        check=True, capture_output=True, text=True, timeout=120,
    )
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("sentinel_generator_example", None)


@pytest.mark.slow
def test_installed_plugin_runs_next_to_a_broken_one(installed: Path):
    assert list(installed.glob("sentinel_generator_example-*.dist-info/entry_points.txt"))
    example = load_generator({"type": "example", "per_failure": 2})
    assert type(example).__module__ == "sentinel_generator_example"
    assert example.config.per_failure == 2
    # The run config validates the plugin's entry with its own model when it loads, and stores
    # every option (the plugin's defaults too).
    cfg = load_config(data={"generators": [{"type": "example", "per_failure": 3}]})
    assert cfg.model_dump(mode="json")["generators"] == [
        {"type": "example", "max_candidates": 32, "per_failure": 3, "tries": 200}]
    with pytest.raises(ConfigError, match=r"generators\.0\.per_failure"):
        load_config(data={"generators": [{"type": "example", "per_failure": 0}]})

    tasks = [ARITH.make_task({"expr": e}) for e in ("3+4*2", "9-5")]
    failures = [Failure(f"traj-{i}", t.task_id, 2, "wrong_answer", 1, "", t.skills, "arith")
                for i, t in enumerate(tasks)]
    ctx = GenerationContext(round=3, failures=failures, tasks={t.task_id: t for t in tasks},
                            families={"arith": ARITH}, rng=random.Random(0), budget=16)

    def known(ids: Iterable[str]) -> set[str]:
        return set()

    accepted, rejections, stats = run_generators([Broken(), example], ctx, known_task_ids=known)
    assert stats["broken"]["errors"] == 1
    assert "ZeroDivisionError" in next(r.detail for r in rejections if r.generator == "broken")
    assert stats["example"]["errors"] == 0 and stats["example"]["accepted"] == len(accepted) >= 3
    parents = {t.task_id: t for t in tasks}
    for task in accepted:
        assert task.generator == "example" and task.origin == "generated"
        assert task.skills == parents[task.parent_task_id].skills  # what the plugin promises
        assert task.target_cluster_id in {f.cluster_id for f in failures}
