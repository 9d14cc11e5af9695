"""Where the held-out fault episodes of a run fail: at the remedy itself, or after it.

For every held-out rollout of a task carrying a fault (`recover:<type>`), at round 0 and at the
given round (default: the run's last), the first tool observation that is a fault is located and
the policy's next call is checked against the type's remedy:

- `timeout`, `truncated`: the next call re-issues the faulted call's expression verbatim;
- `renamed`: it calls `calc` with the faulted call's expression;
- `rate_limit`: it calls `wait`, and the call after that re-issues the faulted expression;
- `notation`: it re-issues the refused expression with `*` for `x`. A policy that writes `*`
  itself never meets the refusal: `no fault met`.

Each rollout is counted as `remedy right` or `remedy wrong` (a wrong re-issued call is nearly
always a miscopied operand or operator), then `passed` or `failed`; `failed before the fault`
where the policy never reached the faulted call. Those counts show whether training changes the
remedy (what GRPO is asked to teach) or only what follows it.

Usage: python docs/results/recovery/remedy_steps.py [--round N] RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from demo_by_type import compared_round, parse_args  # beside this script

from task_store import Store

CALL = re.compile(r'"name": "([^"]*)", "arguments": (\{.*\})\}?</tool_call>')
FAULT_TEXT = ("timed out", "rate limit", "(renamed)", "[truncated]", "write multiplication")
COLUMNS = ("remedy right, passed", "remedy right, failed", "remedy wrong, passed",
           "remedy wrong, failed", "failed before the fault", "no fault met")


def _call(text: str) -> tuple[str | None, str | None]:
    m = CALL.search(text)
    return (m.group(1), m.group(2)) if m else (None, None)


def classify(fault_type: str, messages: list[dict], success: bool) -> str:
    """One of `COLUMNS` for a held-out rollout of a task carrying `fault_type`."""
    at = next((i for i, m in enumerate(messages)
               if m["role"] == "tool" and any(t in m["content"] for t in FAULT_TEXT)), None)
    if at is None:
        return "no fault met" if success else "failed before the fault"
    _, faulted = _call(messages[at - 1]["content"])
    name, expr = _call(messages[at + 1]["content"]) if at + 1 < len(messages) else (None, None)
    if fault_type in ("timeout", "truncated"):
        right = name == "calculator" and expr == faulted
    elif fault_type == "renamed":
        right = name == "calc" and expr == faulted
    elif fault_type == "rate_limit":
        again = _call(messages[at + 3]["content"]) if at + 3 < len(messages) else (None, None)
        right = name == "wait" and again[1] == faulted
    else:  # notation: the refused `x` re-issued as `*`
        right = name == "calculator" and faulted is not None and expr == faulted.replace("x", "*")
    return f"remedy {'right' if right else 'wrong'}, {'passed' if success else 'failed'}"


def counts(store: Store, round_: int) -> dict[str, Counter]:
    _, rows = store.query(
        "SELECT k.skills, t.messages, t.success FROM trajectories t JOIN tasks k USING (task_id) "
        "WHERE t.round = ? AND t.split = 'eval'", [round_])
    out: dict[str, Counter] = defaultdict(Counter)
    for skills, messages, success in rows:
        types = [s.removeprefix("recover:") for s in skills if s.startswith("recover:")]
        if types:
            msgs = json.loads(messages) if isinstance(messages, str) else messages
            out[types[0]][classify(types[0], msgs, bool(success))] += 1
    return out


def main(run_dirs: list[str], at: int | None = None) -> None:
    print(f"{'run':<28} {'type':<11} {'round':>5}  " + "  ".join(f"{c:>12}" for c in
                                                               ("right/pass", "right/fail",
                                                                "wrong/pass", "wrong/fail",
                                                                "before", "no fault")))
    for run_dir in run_dirs:
        store = Store(Path(run_dir) / "sentinel.duckdb")
        last = compared_round(store, at)
        first, final = counts(store, 0), counts(store, last)
        for fault_type in sorted(first):
            for r, table in ((0, first), (last, final)):
                cells = "  ".join(f"{table[fault_type][c]:>12}" for c in COLUMNS)
                print(f"{Path(run_dir).name:<28} {fault_type:<11} {r:>5}  {cells}")


if __name__ == "__main__":
    main(*parse_args(sys.argv[1:]))
