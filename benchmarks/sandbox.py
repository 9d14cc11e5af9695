"""The `python` tool's cost per call: the layers before the kernel filter against all of them.

`run_python("print(1)")` is timed `--calls` times in each of two configurations, interleaved
(old, new, old, new, ...) so that load changes hit both alike, after one warm-up call each:

- **old**: what the sandbox was before the kernel layer (`kernel_layer=False`): the process,
  the network namespace (root), resource limits, the uid drop (root) and the audit hook.
- **new**: the default (`kernel_layer=True`): the same plus the PID/IPC (and, not root, user)
  namespaces with `unshare --fork --kill-child`, the seccomp filter and the Landlock ruleset.

Prints the layers found, calls per second for each (calls / total wall time of those calls),
the median and minimum seconds per call, the ratio new/old of calls per second, and the load
average before and after (other work on the machine slows both).
Run: `.venv/bin/python benchmarks/sandbox.py [--calls 200]`; as a user who is not root, from
root: `setpriv --reuid=nobody --regid=nogroup --clear-groups env PYTHONPATH=$PWD /usr/bin/python3
benchmarks/sandbox.py` (the sandbox needs only the standard library). Not a test: it prints,
asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from sentinel.env.sandbox import available_layers, run_python


def _one(kernel_layer: bool) -> float:
    start = time.perf_counter()
    result = run_python("print(1)", kernel_layer=kernel_layer)
    wall = time.perf_counter() - start
    if result.status != "ok" or result.stdout != "1\n":
        raise SystemExit(f"the sandbox failed ({'new' if kernel_layer else 'old'}): {result}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per configuration")
    args = parser.parse_args()
    layers = available_layers()
    print("layers:", ", ".join(name for name, on in layers.items() if on))
    print("running as:", "root" if os.geteuid() == 0 else f"uid {os.geteuid()}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    times: dict[bool, list[float]] = {False: [], True: []}
    for kernel_layer in times:
        _one(kernel_layer)  # warm-up: page cache, the probes
    for _ in range(args.calls):
        for kernel_layer in times:
            times[kernel_layer].append(_one(kernel_layer))
    rate = {}
    for kernel_layer, label in ((False, "old (no kernel layer)"), (True, "new (kernel layer)")):
        walls = times[kernel_layer]
        rate[kernel_layer] = len(walls) / sum(walls)
        print(f"{label:24s} {rate[kernel_layer]:6.2f} calls/s  median "
              f"{statistics.median(walls):.4f} s  min {min(walls):.4f} s  ({len(walls)} calls)")
    print(f"ratio new/old calls/s: {rate[True] / rate[False]:.3f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
