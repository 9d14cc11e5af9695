"""End to end: the real loop (tiny policy, real tools, real DuckDB) on a small budget, then SQL on
its store and the CLI on its run directory. One loop run is shared by the tests of this module."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from generators import BaseGenerator, GenerationContext, GeneratorConfig
from sentinel.config import load_config
from sentinel.loop import Loop, LoopError
from sentinel.types import Candidate
from task_store import Store

pytestmark = pytest.mark.slow


class ClaimingGenerator(BaseGenerator):
    """A plugin named by `module:Class`: for each failed task, one perturbed candidate with the
    right answer and one with a wrong claimed answer (which validation must reject)."""

    name = "claiming"
    config_model = GeneratorConfig

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        rng = random.Random(ctx.round)
        for i, task in enumerate(list(ctx.tasks.values())[:3]):
            family = ctx.families[task.family]
            spec = family.perturb(task.spec, rng)
            answer = family.solve(spec, family.tool_map()).answer
            yield Candidate(task.family, spec, answer, task.task_id)
            # Operands above max_value: no other generator can propose this spec.
            other = {"expr": f"{500 + i}+{ctx.round}"}
            yield Candidate(task.family, other, str(500 + i + ctx.round + 1), task.task_id)


TINY = {
    "seed": 3,
    "rounds": 2,
    "policy": {"tiny": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                        "num_attention_heads": 4}},
    "families": [{"type": "arith", "max_operands": 3}],
    "env": {"max_turns": 4, "max_tokens": 256, "max_turn_tokens": 24},
    "sft": {"steps": 15, "batch_size": 16, "num_examples": 48},
    "batch": {"steps_per_round": 1, "tasks_per_step": 6, "group_size": 2},
    "eval": {"num_tasks": 4, "samples": 2},
    "curriculum": {"mined_fraction": 0.5},
    # The band admits every pass rate: the untrained policy fails everything, and the test
    # needs accepted tasks; the probe still runs and is recorded.
    "generation": {"probe": True, "probe_samples": 2, "probe_band": [0.0, 1.0]},
    "generators": [{"type": "mutate", "per_failure": 1}, {"type": "decompose"},
                   {"type": "tests.test_loop:ClaimingGenerator"}],
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("loop")
    history = Loop(load_config(data=json.loads(json.dumps(TINY))), out).run()
    assert [h["n_train_rollouts"] for h in history] == [0, 12, 12]
    return out


def q(run_dir: Path, sql: str) -> list[tuple]:
    return Store(run_dir / "sentinel.duckdb").query(sql)[1]


def test_rounds_committed_with_heldout_success(run_dir):
    rows = q(run_dir, "SELECT round, heldout_success, n_train_rollouts FROM rounds ORDER BY round")
    assert [r[0] for r in rows] == [0, 1, 2]
    assert all(0.0 <= r[1] <= 1.0 for r in rows)
    assert q(run_dir, "SELECT count(*) FROM evals")[0][0] == 3 * 4
    assert (run_dir / "policy" / "config.json").exists()


def test_generated_tasks_of_round_r_are_trained_on_in_round_r_plus_1(run_dir):
    generated = q(run_dir, "SELECT count(*) FROM tasks WHERE origin = 'generated' "
                           "AND created_round = 1")[0][0]
    assert generated > 0
    trained = q(run_dir, """
        SELECT count(DISTINCT tr.task_id) FROM trajectories tr JOIN tasks t USING (task_id)
        WHERE t.origin = 'generated' AND t.created_round = 1
          AND tr.round = 2 AND tr.split = 'train'""")[0][0]
    assert trained > 0
    # Lineage: every generated task names a parent that failed in the round it came from.
    orphans = q(run_dir, """
        SELECT count(*) FROM tasks t WHERE t.origin = 'generated' AND NOT EXISTS (
          SELECT 1 FROM failures f WHERE f.task_id = t.parent_task_id
            AND f.round = t.created_round)""")[0][0]
    assert orphans == 0
    # Every accepted task went through the difficulty probe.
    unprobed = q(run_dir, "SELECT count(*) FROM tasks WHERE origin = 'generated' "
                          "AND probe_pass_rate IS NULL")[0][0]
    assert unprobed == 0
    # Failure clusters are stored, and generated tasks name the cluster they aim at.
    assert q(run_dir, "SELECT count(*) FROM clusters")[0][0] > 0
    aimed = q(run_dir, """
        SELECT count(*) FROM tasks t JOIN clusters c
          ON c.cluster_id = t.target_cluster_id AND c.round = t.created_round
        WHERE t.origin = 'generated'""")[0][0]
    assert aimed > 0


def test_plugin_generator_valid_candidates_stored_wrong_answers_rejected(run_dir):
    accepted = q(run_dir, "SELECT count(*) FROM tasks WHERE generator = 'claiming'")[0][0]
    rejected = q(run_dir, "SELECT reason, count(*) FROM rejections WHERE generator = 'claiming' "
                          "GROUP BY reason")
    assert accepted > 0
    assert dict(rejected).get("answer_mismatch", 0) > 0
    # No rejected spec made it into tasks.
    leaked = q(run_dir, """
        SELECT count(*) FROM rejections r JOIN tasks t ON t.spec = r.spec
        WHERE r.reason = 'answer_mismatch'""")[0][0]
    assert leaked == 0


def test_failures_classified_with_first_error_step(run_dir):
    rows = q(run_dir, "SELECT mode, first_error_step, traj_id FROM failures")
    assert rows, "an almost untrained policy must fail"
    from sentinel.types import FAILURE_MODES

    assert {r[0] for r in rows} <= set(FAILURE_MODES)
    failed = q(run_dir, "SELECT count(*) FROM trajectories WHERE split = 'train' AND NOT success")
    assert failed[0][0] == len(rows)


def test_trajectory_rows_keep_tokens_masks_and_reward_terms(run_dir):
    rows = q(run_dir, "SELECT token_ids, loss_mask, prompt_len, reward, reward_terms "
                      "FROM trajectories WHERE split = 'train'")
    weights = json.loads(q(run_dir, "SELECT config FROM runs")[0][0])["reward"]
    for ids, mask, prompt_len, reward, terms in rows:
        assert len(ids) == len(mask)
        assert not any(mask[:prompt_len])
        terms = json.loads(terms)
        assert set(terms) == {"outcome", "format", "process"}
        # The stored reward is the run's weighted sum of the stored terms.
        assert reward == pytest.approx(sum(weights[f"w_{k}"] * v for k, v in terms.items()))


def sentinel(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sentinel", *args], capture_output=True,
                          text=True, timeout=120)


def test_cli_sql_and_status(run_dir):
    out = sentinel("sql", "--run-dir", str(run_dir),
                   "SELECT mode, count(*) AS n FROM failures GROUP BY mode")
    assert out.returncode == 0, out.stderr
    modes = {r[0] for r in q(run_dir, "SELECT DISTINCT mode FROM failures")}
    assert all(m in out.stdout for m in modes)
    status = sentinel("status", "--run-dir", str(run_dir))
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("\n") >= 3
    before = q(run_dir, "SELECT count(*) FROM failures")[0][0]
    refused = sentinel("sql", "--run-dir", str(run_dir), "DELETE FROM failures")
    assert refused.returncode != 0
    assert "read-only" in (refused.stderr + refused.stdout).lower()
    assert q(run_dir, "SELECT count(*) FROM failures")[0][0] == before > 0


def test_a_second_loop_in_the_same_run_dir_is_refused(run_dir):
    with pytest.raises(LoopError, match="already holds a run"):
        Loop(load_config(data=json.loads(json.dumps(TINY))), run_dir).run()
