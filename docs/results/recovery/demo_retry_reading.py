"""What the failed held-out rollouts of one eval round do right after their fault observation, for
the retry faults: `timeout` and `truncated` (remedy: re-issue the same calculator call) are split
into `same call` (the refused call, copied exactly), `operands changed` (another calculator
call), `answers` and `other`; `rate_limit` (remedy: `wait` with the hinted seconds, then the call
again) into `wait right`, `wait garbled` (a wait call whose JSON or argument is broken) and
`other`. retry_copy.py does the same for training rollouts, failed or not.

Usage: python docs/results/recovery/demo_retry_reading.py RUN_DIR [ROUND]   (default: last round)
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import duckdb

FAULT_MARKS = ("timed out", "rate limit", "[truncated]")
QUERY = """
SELECT json_extract_string(k.spec, '$.faults[0].type') AS fault, t.messages
FROM trajectories t JOIN tasks k USING (task_id)
WHERE t.split = 'eval' AND t.round = ? AND NOT t.success
  AND json_extract_string(k.spec, '$.faults[0].type') IN ('timeout', 'truncated', 'rate_limit')"""


def first_move(fault: str, messages: list[dict]) -> str:
    at = next((i for i, m in enumerate(messages)
               if m["role"] == "tool" and any(k in m["content"] for k in FAULT_MARKS)), None)
    if at is None:
        return "fault not reached"
    after = messages[at + 1]["content"] if at + 1 < len(messages) else ""
    if fault == "rate_limit":
        if '"name": "wait"' in after and '"seconds": 2}' in after:
            return "wait right"
        return "wait garbled" if "wait" in after or "sec" in after else "other"
    if after.strip() == messages[at - 1]["content"].strip():
        return "same call"
    if '"calculator"' in after:
        return "operands changed"
    return "answers" if "<answer>" in after else "other"


def main(run_dir: str, round_: int | None) -> None:
    con = duckdb.connect(f"{run_dir}/sentinel.duckdb", read_only=True)
    if round_ is None:
        last = "SELECT max(round) FROM trajectories WHERE split = 'eval'"
        round_ = con.execute(last).fetchone()[0]
    counts = Counter((fault, first_move(fault, json.loads(messages)))
                     for fault, messages in con.execute(QUERY, [round_]).fetchall())
    print(f"{run_dir}, round {round_}: failed held-out rollouts by the first move after the fault")
    for (fault, move), n in sorted(counts.items()):
        print(f"  {fault:<11} {move:<17} {n}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
