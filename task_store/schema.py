"""The Sentinel store schema (version 1), declared once.

`COLUMNS` is the single source of truth: the DDL strings below are rendered from it, and the store
derives the pyarrow schema of every columnar insert from it, so the two cannot drift. Column order
is the DDL order. No FOREIGN KEY constraints on purpose (they slow bulk ingest and complicate
deletion); the joins are documented in docs/schema.md. Bump `SCHEMA_VERSION` on any change.
"""

from __future__ import annotations

SCHEMA_VERSION = 1

COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "meta": (("key", "VARCHAR"), ("value", "VARCHAR")),
    "runs": (
        ("run_id", "VARCHAR"),
        ("created_at", "TIMESTAMP"),  # naive UTC
        ("config", "JSON"),
        ("schema_version", "INTEGER"),
    ),
    "rounds": (
        ("round", "INTEGER"),
        ("started_at", "TIMESTAMP"),  # naive UTC
        ("finished_at", "TIMESTAMP"),
        ("n_train_rollouts", "INTEGER"),
        ("train_success", "DOUBLE"),
        ("train_reward", "DOUBLE"),
        ("heldout_success", "DOUBLE"),
        ("heldout_greedy", "DOUBLE"),
        ("n_proposed", "INTEGER"),
        ("n_accepted", "INTEGER"),
        ("n_rejected", "INTEGER"),
        ("metrics", "JSON"),  # training metrics: loss, kl, clip fraction, ...
        ("timings", "JSON"),  # seconds per phase
    ),
    "tasks": (
        ("task_id", "VARCHAR"),
        ("family", "VARCHAR"),
        ("spec", "JSON"),
        ("prompt", "JSON"),
        ("answer", "VARCHAR"),
        ("skills", "VARCHAR[]"),
        ("difficulty", "DOUBLE"),
        ("origin", "VARCHAR"),  # seed | generated | eval
        ("created_round", "INTEGER"),
        ("parent_task_id", "VARCHAR"),
        ("failure_ids", "VARCHAR[]"),
        ("generator", "VARCHAR"),
    ),
    "trajectories": (
        ("traj_id", "VARCHAR"),
        ("round", "INTEGER"),
        ("split", "VARCHAR"),  # train | eval | probe
        ("task_id", "VARCHAR"),
        ("group_id", "VARCHAR"),
        ("sample_idx", "INTEGER"),
        ("messages", "JSON"),
        ("token_ids", "INTEGER[]"),
        ("loss_mask", "UTINYINT[]"),
        ("prompt_len", "INTEGER"),
        ("n_tokens", "INTEGER"),
        ("n_policy_tokens", "INTEGER"),
        ("n_turns", "INTEGER"),
        ("finish_reason", "VARCHAR"),
        ("answer", "VARCHAR"),
        ("reward", "DOUBLE"),
        ("reward_terms", "JSON"),
        ("success", "BOOLEAN"),
    ),
    "steps": (
        ("traj_id", "VARCHAR"),
        ("step", "INTEGER"),
        ("text", "VARCHAR"),
        ("kind", "VARCHAR"),
        ("tool", "VARCHAR"),
        ("arguments", "JSON"),
        ("observation", "VARCHAR"),
        ("error", "VARCHAR"),
        ("error_kind", "VARCHAR"),
        ("hallucinated", "BOOLEAN"),
        ("answer", "VARCHAR"),
    ),
    "failures": (
        ("failure_id", "VARCHAR"),
        ("traj_id", "VARCHAR"),
        ("task_id", "VARCHAR"),
        ("round", "INTEGER"),
        ("mode", "VARCHAR"),
        ("first_error_step", "INTEGER"),
        ("evidence", "VARCHAR"),
        ("skills", "VARCHAR[]"),
        ("family", "VARCHAR"),
    ),
    "rejections": (
        ("rejection_id", "VARCHAR"),
        ("round", "INTEGER"),
        ("generator", "VARCHAR"),
        ("family", "VARCHAR"),
        ("spec", "JSON"),
        ("reason", "VARCHAR"),
        ("detail", "VARCHAR"),
        ("parent_task_id", "VARCHAR"),
    ),
    "evals": (
        ("round", "INTEGER"),
        ("task_id", "VARCHAR"),
        ("k", "INTEGER"),
        ("successes", "INTEGER"),
        ("success_rate", "DOUBLE"),
        ("greedy_success", "BOOLEAN"),
    ),
}

PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    "meta": ("key",),
    "runs": ("run_id",),
    "rounds": ("round",),
    "tasks": ("task_id",),
    "trajectories": ("traj_id",),
    "steps": ("traj_id", "step"),
    "failures": ("failure_id",),
    "rejections": ("rejection_id",),
    "evals": ("round", "task_id"),
}


def table_ddl(table: str) -> str:
    """`CREATE TABLE IF NOT EXISTS` statement for one table of `COLUMNS`."""
    cols = [f"    {name} {type_}" for name, type_ in COLUMNS[table]]
    cols.append(f"    PRIMARY KEY ({', '.join(PRIMARY_KEYS[table])})")
    return f"CREATE TABLE IF NOT EXISTS {table} (\n" + ",\n".join(cols) + "\n)"


FAILURE_MODES_BY_ROUND_VIEW = """\
CREATE OR REPLACE VIEW failure_modes_by_round AS
WITH f AS (
    SELECT round, mode, count(*) AS n_failures FROM failures GROUP BY round, mode
), t AS (
    SELECT round, count(*) AS n_train FROM trajectories WHERE split = 'train' GROUP BY round
)
SELECT f.round, f.mode, f.n_failures,
       f.n_failures / NULLIF(t.n_train, 0) AS share_of_rollouts
FROM f LEFT JOIN t ON f.round = t.round
ORDER BY f.round, f.mode"""

TABLE_DDL: dict[str, str] = {table: table_ddl(table) for table in COLUMNS}
VIEW_DDL: tuple[str, ...] = (FAILURE_MODES_BY_ROUND_VIEW,)
DDL: tuple[str, ...] = (*TABLE_DDL.values(), *VIEW_DDL)
