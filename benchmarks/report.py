"""`sentinel report` on a long run against a short one: does the page's cost stay flat as rounds
pile up (the plots are downsampled to `MAX_POINTS` points and `MAX_COLUMNS` heat-map columns)?

Builds two synthetic stores with tests/test_report.py's `synth_store` (bulk SQL, the same data a
real run's tables hold): `--small` rounds (default 10) and `--large` rounds (default 1,000). Each
report is built `--repeat` times, alternating small and large; prints the best time and page
size of each, the load average, and the ratio `large / small` (1.0 would be perfectly flat; the
store queries still grow with the rows). tests/test_report.py checks the same report without
timing it (its size and that every plot is downsampled).

Run: `.venv/bin/python benchmarks/report.py [--small 10] [--large 1000] [--repeat 3]`. Not a
test: it prints, asserts nothing. Timings need a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `tests` is not installed; its synthetic store is reused as is

from sentinel.report import build_report  # noqa: E402
from tests.test_report import synth_store  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--large", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sentinel-report-bench-") as tmp:
        runs = {}
        for rounds in (args.small, args.large):
            run_dir = Path(tmp) / f"r{rounds}"
            run_dir.mkdir()
            synth_store(run_dir / "sentinel.duckdb", rounds=rounds)
            runs[rounds] = run_dir
        best = {rounds: float("inf") for rounds in runs}
        size = {}
        for _ in range(args.repeat):
            for rounds, run_dir in runs.items():
                start = time.perf_counter()
                page = build_report(run_dir, run_dir / "report.html")
                best[rounds] = min(best[rounds], time.perf_counter() - start)
                size[rounds] = page.stat().st_size
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"best of {args.repeat}:")
    for rounds in runs:
        print(f"  {rounds:5d} rounds: {best[rounds]:6.2f} s, {size[rounds] / 1e6:5.2f} MB")
    print(f"large / small: {best[args.large] / best[args.small]:.2f}x time, "
          f"{size[args.large] / size[args.small]:.2f}x size")


if __name__ == "__main__":
    main()
