"""In-place upgrades of store files written by older schema versions.

Design: each step is frozen SQL text keyed by the version it upgrades FROM (`MIGRATIONS[1]` turns
a version-1 file into version 2). Steps never read `task_store.schema`, which describes only the
current version, so an old step keeps meaning what it meant when it was written. `upgrade` runs
the steps in order inside the caller's transaction, then re-creates every view from the current
`schema.VIEW_DDL` (views hold no data, so they are simply replaced) and records the new version in
`meta`. `V1_DDL` is the complete version-1 schema, frozen, so tests can build a genuine old file.

Who upgrades: `Store` upgrades an older file the first time it opens it for writing (`Store.create`,
`record_round`, `Store.upgrade`). A read-only open refuses an older file with a
`SchemaVersionError` that says how to upgrade (`python -m task_store.upgrade RUN_DIR`), so
read-only tools such as `sentinel sql` never write, not even a schema change. This module imports
only `schema`: `store` imports it, never the other way round (the command that opens a `Store` to
upgrade it is `task_store.upgrade`).
"""

from __future__ import annotations

from datetime import UTC, datetime

import duckdb

from task_store.schema import SCHEMA_VERSION, VIEW_DDL

V1_DDL: tuple[str, ...] = (
    "CREATE TABLE meta (key VARCHAR, value VARCHAR, PRIMARY KEY (key))",
    "CREATE TABLE runs (run_id VARCHAR, created_at TIMESTAMP, config JSON, schema_version INTEGER,"
    " PRIMARY KEY (run_id))",
    "CREATE TABLE rounds (round INTEGER, started_at TIMESTAMP, finished_at TIMESTAMP,"
    " n_train_rollouts INTEGER, train_success DOUBLE, train_reward DOUBLE, heldout_success DOUBLE,"
    " heldout_greedy DOUBLE, n_proposed INTEGER, n_accepted INTEGER, n_rejected INTEGER,"
    " metrics JSON, timings JSON, PRIMARY KEY (round))",
    "CREATE TABLE tasks (task_id VARCHAR, family VARCHAR, spec JSON, prompt JSON, answer VARCHAR,"
    " skills VARCHAR[], difficulty DOUBLE, origin VARCHAR, created_round INTEGER,"
    " parent_task_id VARCHAR, failure_ids VARCHAR[], generator VARCHAR, PRIMARY KEY (task_id))",
    "CREATE TABLE trajectories (traj_id VARCHAR, round INTEGER, split VARCHAR, task_id VARCHAR,"
    " group_id VARCHAR, sample_idx INTEGER, messages JSON, token_ids INTEGER[],"
    " loss_mask UTINYINT[], prompt_len INTEGER, n_tokens INTEGER, n_policy_tokens INTEGER,"
    " n_turns INTEGER, finish_reason VARCHAR, answer VARCHAR, reward DOUBLE, reward_terms JSON,"
    " success BOOLEAN, PRIMARY KEY (traj_id))",
    "CREATE TABLE steps (traj_id VARCHAR, step INTEGER, text VARCHAR, kind VARCHAR, tool VARCHAR,"
    " arguments JSON, observation VARCHAR, error VARCHAR, error_kind VARCHAR, hallucinated BOOLEAN,"
    " answer VARCHAR, PRIMARY KEY (traj_id, step))",
    "CREATE TABLE failures (failure_id VARCHAR, traj_id VARCHAR, task_id VARCHAR, round INTEGER,"
    " mode VARCHAR, first_error_step INTEGER, evidence VARCHAR, skills VARCHAR[], family VARCHAR,"
    " PRIMARY KEY (failure_id))",
    "CREATE TABLE rejections (rejection_id VARCHAR, round INTEGER, generator VARCHAR,"
    " family VARCHAR, spec JSON, reason VARCHAR, detail VARCHAR, parent_task_id VARCHAR,"
    " PRIMARY KEY (rejection_id))",
    "CREATE TABLE evals (round INTEGER, task_id VARCHAR, k INTEGER, successes INTEGER,"
    " success_rate DOUBLE, greedy_success BOOLEAN, PRIMARY KEY (round, task_id))",
    "CREATE OR REPLACE VIEW failure_modes_by_round AS"
    " WITH f AS (SELECT round, mode, count(*) AS n_failures FROM failures GROUP BY round, mode),"
    " t AS (SELECT round, count(*) AS n_train FROM trajectories WHERE split = 'train'"
    " GROUP BY round)"
    " SELECT f.round, f.mode, f.n_failures, f.n_failures / NULLIF(t.n_train, 0)"
    " AS share_of_rollouts FROM f LEFT JOIN t ON f.round = t.round ORDER BY f.round, f.mode",
    "INSERT INTO meta VALUES ('schema_version', '1')",
)

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "ALTER TABLE tasks ADD COLUMN target_cluster_id VARCHAR",
        "ALTER TABLE tasks ADD COLUMN probe_pass_rate DOUBLE",
        "ALTER TABLE failures ADD COLUMN cluster_id VARCHAR",
        # Backfill with the id `sentinel.types.cluster_id_for` gives: 'cl-' + sha256 of the
        # canonical JSON [family, sorted skills, mode], first 12 hex digits.
        "UPDATE failures SET cluster_id = 'cl-' || "
        "sha256(json_array(family, list_sort(skills), mode)::VARCHAR)[:12]",
        "CREATE TABLE clusters (round INTEGER, cluster_id VARCHAR, family VARCHAR,"
        " skills VARCHAR[], mode VARCHAR, n_failures INTEGER, share DOUBLE, trend DOUBLE,"
        " exemplar_traj_ids VARCHAR[], summary VARCHAR, PRIMARY KEY (round, cluster_id))",
    ),
    # Views only: `failure_patterns.trend` is now the stored `clusters.trend` (re-created below).
    2: (),
    # Views only: the `recovery_rates` view, and `failure_patterns` gains `fault_type`,
    # `recovery_rate`, `train_recovery_rate` (appended; re-created below).
    3: (),
    # Tasks that start from a revealed prefix. Steps stored before were all the policy's own;
    # their turn was not recorded (NULL).
    4: (
        "ALTER TABLE tasks ADD COLUMN prefix JSON",
        "ALTER TABLE steps ADD COLUMN turn INTEGER",
        "ALTER TABLE steps ADD COLUMN revealed BOOLEAN",
        "UPDATE steps SET revealed = false",
    ),
    # Tasks whose first policy turn starts with a revealed part (`tasks.hint`).
    5: ("ALTER TABLE tasks ADD COLUMN hint VARCHAR",),
}


def upgrade(con: duckdb.DuckDBPyConnection, from_version: int) -> None:
    """Upgrade the file behind `con` from `from_version` to `SCHEMA_VERSION`, inside the caller's
    transaction (so a failed step leaves the file as it was). Keeps every row."""
    if not 1 <= from_version <= SCHEMA_VERSION:
        raise ValueError(f"cannot upgrade from schema version {from_version}")
    for version in range(from_version, SCHEMA_VERSION):
        for statement in MIGRATIONS[version]:
            con.execute(statement)
    for ddl in VIEW_DDL:
        con.execute(ddl)
    now = datetime.now(UTC).replace(tzinfo=None).isoformat(timespec="seconds")
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])
    con.execute(
        "INSERT OR REPLACE INTO meta VALUES (?, ?)",
        [f"upgraded_from_{from_version}_at", now],
    )
