"""Which shapes of a fault type a run trained on, and how its rollouts on them ended.

For one fault type (default `rate_limit`), every rollout on a task carrying it, grouped by split
(train / eval), the task's generator (`base`: a draw from the base distribution), the task's shape
(operators in the expression, the call the fault hits) and what happened:

- `success`;
- `never-met`: failed before the fault's call;
- `met-not-recovered`: met the fault (a tool error) and made no successful call after it before
  its first erroneous step;
- `recovered-then-failed`: made a successful call after the fault, then failed (a copy error
  further on: what `fault` does not mine, `recovered` in generators/fault.py).

Usage: python docs/results/recovery/fault_shapes.py RUN_DIR [FAULT_TYPE]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import duckdb


def main(run_dir: str, fault: str = "rate_limit") -> None:
    con = duckdb.connect(str(Path(run_dir) / "sentinel.duckdb"), read_only=True)
    skill = f"recover:{fault}"
    rows = con.execute(
        "SELECT t.traj_id, t.split, coalesce(k.generator, 'base'), t.success, k.spec, "
        "f.first_error_step FROM trajectories t JOIN tasks k USING (task_id) "
        "LEFT JOIN failures f USING (traj_id) WHERE list_contains(k.skills, ?)", [skill]).fetchall()
    steps: dict[str, list[tuple]] = {}
    for traj, idx, kind, tool, err, err_kind in con.execute(
            "SELECT s.traj_id, s.step, s.kind, s.tool, s.error, s.error_kind FROM steps s "
            "JOIN trajectories t USING (traj_id) JOIN tasks k USING (task_id) "
            "WHERE list_contains(k.skills, ?) ORDER BY s.traj_id, s.step", [skill]).fetchall():
        steps.setdefault(traj, []).append((idx, kind, tool, err, err_kind))
    counts: Counter = Counter()
    for traj, split, generator, ok, spec, first in rows:
        spec = json.loads(spec)
        ops = sum(spec["expr"].count(c) for c in "+-*/x")
        call = next((f["call"] for f in spec.get("faults", []) if f["type"] == fault), None)
        met = recovered = False
        for idx, kind, tool, err, err_kind in steps.get(traj, []):
            if first is not None and idx >= first:
                break
            is_fault = err is not None and err_kind != "parse"
            if met and not is_fault and kind == "tool_call" and tool != "wait":
                recovered = True
                break
            met = met or is_fault
        state = ("success" if ok else "recovered-then-failed" if recovered
                 else "met-not-recovered" if met else "never-met")
        counts[(split, generator, ops, call, state)] += 1
    print(f"{run_dir}: rollouts on {skill} tasks by split, generator, operators, fault call, end")
    print(f"{'split':6s} {'generator':9s} {'ops':>3s} {'call':>4s} {'end':22s} {'n':>5s}")
    for key in sorted(counts, key=lambda k: tuple(str(x) for x in k)):
        split, gen, ops, call, state = key
        print(f"{split:6s} {gen:9s} {ops:3d} {call!s:>4s} {state:22s} {counts[key]:5d}")


if __name__ == "__main__":
    main(*sys.argv[1:])
