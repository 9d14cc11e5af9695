"""`trainer.backend: trl` (trainers.trl_backend): trl's GRPOTrainer driven by Sentinel's loop.

- One update through trl equals one update of the native trainer on the same batch: the same
  multi-turn trajectories (observation tokens masked through `env_mask`, a group dropped by the
  curriculum's zero-variance gate masked entirely), the same hybrid reward
  (trl sums the per-term reward functions with the reward weights), the same advantages, loss
  and gradient. The optimizer is AdamW with an epsilon far above the gradients, whose first step
  `-lr * g / (|g| + eps)` is then `-lr / eps * g` to 1e-3 (no sign()), so equal parameter deltas
  mean equal gradients.
- The loop with trl: rounds commit, trl's metrics reach the store, mined tasks are trained on in
  the next round, `--resume` after a crash reproduces the uninterrupted run.
- Two processes (`torchrun --nproc_per_node 2`, gloo on CPU): both ranks' rollouts are stored once
  each, failures are mined from them, the next round trains on the generated tasks, and the
  ranks' weights stay equal (the loop checks that itself after every round).
"""

from __future__ import annotations

import copy
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

pytest.importorskip("trl", reason="trl is not installed (pip install -e '.[dev]')")

from sentinel.config import ConfigError, load_config
from sentinel.env.environment import EnvConfig
from sentinel.loop import Loop, LoopError
from sentinel.types import Trajectory
from task_store import Store
from tests.conftest import TINY_SHAPE
from trainers import GRPOConfig, GRPOTrainer, token_logprobs
from trainers.trl_backend import RoundIO, TRLTrainer, split_batch

TEMPERATURE = 0.8
WEIGHTS = {"outcome": 1.0, "format": 0.3, "process": 0.5}


def scored_batch(model: Any, chat: Any, parser: Any, arith: Any, n_tasks: int,
                 group: int) -> tuple[list[Any], list[Trajectory]]:
    """`n_tasks` groups of `group` distinct multi-turn trajectories (tool calls and observations:
    reference solutions of different arith tasks, filed under the group's task; identical
    samples would make every group's gradient vanish), with made-up reward terms and the model's
    own log-probs as sampling log-probs (ratio 1)."""
    rng = random.Random(3)
    env = EnvConfig(max_turns=4, max_tokens=200, max_turn_tokens=48)
    tasks = [arith.make_task(arith.sample_spec(rng)) for _ in range(n_tasks)]
    trajs = []
    for task in tasks:
        for k in range(group):
            other = arith.make_task(arith.sample_spec(rng))
            t = arith.reference_trajectory(other, chat, parser, env)
            t.task_id, t.group_id, t.sample_idx = task.task_id, f"g-{task.task_id}", k
            t.reward_terms = {"outcome": float(rng.random() < 0.5), "format": rng.random(),
                              "process": rng.random()}
            t.reward = sum(WEIGHTS[n] * v for n, v in t.reward_terms.items())
            with torch.no_grad():
                ids = torch.tensor([t.token_ids])
                lp = token_logprobs(model, ids, torch.ones_like(ids), TEMPERATURE)[0]
            t.logprobs = [float(x) if m else 0.0 for x, m in zip(lp, t.loss_mask, strict=True)]
            trajs.append(t)
    assert any(0 in t.loss_mask[t.loss_mask.index(1):] for t in trajs), "no observation tokens"
    return tasks, trajs


def test_one_trl_update_equals_the_native_update(tiny_model: Any, tokenizer: Any, chat: Any,
                                                 parser: Any, arith: Any,
                                                 tmp_path: Path) -> None:
    # Weights far from the near-uniform init, so the batch's gradient is far above rounding.
    policy = copy.deepcopy(tiny_model)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.3)
    tasks, trajs = scored_batch(policy, chat, parser, arith, n_tasks=3, group=4)
    # The first group carries no reward variance and the gate drops it: the native trainer never
    # sees it; under trl it stays in the batch with env_mask 0 and must change nothing, not
    # even the token normaliser.
    for t in trajs[:4]:
        t.reward_terms, t.reward = dict(trajs[0].reward_terms), trajs[0].reward
    admitted = {t.traj_id for t in trajs[4:]}
    # eps 1e3 above gradients below 1: AdamW's first step is lr / eps * g (1e-2 * g), not a sign.
    config = GRPOConfig(lr=10.0, adam_epsilon=1e3, temperature=TEMPERATURE,
                        loss_agg="token-mean", micro_batch_size=6, max_grad_norm=1e6)
    native, via_trl = copy.deepcopy(policy), copy.deepcopy(policy)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}

    GRPOTrainer(native, config, pad_token_id=tokenizer.pad_token_id).update(trajs[4:])

    by_task = {t.task_id: [x for x in trajs if x.task_id == t.task_id] for t in tasks}
    seen: list[Trajectory] = []
    logged: list[dict[str, float]] = []
    trainer = TRLTrainer(via_trl, tokenizer, config, max_completion_tokens=200,
                         reward_weights=WEIGHTS, seed=0, output_dir=tmp_path / "trl",
                         reference_dir=None)
    trainer.train_round(RoundIO(
        round=1, steps=1, tasks_per_step=len(tasks), group_size=4,
        sample=lambda n: tasks[:n],
        rollout=lambda ts, g, prefix: [x for t in ts for x in by_task[t.task_id][:g]],
        observe=lambda batch: (seen.extend(batch), (admitted, {"observed": float(len(batch))}))[1],
        log=logged.append))

    assert [t.traj_id for t in seen] == [t.traj_id for t in trajs]
    assert trainer.optimizer_steps == 1
    assert len(logged) == 1 and logged[0]["observed"] == len(trajs)
    # trl's mean reward is the hybrid reward's, built from the per-term functions and weights.
    assert logged[0]["reward"] == pytest.approx(sum(t.reward for t in trajs) / len(trajs),
                                                abs=1e-5)
    trl_params = dict(via_trl.named_parameters())
    deltas = [(name, p.detach() - before[name], trl_params[name].detach() - before[name])
              for name, p in native.named_parameters()]
    scale = max(float(d.abs().max()) for _, d, _ in deltas)
    assert scale > 0
    for name, d_native, d_trl in deltas:
        torch.testing.assert_close(d_trl, d_native, rtol=1e-3, atol=1e-4 * scale, msg=name)


def test_trl_refuses_what_its_loss_cannot_do() -> None:
    with pytest.raises(ConfigError,
                       match=r"trainer\.backend 'trl' cannot do grpo\.kl_guard=0\.05"):
        load_config(data={"trainer": {"backend": "trl"}, "grpo": {"kl_guard": 0.05}})
    with pytest.raises(ConfigError, match=r"trainer\.backend"):
        load_config(data={"trainer": {"backend": "deepspeed-chat"}})


def test_split_groups_are_refused(tiny_model: Any, tokenizer: Any, tmp_path: Path) -> None:
    trainer = TRLTrainer(copy.deepcopy(tiny_model), tokenizer, GRPOConfig(),
                         max_completion_tokens=64, reward_weights=WEIGHTS, seed=0,
                         output_dir=tmp_path, reference_dir=None, world_size=2)
    io = RoundIO(round=1, steps=1, tasks_per_step=3, group_size=4, sample=list,
                 rollout=list, observe=list, log=print)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"tasks_per_step \(3\) must be a multiple of the "
                                         r"number of processes \(2\)"):
        trainer.trl_args(io)
    assert split_batch(6 * 4 // 2, 5) == (4, 3)


def test_a_launch_without_trl_is_refused(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(LoopError, match=r"trainer\.backend: trl"):
        Loop(load_config(data=loop_config()), tmp_path / "run").run()
    assert not (tmp_path / "run" / "sentinel.duckdb").exists()


# -- the loop ----------------------------------------------------------------------------------
def loop_config(**over: Any) -> dict[str, Any]:
    cfg = {
        "seed": 5, "rounds": 2,
        "policy": {"tiny": TINY_SHAPE.model_dump()},
        "families": [{"type": "arith", "max_operands": 2, "instruction": ""}],
        "env": {"max_turns": 2, "max_tokens": 96, "max_turn_tokens": 24},
        "sft": {"steps": 40, "batch_size": 8, "num_examples": 32, "lr": 0.01,
                "warmup_steps": 0},
        "rollout": {"temperature": 1.0},
        "grpo": {"beta": 0.04, "num_iterations": 2, "micro_batch_size": 8},
        "batch": {"steps_per_round": 2, "tasks_per_step": 4, "group_size": 4},
        "eval": {"num_tasks": 4, "samples": 2, "greedy": False},
        "generation": {"probe": False},
        "generators": [{"type": "mutate"}],
    }
    return cfg | over


def write_config(tmp_path: Path, **over: Any) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(loop_config(trainer={"backend": "trl"}, **over)))
    return path


def cli(*args: str, launcher: list[str] | None = None, fault: str | None = None,
        ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SENTINEL_FAULT_AT"}
    env["OMP_NUM_THREADS"] = "1"
    if fault:
        env["SENTINEL_FAULT_AT"] = fault
    cmd = [*(launcher or [sys.executable]), "-m", "sentinel", "loop", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def train_rows(run_dir: Path) -> list[tuple]:
    return Store(run_dir / "sentinel.duckdb").query(
        "SELECT round, list(task_id || ':' || sample_idx || ':' || md5(token_ids::VARCHAR) "
        "ORDER BY group_id, sample_idx) FROM trajectories WHERE split = 'train' "
        "GROUP BY round ORDER BY round")[1]


@pytest.mark.slow
def test_trl_loop_commits_rounds_and_resumes(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    whole = cli("--config", str(config), "--run-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    store = Store(tmp_path / "whole" / "sentinel.duckdb")
    rows = store.query("SELECT round, metrics->>'$.kl', metrics->>'$.\"rewards/outcome/mean\"', "
                       "metrics->>'$.learning_rate' FROM rounds ORDER BY round")[1]
    assert [r[0] for r in rows] == [0, 1, 2]
    for _, kl, outcome, lr in rows[1:]:  # trl's own metrics, per round
        assert kl is not None and float(kl) >= 0 and outcome is not None
        assert float(lr) == pytest.approx(3e-5)
    counts = store.query("SELECT round, count(*), count(DISTINCT group_id) FROM trajectories "
                         "WHERE split = 'train' GROUP BY round ORDER BY round")[1]
    assert counts == [(1, 2 * 4 * 4, 2 * 4), (2, 2 * 4 * 4, 2 * 4)]
    mined = store.query("SELECT count(*) FROM trajectories JOIN tasks USING (task_id) "
                        "WHERE split = 'train' AND round = 2 AND origin = 'generated' "
                        "AND created_round = 1")[1][0][0]
    assert mined > 0  # round 1's generated tasks are in round 2's trl batches
    assert (tmp_path / "whole" / "reference" / "config.json").exists()  # beta > 0

    crashed = cli("--config", str(config), "--run-dir", str(tmp_path / "resumed"),
                  fault="train:2")
    assert crashed.returncode != 0
    resumed = cli("--resume", "--run-dir", str(tmp_path / "resumed"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert train_rows(tmp_path / "resumed") == train_rows(tmp_path / "whole")


@pytest.mark.slow
def test_two_processes_store_both_ranks_and_train_on_mined_tasks(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun, "torchrun comes with torch"
    run_dir = tmp_path / "run"
    done = cli("--config", str(write_config(tmp_path)), "--run-dir", str(run_dir),
               launcher=[torchrun, "--standalone", "--nproc_per_node", "2"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("held-out success: round 0") == 1  # rank 0 reports
    store = Store(run_dir / "sentinel.duckdb")
    q = lambda sql: store.query(sql)[1]  # noqa: E731
    per_rank = q("SELECT round, regexp_extract(group_id, '^r[0-9]+s[0-9]+p([0-9]+)-', 1) AS rank,"
                 " count(*), count(DISTINCT traj_id), count(DISTINCT group_id) FROM trajectories"
                 " WHERE split = 'train' GROUP BY ALL ORDER BY ALL")
    # 2 updates x 4 tasks x 4 samples a round, half of the tasks on each rank, each stored once.
    assert per_rank == [(r, rank, 16, 16, 4) for r in (1, 2) for rank in ("0", "1")]
    assert q("SELECT count(*) FROM trajectories WHERE task_id NOT IN (SELECT task_id FROM tasks)"
             ) == [(0,)]  # every rank's tasks are stored
    failed_on = q("SELECT DISTINCT regexp_extract(t.group_id, 'p([0-9]+)-', 1) FROM failures f "
                  "JOIN trajectories t USING (traj_id) WHERE f.round = 1 ORDER BY 1")
    assert failed_on == [("0",), ("1",)]  # both ranks' failures were mined
    trained = q("SELECT count(*) FROM trajectories JOIN tasks USING (task_id) WHERE split = "
                "'train' AND round = 2 AND origin = 'generated' AND created_round = 1")[0][0]
    assert trained > 0
