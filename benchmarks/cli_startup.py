"""How long `sentinel --help` takes to answer, against a bare interpreter's start-up and against
importing torch (what the CLI keeps out of its import path).

Three commands are run `--repeat` times each, interleaved (A B C A B C ...) so a change in the
machine's load hits them alike: `python -c pass`, `python -m sentinel --help` and
`python -c "import torch"`. Prints the median wall time of each, the load average, and the
ratios `help / bare python` and `help / import torch`. A help that stays a small multiple of
bare start-up and well under torch's import is what tests/test_cli_fast.py guards without
timing (the help imports neither torch nor transformers).

Run: `.venv/bin/python benchmarks/cli_startup.py [--repeat 7]`. Not a test: it prints, asserts
nothing. Timings need a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "bare python": ["-c", "pass"],
    "sentinel --help": ["-m", "sentinel", "--help"],
    "import torch": ["-c", "import torch"],
}


def wall(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    for argv in COMMANDS.values():  # warm the file cache once
        wall(argv)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeat):
        for name, argv in COMMANDS.items():
            times[name].append(wall(argv))
    median = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"{args.repeat} runs each, median wall time:")
    for name, t in median.items():
        print(f"  {name:16} {t * 1000:8.0f} ms")
    print(f"help / bare python: {median['sentinel --help'] / median['bare python']:.2f}x")
    print(f"help / import torch: {median['sentinel --help'] / median['import torch']:.2f}x")


if __name__ == "__main__":
    main()
