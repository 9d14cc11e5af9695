"""Does training on one remedy unlearn another? For the held-out tasks whose remedy is to re-issue
the refused calculator call (timeout, rate_limit, truncated), classify what the policy did right
after the fault observation (`retry_copy.classify`: `same` expression, a `different` one, or
`none`) at the first and the last held-out eval, summed over the run directories of one arm.

A `different` retry is a miscopied call: the notation faults (`notation`, `colon`, `plus`,
`minus`) are remedied by rewriting the refused expression, so an arm that trains mostly on them
may learn to rewrite where it should copy.

Usage: python docs/results/recovery/retry_drift.py exposure=runs/tail/exposure-s{0,1,2,3,4} \
           failure=runs/tail/failure-s{0,1,2,3,4}
       (each argument NAME=DIR starts or continues the arm NAME; a bare DIR joins the last arm)
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict

import duckdb
from retry_copy import TYPES, classify

ROUNDS = "SELECT min(round), max(round) FROM trajectories WHERE split = 'eval'"
QUERY = """SELECT tr.round, tr.messages, t.skills FROM trajectories tr JOIN tasks t
USING (task_id) WHERE tr.split = 'eval' AND tr.round IN (?, ?)"""


def main(args: list[str]) -> None:
    arms: dict[str, list[str]] = defaultdict(list)
    name = ""
    for arg in args:
        if "=" in arg:
            name, arg = arg.split("=", 1)
        arms[name].append(arg)
    print("| arm | eval | retries | same | different | none | different share |")
    print("|---|---|---|---|---|---|---|")
    for name, run_dirs in arms.items():
        counts: dict[str, Counter] = defaultdict(Counter)
        for run_dir in run_dirs:
            con = duckdb.connect(f"{run_dir}/sentinel.duckdb", read_only=True)
            first, last = con.execute(ROUNDS).fetchone()
            for rnd, messages, skills in con.execute(QUERY, [first, last]).fetchall():
                fault = next((s.split(":", 1)[1] for s in skills if s.startswith("recover:")),
                             None)
                kind = classify(json.loads(messages)) if fault in TYPES else None
                if kind:
                    counts["first" if rnd == first else "last"][kind] += 1
            con.close()
        for when in ("first", "last"):
            c = counts[when]
            n = sum(c.values())
            print(f"| {name} | {when} | {n} | {c['same']} | {c['different']} | {c['none']} "
                  f"| {c['different'] / n if n else float('nan'):.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
