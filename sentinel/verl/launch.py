"""The command line of one veRL round: Hydra overrides of `python -m verl.trainer.main_ppo`
(veRL 0.9.1's `ppo_trainer.yaml`) that plug Sentinel in.

`overrides(VerlRound(...))` returns the list; `agent_loop_config` writes the file that registers
Sentinel's agent loop in every veRL worker (`actor_rollout_ref.rollout.agent.
agent_loop_config_path`), so the registration does not depend on which module a worker imported.

What they set, and why:
- `data.custom_cls` → `sentinel.verl.dataset.SentinelDataset`, `data.train_files`/`val_files`
  → the dataset version, `data.shuffle=false` (the curriculum already ordered the draw),
  `data.train_batch_size` = tasks per step, `actor_rollout_ref.rollout.n` = group size;
- `reward.custom_reward_function` → `sentinel.verl.reward.compute_score` (naive manager);
- the agent loop `sentinel_agent` as the default, multi-turn on, log-probs on;
- `algorithm.adv_estimator=grpo`, the GRPO knobs Sentinel's config names;
- `trainer.rollout_data_dir` (what `sentinel ingest verl-rollouts` reads),
  `trainer.total_training_steps` = steps per round, `trainer.val_before_train=false`,
  `trainer.use_v1=false`: veRL 0.9.1's v1 trainer dumps only input/output/score/uid, the legacy
  one (`main_ppo_v0`, deprecated but present in 0.9.1) also dumps every `reward_extra_info` key,
  which carries Sentinel's record (task, steps, terms); without it nothing can be ingested;
- the checkpoint keeps the HF model (`save_contents` with `hf_model`), the next round's
  `model.path`.

`extra` (the user's `trainer.verl.overrides`) comes last, so it wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sentinel.verl import AGENT_NAME


@dataclass
class VerlRound:
    """One round's launch parameters."""

    dataset: Path
    rollout_dir: Path
    checkpoint_dir: Path
    agent_loop_config: Path
    model: str
    steps: int
    tasks_per_step: int
    group_size: int
    max_prompt_length: int = 512
    max_response_length: int = 512
    temperature: float = 1.0
    lr: float = 1e-6
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    loss_agg_mode: str = "token-mean"
    micro_batch_size_per_gpu: int = 4
    rollout_name: str = "vllm"
    n_gpus_per_node: int = 1
    nnodes: int = 1
    experiment_name: str = "sentinel"
    extra: list[str] = field(default_factory=list)


def agent_loop_config(path: Path) -> Path:
    """Write the agent-loop registry file veRL workers load (`name` + hydra `_target_`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"- name: {AGENT_NAME}\n"
                    f"  _target_: sentinel.verl.agent_loop.SentinelAgentLoop\n", encoding="utf-8")
    return path


def overrides(r: VerlRound) -> list[str]:
    """Hydra overrides for `python -m verl.trainer.main_ppo` (see the module docstring)."""
    rollout = "actor_rollout_ref.rollout"
    actor = "actor_rollout_ref.actor"
    use_kl = r.kl_coef > 0
    return [
        f"data.train_files=['{r.dataset}']",
        f"data.val_files=['{r.dataset}']",
        "data.custom_cls.path=pkg://sentinel.verl.dataset",
        "data.custom_cls.name=SentinelDataset",
        f"data.train_batch_size={r.tasks_per_step}",
        f"data.max_prompt_length={r.max_prompt_length}",
        f"data.max_response_length={r.max_response_length}",
        "data.shuffle=false",
        "data.return_raw_chat=true",
        "data.dataloader_num_workers=0",
        "reward.custom_reward_function.path=pkg://sentinel.verl.reward",
        "reward.custom_reward_function.name=compute_score",
        "reward.reward_manager.name=naive",
        f"actor_rollout_ref.model.path={r.model}",
        f"{rollout}.name={r.rollout_name}",
        f"{rollout}.n={r.group_size}",
        f"{rollout}.temperature={r.temperature}",
        f"{rollout}.calculate_log_probs=true",
        f"{rollout}.multi_turn.enable=true",
        f"{rollout}.agent.default_agent_loop={AGENT_NAME}",
        f"{rollout}.agent.agent_loop_config_path={r.agent_loop_config}",
        f"{actor}.optim.lr={r.lr}",
        f"{actor}.ppo_mini_batch_size={r.tasks_per_step}",
        f"{actor}.ppo_micro_batch_size_per_gpu={r.micro_batch_size_per_gpu}",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={r.micro_batch_size_per_gpu}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={r.micro_batch_size_per_gpu}",
        f"{actor}.clip_ratio_low={r.clip_low}",
        f"{actor}.clip_ratio_high={r.clip_high}",
        f"{actor}.loss_agg_mode={r.loss_agg_mode}",
        f"{actor}.use_kl_loss={str(use_kl).lower()}",
        f"{actor}.kl_loss_coef={r.kl_coef}",
        f"{actor}.checkpoint.save_contents=['model','optimizer','extra','hf_model']",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        f"trainer.rollout_data_dir={r.rollout_dir}",
        f"trainer.default_local_dir={r.checkpoint_dir}",
        f"trainer.total_training_steps={r.steps}",
        "trainer.total_epochs=1",
        f"trainer.save_freq={r.steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.use_v1=false",
        "trainer.logger=['console']",
        "trainer.project_name=sentinel",
        f"trainer.experiment_name={r.experiment_name}",
        f"trainer.n_gpus_per_node={r.n_gpus_per_node}",
        f"trainer.nnodes={r.nnodes}",
        *r.extra,
    ]


def hf_model_dir(checkpoint_dir: Path, steps: int) -> Path:
    """Where veRL's round checkpoint keeps the HF model (the next round's `model.path`)."""
    return checkpoint_dir / f"global_step_{steps}" / "actor" / "huggingface"
