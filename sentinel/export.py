"""`sentinel export`: a run's store in the formats other tools read.

Every exporter takes a `Store` and an output path, reads through one read-only connection (so it
can run beside a live loop, waiting out its commits like `sentinel sql`), and returns a one-line
summary. Heavy imports (`datasets`, `pyarrow`) happen inside the exporters so `sentinel --help`
stays instant. The registry is `EXPORTERS` (kind -> function).

- `parquet`: every table as `<out>/<table>.parquet` (DuckDB `COPY ... TO`, streamed; JSON columns
  are strings, lists are Parquet lists).
- `hf`: the `tasks` table as a `datasets.Dataset` saved with `save_to_disk(<out>)`. `prompt` is a
  list of `{role, content}` messages; `spec` stays JSON text because each family has its own
  fields, which one Arrow schema cannot hold.
- `dpo`: preference pairs in trl's conversational format, one JSON object per line in the file
  `<out>`: `{"prompt": [...], "chosen": [...], "rejected": [...]}`. Within one GRPO group (same
  `group_id`, `split = 'train'`) the i-th success (by `sample_idx`) is paired with the i-th failure,
  so each rollout is used at most once and a group of s successes and f failures gives min(s, f)
  pairs. `prompt` is the task's prompt; `chosen`/`rejected` are the rest of each conversation
  (assistant turns and tool observations, roles `assistant`/`tool`). Load it with
  `datasets.load_dataset("json", data_files=out)`.
- `verl`: the active tasks (origin `seed` or `generated`, never `eval`) as the Parquet file `<out>`
  in veRL's RL layout: `data_source` (`sentinel/<family>`), `prompt` (list of `{role, content}`),
  `ability` (the family), `reward_model` (`{style: "rule", ground_truth: answer}`), `extra_info`
  (`{task_id, family, spec, skills, split: "train", index}`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from task_store import Store
from task_store.schema import COLUMNS


class ExportError(RuntimeError):
    """The export cannot be written (bad output path, inconsistent rows); the message says why."""


def _out_dir(out: Path) -> Path:
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _out_file(out: Path) -> Path:
    if out.is_dir():
        raise ExportError(f"{out} is a folder; give a file path")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def export_parquet(store: Store, out: Path) -> str:
    """Write every table to `<out>/<table>.parquet`."""
    folder = _out_dir(out)
    counts = {}
    with store.connect(read_only=True) as con:
        for table in COLUMNS:
            path = str(folder / f"{table}.parquet").replace("'", "''")
            con.execute(f"COPY (SELECT * FROM {table}) TO '{path}' (FORMAT parquet)")
            counts[table] = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
    parts = ", ".join(f"{t}={n}" for t, n in counts.items())
    return f"wrote {len(counts)} tables to {folder} ({parts})"


_PROMPT_TYPE = "STRUCT(role VARCHAR, content VARCHAR)[]"


def export_hf(store: Store, out: Path) -> str:
    """Save the tasks as a `datasets.Dataset` at `out` (`datasets.load_from_disk(out)` reads it)."""
    import datasets

    cols = [name for name, _ in COLUMNS["tasks"]]
    select = ", ".join(
        f"prompt::{_PROMPT_TYPE} AS prompt" if c == "prompt" else
        f"{c}::VARCHAR AS {c}" if c == "spec" else c
        for c in cols
    )
    with store.connect(read_only=True) as con:
        table = con.sql(
            f"SELECT {select} FROM tasks ORDER BY created_round, task_id").to_arrow_table()
    dataset = datasets.Dataset(table)
    dataset.save_to_disk(str(_out_dir(out)))
    return f"wrote {dataset.num_rows} tasks to {out} (datasets.load_from_disk)"


_DPO_PAIRS = """\
WITH tr AS (
    SELECT group_id, task_id, success, messages,
           row_number() OVER (PARTITION BY group_id, task_id, success
                              ORDER BY sample_idx, traj_id) AS k
    FROM trajectories WHERE split = 'train'
)
SELECT c.group_id, t.prompt, c.messages AS chosen, r.messages AS rejected
FROM tr c
JOIN tr r ON r.group_id = c.group_id AND r.task_id = c.task_id AND r.k = c.k AND NOT r.success
JOIN tasks t ON t.task_id = c.task_id
WHERE c.success
ORDER BY c.group_id, c.k"""


def _continuation(messages: list[dict[str, Any]], prompt: list[dict[str, Any]],
                  group_id: str) -> list[dict[str, Any]]:
    if messages[: len(prompt)] != prompt:
        raise ExportError(f"a rollout of group {group_id} does not start with its task's prompt")
    return messages[len(prompt):]


def export_dpo(store: Store, out: Path) -> str:
    """Write success/failure pairs of the same GRPO group as JSONL at `out`."""
    path = _out_file(out)
    with store.connect(read_only=True) as con:
        rows = con.execute(_DPO_PAIRS).fetchall()
    with path.open("w", encoding="utf-8") as fh:
        for group_id, prompt_json, chosen_json, rejected_json in rows:
            prompt = json.loads(prompt_json)
            record = {
                "prompt": prompt,
                "chosen": _continuation(json.loads(chosen_json), prompt, group_id),
                "rejected": _continuation(json.loads(rejected_json), prompt, group_id),
            }
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    return f"wrote {len(rows)} preference pairs to {path} (JSONL: prompt, chosen, rejected)"


def verl_schema() -> Any:
    """The exact Arrow schema of the veRL export."""
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(message)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([
            ("task_id", pa.string()), ("family", pa.string()), ("spec", pa.string()),
            ("skills", pa.list_(pa.string())), ("split", pa.string()), ("index", pa.int64()),
        ])),
    ])


def export_verl(store: Store, out: Path) -> str:
    """Write the active (seed and generated) tasks as veRL RL Parquet at `out`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = _out_file(out)
    with store.connect(read_only=True) as con:
        tasks = con.execute(
            "SELECT task_id, family, spec::VARCHAR, prompt::VARCHAR, answer, skills FROM tasks "
            "WHERE origin IN ('seed', 'generated') ORDER BY created_round, task_id").fetchall()
    rows = [
        {
            "data_source": f"sentinel/{family}",
            "prompt": json.loads(prompt),
            "ability": family,
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"task_id": task_id, "family": family, "spec": spec,
                           "skills": list(skills or []), "split": "train", "index": index},
        }
        for index, (task_id, family, spec, prompt, answer, skills) in enumerate(tasks)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=verl_schema()), path)
    return f"wrote {len(rows)} tasks to {path} (veRL RL Parquet)"


EXPORTERS: dict[str, Callable[[Store, Path], str]] = {
    "parquet": export_parquet,
    "hf": export_hf,
    "dpo": export_dpo,
    "verl": export_verl,
}
