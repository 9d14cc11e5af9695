"""The veRL backend against veRL 0.9.1 itself, on CPU, in veRL's environment (`make test-verl`;
skipped where veRL is not installed).

What runs for real: veRL's Hydra config (`ppo_trainer.yaml`) composed with Sentinel's overrides,
veRL's `create_rl_dataset` and `collate_fn`, veRL's `AgentLoopWorker.generate_sequences` (the
registry, the agent loop's instantiation, padding, masks) running `SentinelAgentLoop`, veRL's
`RewardLoopWorker` with the `naive` reward manager calling `compute_score`, and the legacy
trainer's `_log_rollout_data` writing the dump that `sentinel ingest verl-rollouts` reads.

What stands in: the LLM server. veRL's rollout servers are vLLM/SGLang engines on GPUs; here an
object with the same `generate(request_id, *, prompt_ids, sampling_params, ...) -> TokenOutput`
samples with transformers (the real tiny policy), or replays reference turns (a scripted policy,
so a tool call, its scheduled fault and the observations are certain to happen). Ray actors are
not started: the reward worker is called in-process behind a `.remote` shim.
"""

from __future__ import annotations

import asyncio
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

verl = pytest.importorskip("verl")

from sentinel.env.chat import ChatFormat  # noqa: E402
from sentinel.env.tools import tool_schema  # noqa: E402
from sentinel.verl.ingest import ingest_dump  # noqa: E402
from sentinel.verl.launch import VerlRound, agent_loop_config, overrides  # noqa: E402
from task_store import Store  # noqa: E402
from tests.verl_helpers import (  # noqa: E402
    arith_family,
    reference_turns,
    tasks_with_fault,
    write_dataset,
)

pytestmark = pytest.mark.verl

GROUP = 2


def compose(tmp_path: Path, dataset: Path, model: Path) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    args = overrides(VerlRound(
        dataset=dataset, rollout_dir=tmp_path / "rollouts", checkpoint_dir=tmp_path / "ckpt",
        agent_loop_config=agent_loop_config(tmp_path / "agent_loops.yaml"), model=str(model),
        steps=1, tasks_per_step=2, group_size=GROUP, max_prompt_length=256,
        max_response_length=256, extra=["reward.num_workers=1",
                                        "actor_rollout_ref.rollout.agent.num_workers=1"]))
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return hydra_compose("ppo_trainer", overrides=args)


class TransformersServer:
    """veRL's server-manager `generate` contract, sampled with transformers on CPU."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        from sentinel.rollout.hf import HFBackend

        self.backend = HFBackend(model, tokenizer, batch_size=1)
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any], image_data: Any = None,
                       video_data: Any = None, audio_data: Any = None,
                       mm_processor_kwargs: Any = None, **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"request_id": request_id, "n": len(prompt_ids), **sampling_params})
        temperature = float(sampling_params.get("temperature", 1.0))
        [(ids, logprobs)] = self.backend.sample(
            [list(prompt_ids)], [int(sampling_params["max_tokens"])],
            temperature=temperature or 1.0, greedy=temperature == 0)
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed")


class ScriptedServer:
    """The same contract, answering each task with its reference turns (one per call), the last
    answer wrong for the tasks in `wrong`."""

    def __init__(self, chat: ChatFormat, family: Any, tasks: list[Any], wrong: set[str]) -> None:
        self.chat, self.turns = chat, {}
        for task in tasks:
            schemas = [tool_schema(t) for t in family.tool_map(task.spec).values()
                       if not getattr(t, "hidden", False)]
            key = tuple(chat.prompt_ids(task.prompt, schemas))
            self.turns[key] = reference_turns(family, task, wrong=task.task_id in wrong)
        self.served: dict[str, int] = {}

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        [turns] = [t for k, t in self.turns.items() if tuple(prompt_ids[:len(k)]) == k]
        k = self.served.get(request_id, 0)
        self.served[request_id] = k + 1
        ids = self.chat.assistant_ids(turns[k])
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids))


class RemoteShim:
    """`handle.compute_score.remote(data)` of a Ray actor handle, on a local object."""

    def __init__(self, worker: Any) -> None:
        self.compute_score = types.SimpleNamespace(remote=worker.compute_score)


@pytest.fixture
def setup(tmp_path: Path, tiny_dir: Path) -> dict[str, Any]:
    family = arith_family()
    tasks = tasks_with_fault(family, 2, seed=5)
    dataset = write_dataset(tmp_path / "dataset.jsonl", tasks, family)
    return {"family": family, "tasks": tasks, "dataset": dataset,
            "config": compose(tmp_path, dataset, tiny_dir)}


def test_overrides_compose_with_verls_own_config(setup: dict[str, Any]) -> None:
    cfg = setup["config"]
    assert cfg.data.custom_cls.name == "SentinelDataset"
    assert cfg.reward.custom_reward_function.name == "compute_score"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "sentinel_agent"
    assert cfg.actor_rollout_ref.rollout.n == GROUP
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.trainer.use_v1 is False
    assert cfg.actor_rollout_ref.rollout.prompt_length == 256  # interpolated from data.*


def test_dataset_constructs_under_create_rl_dataset(setup: dict[str, Any], tokenizer) -> None:
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.dataset.rl_dataset import collate_fn

    from sentinel.verl.dataset import SentinelDataset

    dataset = create_rl_dataset(setup["config"].data.train_files, setup["config"].data,
                                tokenizer, None, is_train=True)
    assert isinstance(dataset, SentinelDataset) and len(dataset) == 2
    batch = collate_fn([dataset[i] for i in range(len(dataset))])
    assert batch["dummy_tensor"].shape == (2, 1)
    assert [e["task_id"] for e in batch["extra_info"]] == [t.task_id for t in setup["tasks"]]
    assert list(batch["agent_name"]) == ["sentinel_agent"] * 2


def run_verl_rollout(setup: dict[str, Any], server: Any, tokenizer: Any) -> Any:
    """veRL's rollout of one batch (each task GROUP times) through its AgentLoopWorker, rewards
    by its RewardLoopWorker; returns (input batch, output batch)."""
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.dataset.rl_dataset import collate_fn

    cfg = setup["config"]
    dataset = create_rl_dataset(cfg.data.train_files, cfg.data, tokenizer, None)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array([f"u{i}" for i in range(len(batch))], dtype=object)
    batch = batch.repeat(repeat_times=GROUP, interleave=True)
    gen = batch.pop(batch_keys=["dummy_tensor"], non_tensor_batch_keys=[
        k for k in batch.non_tensor_batch if k != "uid"])
    gen.non_tensor_batch["uid"] = batch.non_tensor_batch["uid"]
    # veRL's workers keep the event loop current when they are built (a Ray actor has one).
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        worker = AgentLoopWorker(cfg, server, reward_loop_worker_handles=[
            RemoteShim(RewardLoopWorker(cfg))])
        out = loop.run_until_complete(worker.generate_sequences(gen))
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    return gen, out


def test_agent_loop_runs_the_tiny_policy(setup: dict[str, Any], tiny_model, tokenizer) -> None:
    server = TransformersServer(tiny_model, tokenizer)
    _, out = run_verl_rollout(setup, server, tokenizer)
    n = len(setup["tasks"]) * GROUP
    assert out.batch["responses"].shape[0] == n
    assert server.calls and all(c["max_tokens"] <= 48 for c in server.calls)
    assert {"score", "outcome", "format", "process", "success", "task_id"} <= set(
        out.meta_info["reward_extra_keys"])
    # The reward sits on the last response token; it is the hybrid reward of the episode.
    assert np.allclose(out.batch["rm_scores"].sum(-1).numpy(),
                       np.array(out.non_tensor_batch["score"], dtype=float))
    mask, attention = out.batch["response_mask"], out.batch["attention_mask"]
    assert (mask <= attention[:, -mask.shape[1]:]).all()


def test_agent_loop_masks_observations_and_meets_fault_schedules(
        setup: dict[str, Any], chat, tokenizer, tmp_path: Path) -> None:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    family, tasks = setup["family"], setup["tasks"]
    server = ScriptedServer(chat, family, tasks, wrong={tasks[0].task_id})
    gen, out = run_verl_rollout(setup, server, tokenizer)
    obs = tokenizer.convert_tokens_to_ids("<tool_response>")
    responses, mask = out.batch["responses"], out.batch["response_mask"]
    assert (responses == obs).any()
    assert (mask[responses == obs] == 0).all()  # observations are never trained on
    assert (mask.sum(-1) > 0).all()
    success = [bool(s) for s in out.non_tensor_batch["success"]]
    task_ids = list(out.non_tensor_batch["task_id"])
    assert success == [tid != tasks[0].task_id for tid in task_ids]
    logprobs = out.batch["rollout_log_probs"]
    assert np.allclose(logprobs[mask == 1].numpy(), -0.25)
    assert (logprobs[mask == 0] == 0).all()

    # veRL's own dump of the batch (the legacy trainer's _log_rollout_data), then the ingest.
    batch = gen.union(out)
    batch.batch["token_level_scores"] = batch.batch["rm_scores"]
    trainer = types.SimpleNamespace(tokenizer=tokenizer)
    trainer._dump_generations = lambda **kw: RayPPOTrainer._write_generations(
        **kw, global_steps=1)
    extra = {k: out.non_tensor_batch[k] for k in out.meta_info["reward_extra_keys"]}
    dump = setup["config"].trainer.rollout_data_dir
    RayPPOTrainer._log_rollout_data(trainer, batch, extra, {}, dump)
    assert (Path(dump) / "1.jsonl").exists()
    assert "round 0: 4 rollouts of 2 tasks" in ingest_dump(dump, tmp_path / "run")
    store = Store(tmp_path / "run" / "sentinel.duckdb")
    _, rows = store.query("SELECT f.mode, count(*) FROM failures f GROUP BY 1")
    assert rows == [("wrong_answer", GROUP)]
    _, rows = store.query("SELECT count(*) FROM steps WHERE error_kind = 'timeout'")
    assert rows == [(len(tasks) * GROUP,)]  # each episode met its scheduled fault


def test_main_ppo_accepts_the_round_and_stops_only_for_gpus(tmp_path: Path, tiny_dir: Path) -> None:
    """`run_round` launches veRL's real entry point: its config validation passes, it builds
    SentinelDataset for both dataloaders and counts the steps, then stops where it allocates GPU
    workers (on a CPU machine; with CUDA this would train, so it is skipped there)."""
    import sys

    import torch

    from sentinel.verl.round import VerlRunError, run_round
    from tests.verl_helpers import ENV, REWARD

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: this check is for where veRL cannot train")
    family = arith_family()
    launch = VerlRound(dataset=Path(), rollout_dir=Path(), checkpoint_dir=Path(),
                       agent_loop_config=Path(), model=str(tiny_dir), steps=1, tasks_per_step=2,
                       group_size=GROUP, max_prompt_length=256, max_response_length=256)
    with pytest.raises(VerlRunError, match=r"verl\.log") as info:
        run_round(tmp_path / "run", 1, tasks_with_fault(family, 2), env=ENV, reward=REWARD,
                  families={family.name: family}, launch=launch, python=sys.executable,
                  timeout_s=300)
    log = Path(str(info.value).rsplit("see ", 1)[1]).read_text()
    assert "Using dataset class: SentinelDataset" in log
    assert "Total training steps: 1" in log
    assert "Total available GPUs 0 is less than total desired GPUs 1" in log


def test_the_loop_runs_a_verl_round_up_to_verls_gpu_check(tmp_path: Path) -> None:
    """`sentinel loop` with trainer.backend verl: round 0 (cold start) commits; round 1 draws
    steps x tasks_per_step tasks from the curriculum into a dataset version and launches veRL's
    main_ppo on the loop's saved policy, which gets as far as a CPU machine allows; the failure
    is a LoopError naming the job's log, and round 1 is not stored."""
    import sys

    import torch

    from sentinel.config import load_config
    from sentinel.loop import Loop, LoopError
    from sentinel.verl.version import read_version
    from tests.verl_helpers import loop_config

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: this check is for where veRL cannot train")
    run = tmp_path / "run"
    with pytest.raises(LoopError, match=r"veRL round 1 exited .* see .*verl\.log") as info:
        Loop(load_config(data=loop_config(sys.executable)), run).run()
    assert "sentinel loop --resume" in str(info.value)
    assert Store(run / "sentinel.duckdb").completed_rounds() == [0]
    round_dir = run / "verl" / "round-1"
    version = read_version(round_dir / "dataset.jsonl")
    assert len(version.tasks) == 2 * 2  # steps_per_round x tasks_per_step
    command = (round_dir / "overrides.txt").read_text()
    assert f"actor_rollout_ref.model.path={(run / 'policy').resolve()}" in command
    log = (round_dir / "verl.log").read_text()
    assert "Using dataset class: SentinelDataset" in log
    assert "Total available GPUs 0 is less than total desired GPUs 1" in log
