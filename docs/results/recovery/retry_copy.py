"""What the policy does right after a fault observation, from a run's stored training rollouts:
for tasks carrying a fault of type timeout, rate_limit or truncated (remedy: re-issue the same
calculator call, after `wait` for a rate limit), classify the first calculator call after the
fault observation as `same` (the refused expression, copied), `different` (another expression),
or `none` (no further calculator call: answered, or gave up), per fault type, for the first and
last training rounds. Notation and renamed faults are left out: their remedy changes the call.

Usage: python docs/results/recovery/retry_copy.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import duckdb

TYPES = ("timeout", "rate_limit", "truncated")


def call_of(msg: dict) -> tuple[str, str] | None:
    """(tool name, expression) of an assistant message's tool call, from its hermes text."""
    text = msg.get("content") or ""
    start = text.find("<tool_call>")
    end = text.find("</tool_call>")
    if start < 0 or end < 0:
        return None
    try:
        call = json.loads(text[start + len("<tool_call>"):end])
        args = call.get("arguments") or {}
        return str(call.get("name")), str(args.get("expression", ""))
    except (ValueError, AttributeError):
        return None


def classify(messages: list[dict]) -> str | None:
    for i, msg in enumerate(messages):
        if msg["role"] != "tool" or not str(msg.get("content", "")).startswith("Error"):
            continue
        refused = call_of(messages[i - 1]) if i else None
        if refused is None or refused[0] != "calculator":
            return None
        for later in messages[i + 1:]:
            if later["role"] != "assistant":
                continue
            call = call_of(later)
            if call and call[0] == "calculator":
                return "same" if call[1].replace(" ", "") == refused[1].replace(" ", "") \
                    else "different"
        return "none"
    return None


def main(runs: list[Path]) -> None:
    print("run | fault | round | success | same | different | none")
    for run in runs:
        con = duckdb.connect(str(run / "sentinel.duckdb"), read_only=True)
        rounds = [r for (r,) in con.execute(
            "SELECT DISTINCT round FROM trajectories WHERE split = 'train' ORDER BY 1").fetchall()]
        for r in (rounds[0], rounds[-1]):
            counts: dict[tuple[str, bool], Counter] = defaultdict(Counter)
            for messages, skills, success in con.execute(
                    "SELECT tr.messages, t.skills, tr.success FROM trajectories tr JOIN tasks t "
                    "USING (task_id) WHERE tr.split = 'train' AND tr.round = ?", [r]).fetchall():
                fault = next((s.split(":", 1)[1] for s in skills if s.startswith("recover:")),
                             None)
                if fault not in TYPES:
                    continue
                kind = classify(json.loads(messages))
                if kind:
                    counts[(fault, bool(success))][kind] += 1
            for (fault, success), c in sorted(counts.items()):
                print(f"{run.name} | {fault} | {r} | {success} | {c['same']} | {c['different']} "
                      f"| {c['none']}")
        con.close()


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
