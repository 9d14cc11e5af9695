#!/usr/bin/env bash
# Why rate limits are never recovered: what the failure store says about a recovery run.
# Usage: bash docs/results/recovery/rate_limit_diagnosis.sh RUN_DIR
set -euo pipefail
RUN=${1:?run directory}
SQL="${SENTINEL:-.venv/bin/sentinel} sql --run-dir $RUN --format csv"
echo "# held-out recovery per round (sampled, greedy), rate_limit and timeout"
$SQL "SELECT fault_type, round, recovery_rate, greedy_rate FROM recovery_rates
      WHERE split = 'eval' AND fault_type IN ('rate_limit', 'timeout') ORDER BY 1, 2"
echo "# training rollouts on rate_limit tasks: did they call wait, did they succeed"
$SQL "WITH rl AS (SELECT t.traj_id, t.round, t.success FROM trajectories t JOIN tasks k USING (task_id)
                  WHERE t.split = 'train' AND list_contains(k.skills, 'recover:rate_limit'))
      SELECT rl.round, rl.success, count(DISTINCT rl.traj_id) AS n,
             count(DISTINCT CASE WHEN s.tool = 'wait' THEN rl.traj_id END) AS called_wait
      FROM rl LEFT JOIN steps s USING (traj_id) GROUP BY ALL ORDER BY ALL"
echo "# what the failed wait-callers did next: the call after a wait, against the call before it"
$SQL "WITH w AS (SELECT s.traj_id, s.step, s.arguments->>'seconds' AS seconds,
                        s.arguments->>'expression' AS wait_expression
                 FROM steps s JOIN trajectories t USING (traj_id)
                 WHERE t.split = 'train' AND NOT t.success AND s.tool = 'wait'),
           before AS (SELECT w.traj_id, w.step, max_by(p.arguments->>'expression', p.step) AS refused
                      FROM w JOIN steps p ON p.traj_id = w.traj_id AND p.step < w.step
                      AND p.tool = 'calculator' GROUP BY ALL),
           after AS (SELECT w.traj_id, w.step, min_by(n.arguments->>'expression', n.step) AS reissued
                     FROM w JOIN steps n ON n.traj_id = w.traj_id AND n.step > w.step
                     AND n.tool = 'calculator' GROUP BY ALL)
      SELECT CASE WHEN w.seconds IS NULL AND w.wait_expression IS NOT NULL
                  THEN 'wait called with the calculator''s argument (no seconds)'
                  WHEN w.seconds IS NULL THEN 'wait without seconds'
                  WHEN a.reissued IS NULL THEN 'waited, no calculator call after'
                  WHEN a.reissued = b.refused THEN 'waited, re-issued the refused call'
                  ELSE 'waited, re-issued a different expression' END AS what,
             count(*) AS n
      FROM w LEFT JOIN before b USING (traj_id, step) LEFT JOIN after a USING (traj_id, step)
      GROUP BY 1 ORDER BY n DESC"
echo "# examples (failed rollouts that waited properly): refused call, re-issued call"
$SQL "WITH w AS (SELECT s.traj_id, s.step FROM steps s JOIN trajectories t USING (traj_id)
                 WHERE t.split = 'train' AND NOT t.success AND s.tool = 'wait'
                 AND s.arguments->>'seconds' IS NOT NULL)
      SELECT max_by(p.arguments->>'expression', p.step) FILTER (WHERE p.step < w.step) AS refused,
             min_by(p.arguments->>'expression', p.step) FILTER (WHERE p.step > w.step) AS reissued
      FROM w JOIN steps p ON p.traj_id = w.traj_id AND p.tool = 'calculator'
      GROUP BY w.traj_id, w.step ORDER BY 1 LIMIT 12"
