"""The Sentinel store schema (`SCHEMA_VERSION`), declared once: tables, keys and views.

`COLUMNS` is the single source of truth: the DDL strings below are rendered from it, and the store
derives the pyarrow schema of every columnar insert from it, so the two cannot drift. Column order
is the DDL order. No FOREIGN KEY constraints on purpose (they slow bulk ingest and complicate
deletion); the joins are documented in docs/schema.md.

Changing the schema: bump `SCHEMA_VERSION`, add the step from the previous version to
`task_store.migrations.MIGRATIONS`, and append new columns at the END of their table (that is where
`ALTER TABLE ... ADD COLUMN` puts them in an upgraded file, so new and upgraded files then agree on
column order). Views live in the file (`CREATE OR REPLACE VIEW`, re-run on create and on every
upgrade) so the plain `duckdb` CLI sees them too.
"""

from __future__ import annotations

SCHEMA_VERSION = 6

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
        ("target_cluster_id", "VARCHAR"),  # v2: failure cluster a generated task aims at
        ("probe_pass_rate", "DOUBLE"),  # v2: policy pass rate measured by the difficulty probe
        ("prefix", "JSON"),  # v5: revealed start state, assistant turn texts (NULL: none)
        ("hint", "VARCHAR"),  # v6: revealed start of the policy's first turn (NULL: none)
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
        ("turn", "INTEGER"),  # v5: the assistant turn (0-based) of the step; NULL before v5
        ("revealed", "BOOLEAN"),  # v5: replayed from the task's prefix, not the policy's
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
        ("cluster_id", "VARCHAR"),  # v2: cl-<sha256[:12]> of (family, sorted skills, mode)
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
    "clusters": (  # v2: the analyzer's failure clusters, one row per round and cluster
        ("round", "INTEGER"),
        ("cluster_id", "VARCHAR"),
        ("family", "VARCHAR"),
        ("skills", "VARCHAR[]"),
        ("mode", "VARCHAR"),
        ("n_failures", "INTEGER"),
        ("share", "DOUBLE"),  # n_failures / the round's train rollouts
        ("trend", "DOUBLE"),  # slope of share over the last rounds
        ("exemplar_traj_ids", "VARCHAR[]"),
        ("summary", "VARCHAR"),
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
    "clusters": ("round", "cluster_id"),
}


def table_ddl(table: str) -> str:
    """`CREATE TABLE IF NOT EXISTS` statement for one table of `COLUMNS`."""
    cols = [f"    {name} {type_}" for name, type_ in COLUMNS[table]]
    cols.append(f"    PRIMARY KEY ({', '.join(PRIMARY_KEYS[table])})")
    return f"CREATE TABLE IF NOT EXISTS {table} (\n" + ",\n".join(cols) + "\n)"



# Generator rejections that are the generator's own crash or timeout, not a refused candidate.
GENERATOR_ERROR_REASONS = ("generator_error", "generator_timeout")
# How many of a task's most recent train attempts `hardest_tasks` looks at, and the fewest it needs.
HARDEST_WINDOW, HARDEST_MIN_ATTEMPTS = 16, 4
# `task_lineage` follows at most this many parent links (a guard against a corrupt cycle).
LINEAGE_MAX_DEPTH = 64

# A task carries fault type T when its skills hold `RECOVER_PREFIX + T` (`recover:timeout`).
RECOVER_PREFIX = "recover:"

# Train rollouts per round: the denominator of every "share".
_TRAIN_PER_ROUND = (
    "SELECT round, count(*) AS n_train FROM trajectories WHERE split = 'train' GROUP BY round"
)

VIEWS: dict[str, str] = {
    "failure_modes_by_round": f"""\
WITH f AS (
    SELECT round, mode, count(*) AS n_failures FROM failures GROUP BY round, mode
), t AS ({_TRAIN_PER_ROUND})
SELECT f.round, f.mode, f.n_failures,
       f.n_failures / NULLIF(t.n_train, 0) AS share_of_rollouts
FROM f LEFT JOIN t ON f.round = t.round
ORDER BY f.round, f.mode""",
    # Aggregate per (round, task) before unnesting skills: the join then touches one row per task
    # and round instead of one per rollout. Held-out numbers come from `evals` (the loop's per-task
    # tally of the sampled eval attempts), so greedy attempts are never mixed in.
    "skill_mastery": """\
WITH per_task AS (
    SELECT round, 'train' AS split, task_id, count(*) AS n,
           count(*) FILTER (WHERE success) AS successes
    FROM trajectories WHERE split = 'train' GROUP BY round, task_id
    UNION ALL
    SELECT round, 'eval', task_id, k, successes FROM evals
    UNION ALL
    SELECT round, 'eval_greedy', task_id, 1, greedy_success::INTEGER
    FROM evals WHERE greedy_success IS NOT NULL
)
SELECT p.round, p.split, s.skill, sum(p.n)::BIGINT AS n, sum(p.successes)::BIGINT AS successes,
       sum(p.successes) / NULLIF(sum(p.n), 0) AS success_rate
FROM per_task p JOIN tasks t ON t.task_id = p.task_id, UNNEST(t.skills) AS s(skill)
GROUP BY p.round, p.split, s.skill
ORDER BY p.round, p.split, s.skill""",
    # v4. Per round, split and fault type: held-out numbers from `evals` (sampled attempts, and
    # the one greedy attempt per task beside them), train numbers from train rollouts. A task
    # counts for each fault type it carries. Defined before `failure_patterns`, which reads it.
    "recovery_rates": f"""\
WITH faulted AS (
    SELECT t.task_id, s.skill[{len(RECOVER_PREFIX) + 1}:] AS fault_type
    FROM tasks t, UNNEST(t.skills) AS s(skill)
    WHERE starts_with(s.skill, '{RECOVER_PREFIX}') AND len(s.skill) > {len(RECOVER_PREFIX)}
), per_task AS (
    SELECT round, 'eval' AS split, task_id, k AS attempts, successes AS recovered,
           greedy_success::INTEGER AS greedy
    FROM evals
    UNION ALL
    SELECT round, 'train', task_id, count(*), count(*) FILTER (WHERE success), NULL::INTEGER
    FROM trajectories WHERE split = 'train' GROUP BY round, task_id
)
SELECT p.round, p.split, f.fault_type, count(DISTINCT p.task_id)::BIGINT AS tasks,
       sum(p.attempts)::BIGINT AS attempts, sum(p.recovered)::BIGINT AS recovered,
       sum(p.recovered) / NULLIF(sum(p.attempts), 0) AS recovery_rate,
       avg(p.greedy) AS greedy_rate
FROM per_task p JOIN faulted f ON f.task_id = p.task_id
GROUP BY p.round, p.split, f.fault_type
ORDER BY p.round, p.split, f.fault_type""",
    # One trend definition: the analyzer's, stored in `clusters.trend` (NULL for a cluster new in
    # its round); a pattern shows the one of the last round it failed in. v4: the pattern's
    # fault type ('+'-joined when several) and its recovery rates in that round.
    "failure_patterns": f"""\
WITH patterns AS (
    SELECT family, list_sort(skills) AS skills, mode, max(cluster_id) AS cluster_id,
           count(*)::BIGINT AS n_failures, min(round) AS first_round, max(round) AS last_round
    FROM failures GROUP BY family, list_sort(skills), mode
), typed AS (
    SELECT *, (SELECT string_agg(u.skill[{len(RECOVER_PREFIX) + 1}:], '+' ORDER BY u.skill)
               FROM UNNEST(skills) AS u(skill)
               WHERE starts_with(u.skill, '{RECOVER_PREFIX}')
                 AND len(u.skill) > {len(RECOVER_PREFIX)}) AS fault_type
    FROM patterns
)
SELECT p.family, p.skills, p.mode, p.cluster_id, p.n_failures, p.first_round, p.last_round,
       c.trend, p.fault_type, e.recovery_rate, tr.recovery_rate AS train_recovery_rate
FROM typed p LEFT JOIN clusters c ON c.cluster_id = p.cluster_id AND c.round = p.last_round
LEFT JOIN recovery_rates e
  ON e.split = 'eval' AND e.round = p.last_round AND e.fault_type = p.fault_type
LEFT JOIN recovery_rates tr
  ON tr.split = 'train' AND tr.round = p.last_round AND tr.fault_type = p.fault_type
ORDER BY p.n_failures DESC, p.family, p.mode, p.skills""",
    # A targeted cluster "shrank" when its pooled failure share over the rounds after the
    # generator's first task aimed at it is below its share in that round (the round whose
    # failures the task was mined from). Clusters with no later round yet do not count.
    "generator_yield": f"""\
WITH t AS ({_TRAIN_PER_ROUND}),
cf AS (
    SELECT cluster_id, round, count(*) AS n FROM failures
    WHERE cluster_id IS NOT NULL GROUP BY cluster_id, round
), gen AS (
    SELECT generator, count(*) AS accepted, count(DISTINCT target_cluster_id) AS targeted_clusters
    FROM tasks WHERE origin = 'generated' GROUP BY generator
), targets AS (
    SELECT generator, target_cluster_id AS cluster_id, min(created_round) AS c
    FROM tasks WHERE origin = 'generated' AND target_cluster_id IS NOT NULL
    GROUP BY generator, target_cluster_id
), shares AS (
    SELECT g.generator, g.cluster_id,
           sum(coalesce(cf.n, 0)) FILTER (WHERE t.round = g.c)
             / NULLIF(sum(t.n_train) FILTER (WHERE t.round = g.c), 0) AS share_at,
           sum(coalesce(cf.n, 0)) FILTER (WHERE t.round > g.c)
             / NULLIF(sum(t.n_train) FILTER (WHERE t.round > g.c), 0) AS share_after
    FROM targets g JOIN t ON t.round >= g.c
    LEFT JOIN cf ON cf.cluster_id = g.cluster_id AND cf.round = t.round
    GROUP BY g.generator, g.cluster_id
), shrank AS (
    SELECT generator, count(*) FILTER (WHERE share_after < share_at) AS clusters_shrank
    FROM shares GROUP BY generator
), rej AS (
    SELECT generator, reason, count(*) AS n FROM rejections GROUP BY generator, reason
), rej_by_gen AS (
    SELECT generator,
           sum(n) FILTER (WHERE reason NOT IN {GENERATOR_ERROR_REASONS}) AS rejected,
           sum(n) FILTER (WHERE reason IN {GENERATOR_ERROR_REASONS}) AS errors,
           map_from_entries(list((reason, n) ORDER BY reason)
                            FILTER (WHERE reason NOT IN {GENERATOR_ERROR_REASONS}))
             AS rejected_by_reason
    FROM rej GROUP BY generator
), names AS (SELECT generator FROM gen UNION SELECT generator FROM rej_by_gen)
SELECT n.generator,
       (coalesce(g.accepted, 0) + coalesce(r.rejected, 0))::BIGINT AS proposed,
       coalesce(g.accepted, 0)::BIGINT AS accepted,
       coalesce(r.rejected, 0)::BIGINT AS rejected,
       coalesce(r.errors, 0)::BIGINT AS errors,
       coalesce(r.rejected_by_reason, MAP {{}}::MAP(VARCHAR, BIGINT)) AS rejected_by_reason,
       coalesce(g.targeted_clusters, 0)::BIGINT AS targeted_clusters,
       coalesce(s.clusters_shrank, 0)::BIGINT AS clusters_shrank
FROM names n
LEFT JOIN gen g ON g.generator IS NOT DISTINCT FROM n.generator
LEFT JOIN rej_by_gen r ON r.generator IS NOT DISTINCT FROM n.generator
LEFT JOIN shrank s ON s.generator IS NOT DISTINCT FROM n.generator
ORDER BY n.generator""",
    # Depth 0 is the task itself, so every task appears and "all descendants of X" is
    # `WHERE ancestor_id = X`. A parent id missing from `tasks` still appears, with NULL origin.
    "task_lineage": f"""\
WITH RECURSIVE chain(task_id, ancestor_id, depth) AS (
    SELECT task_id, task_id, 0 FROM tasks
    UNION ALL
    SELECT c.task_id, p.parent_task_id, c.depth + 1
    FROM chain c JOIN tasks p ON p.task_id = c.ancestor_id
    WHERE p.parent_task_id IS NOT NULL AND c.depth < {LINEAGE_MAX_DEPTH}
)
SELECT c.task_id, c.ancestor_id, c.depth, a.origin AS ancestor_origin,
       a.generator AS ancestor_generator, a.failure_ids
FROM chain c LEFT JOIN tasks a ON a.task_id = c.ancestor_id
ORDER BY c.task_id, c.depth""",
    # Exact "last N attempts" without sorting every rollout: per (task, round) counts, a running
    # total over rounds newest first, whole rounds while the total stays within N, and a window
    # over the rollouts of the one boundary round per task only (3-4x faster at 1M rollouts).
    "hardest_tasks": f"""\
WITH per_round AS (
    SELECT task_id, round, count(*) AS n, count(*) FILTER (WHERE success) AS s
    FROM trajectories WHERE split = 'train' GROUP BY task_id, round
), upto AS (
    SELECT task_id, round, n, s,
           sum(n) OVER (PARTITION BY task_id ORDER BY round DESC ROWS UNBOUNDED PRECEDING)
             AS newer_or_same
    FROM per_round
    QUALIFY newer_or_same - n < {HARDEST_WINDOW}
), whole AS (
    SELECT task_id, n, s FROM upto WHERE newer_or_same <= {HARDEST_WINDOW}
), boundary AS (
    SELECT tr.task_id, tr.success,
           {HARDEST_WINDOW} - (u.newer_or_same - u.n) AS take,
           row_number() OVER (PARTITION BY tr.task_id
                              ORDER BY tr.group_id DESC, tr.sample_idx DESC, tr.traj_id DESC) AS k
    FROM trajectories tr
    JOIN upto u ON u.task_id = tr.task_id AND u.round = tr.round
    WHERE tr.split = 'train' AND u.newer_or_same > {HARDEST_WINDOW}
), per_task AS (
    SELECT task_id, sum(n)::BIGINT AS attempts, sum(s)::BIGINT AS successes
    FROM (
        SELECT task_id, n, s FROM whole
        UNION ALL
        SELECT task_id, count(*), count(*) FILTER (WHERE success) FROM boundary
        WHERE k <= take GROUP BY task_id
    )
    GROUP BY task_id HAVING sum(n) >= {HARDEST_MIN_ATTEMPTS}
)
SELECT p.task_id, t.family, t.origin, p.attempts, p.successes,
       p.successes / p.attempts AS pass_rate
FROM per_task p LEFT JOIN tasks t ON t.task_id = p.task_id
ORDER BY pass_rate, p.attempts DESC, p.task_id""",
}

TABLE_DDL: dict[str, str] = {table: table_ddl(table) for table in COLUMNS}
VIEW_DDL: tuple[str, ...] = tuple(
    f"CREATE OR REPLACE VIEW {name} AS\n{body}" for name, body in VIEWS.items()
)
DDL: tuple[str, ...] = (*TABLE_DDL.values(), *VIEW_DDL)
