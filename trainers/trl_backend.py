"""`trainer.backend: trl`: trl's `GRPOTrainer` runs each round's GRPO phase (docs/scale-out.md).

Sentinel keeps the curriculum, the environment, the reward, the store, analysis and generation;
trl owns the update (its loss, its accelerate-prepared model: DDP, DeepSpeed or FSDP across the
processes `torchrun` / `accelerate launch` started). What crosses the seam, per round:

- **dataset**: a `datasets.IterableDataset` whose stream draws `tasks_per_step` tasks from the
  curriculum for every generation batch (`RoundIO.sample`), so it reads the current mixture:
  tasks mined after round r are in round r+1's stream. A row's `prompt` is the task id. Every
  process reads the same stream (each rank's curriculum is kept identical, see `observe`) and
  accelerate hands each its contiguous slice; a rank's slice holds whole groups
  (`tasks_per_step` must be a multiple of the number of processes).
- **rollout_func**: Sentinel's multi-turn episodes on the rank's tasks (`RoundIO.rollout`, the
  loop's `Rollouts` over any rollout backend). Per trajectory: `prompt_ids` are the tokens before
  the policy's first token, `completion_ids` everything after, `logprobs` the sampling log-probs
  and `env_mask` the loss mask (0 on tool observations and on a restart task's revealed turns),
  which trl multiplies into its completion mask.
- **reward**: one trl reward function per term of the hybrid reward (`outcome`, `format`,
  `process`, read off each trajectory's scored terms), weighted by `reward.w_*`; trl sums them
  (the hybrid reward), normalises within groups and logs `rewards/<term>/mean`.
- **observe**: after each batch every rank gathers all ranks' trajectories and hands them to
  `RoundIO.observe` (the curriculum observes them on every rank; rank 0 keeps them for the
  store), so failures are mined from every process's rollouts. The groups the curriculum's gate
  drops (`drop_zero_variance`) get an all-zero `env_mask`: no token of theirs is trained or
  counted in the token normaliser (exactly dropping them for `token-mean`; trl's
  `seq-mean-token-mean` and `dr_grpo` still count them as sequences).
- **optimizer and schedule**: Sentinel's own (the native trainer's AdamW, `lr_scheduler`,
  `warmup_steps`, ...), handed to trl as `optimizers=(...)`; they live here across rounds and go
  into the round's checkpoint (`state_dict`).
- **reference** (`beta > 0`): trl builds it from `model.config._name_or_path`, which points at
  the cold-started policy saved in `reference_dir`: the native trainer's reference, too.

A fresh `trl.GRPOTrainer` is built for every round (`max_steps` = the round's optimizer steps)
over the same model, optimizer and schedule; trl's own checkpointing is off (rounds commit
through the loop).

GRPO options trl's loss does not have (`adam_v_warm_start`, `kl_guard`,
`rollout_correction`) are refused at config load (`trl_unsupported`); `share_prefix` and
`micro_batch_size`'s exact split are the native trainer's business (trl takes the largest
per-device batch <= `micro_batch_size` that divides a rank's share of the batch).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sentinel.types import Task, Trajectory
from trainers.config import GRPOConfig, trl_unsupported

LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "dr_grpo": "dr_grpo"}
REWARD_TERMS = ("outcome", "format", "process")


@dataclass
class RoundIO:
    """What one round of training gets from the loop."""

    round: int
    steps: int  # updates (generation batches) this round
    tasks_per_step: int
    group_size: int
    sample: Callable[[int], list[Task]]  # the curriculum's draw of n tasks
    rollout: Callable[[list[Task], int, str], list[Trajectory]]  # (tasks, samples, group prefix)
    # every rank's batch -> (the trajectories to train on, the batch's metrics)
    observe: Callable[[list[Trajectory]], tuple[set[str], dict[str, float]]]
    log: Callable[[dict[str, float]], None]  # one update's metrics


def split_batch(rows: int, micro_batch_size: int) -> tuple[int, int]:
    """(per-device batch, accumulation steps) for `rows` rows on one rank: the largest divisor of
    `rows` not above `micro_batch_size`, and how many of them make `rows`.

    >>> split_batch(64, 32)
    (32, 2)
    >>> split_batch(24, 16)
    (12, 2)
    >>> split_batch(7, 64)
    (7, 1)
    """
    size = min(micro_batch_size, rows)
    while rows % size:
        size -= 1
    return size, rows // size


# datasets fingerprints a generator by pickling it and its arguments; the curriculum behind the
# stream is not picklable (nor should it be copied), so the stream is looked up by a key.
_STREAMS: dict[str, Callable[[], Iterator[dict[str, str]]]] = {}


def _register(draw: Callable[[], Iterator[dict[str, str]]]) -> str:
    key = f"stream-{len(_STREAMS)}-{id(draw)}"
    _STREAMS.clear()  # one live stream: this round's
    _STREAMS[key] = draw
    return key


def _stream(key: str) -> Iterator[dict[str, str]]:
    yield from _STREAMS[key]()


class TRLTrainer:
    """trl's `GRPOTrainer` behind Sentinel's trainer seam: `train_round` runs one round's updates
    (trl samples through `RoundIO`); `state_dict` / `load_state_dict` checkpoint the optimizer
    and schedule (the policy's weights are saved beside them by the caller)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, config: GRPOConfig, *,
                 max_completion_tokens: int, reward_weights: dict[str, float], seed: int,
                 output_dir: str | Path, reference_dir: str | Path | None,
                 world_size: int = 1, total_steps: int | None = None) -> None:
        from trainers.common import lr_multiplier

        bad = trl_unsupported(config)
        if bad:
            raise ValueError(f"trainer.backend 'trl' cannot do {', '.join(bad)}: trl's GRPO loss "
                             "has no such option (use trainer.backend 'sentinel')")
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.max_completion_tokens = max_completion_tokens
        self.reward_weights = [reward_weights[k] for k in REWARD_TERMS]
        self.seed, self.output_dir, self.world_size = seed, Path(output_dir), world_size
        self.reference_dir = None if reference_dir is None else Path(reference_dir)
        if config.beta > 0 and self.reference_dir is None:
            raise ValueError("beta > 0 needs a reference_dir holding the reference policy")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, weight_decay=config.weight_decay,
            betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_epsilon)
        span = config.total_steps if config.total_steps is not None else total_steps
        if config.lr_scheduler != "constant" and span is None:
            raise ValueError(f"lr_scheduler={config.lr_scheduler!r} needs grpo.total_steps")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_multiplier(s, config.lr_scheduler, config.warmup_steps,
                                                    span, config.min_lr_ratio))
        self._tasks: dict[str, Task] = {}
        self.last_trl: Any = None  # the last round's trl.GRPOTrainer (tests, benchmarks)

    # -- checkpoints ---------------------------------------------------------------------------
    @property
    def optimizer_steps(self) -> int:
        return int(self.scheduler.last_epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "backend": "trl"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("backend") != "trl":
            raise ValueError("the checkpoint was written by another trainer backend; resume with "
                             "the config of the checkpoint (trainer.backend)")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def save_reference(self) -> None:
        """Save the policy as it is now (after the cold start) as trl's reference model."""
        if self.reference_dir is not None:
            self.model.save_pretrained(self.reference_dir)

    # -- a round -------------------------------------------------------------------------------
    def trl_args(self, io: RoundIO) -> Any:
        from trl import GRPOConfig as TRLConfig

        from trainers import distributed

        cfg, n = self.config, self.world_size
        if io.tasks_per_step % n:
            raise ValueError(f"batch.tasks_per_step ({io.tasks_per_step}) must be a multiple of "
                             f"the number of processes ({n}): each rank samples whole groups")
        per_device, accumulation = split_batch(io.tasks_per_step * io.group_size // n,
                                               cfg.micro_batch_size)
        device = next(self.model.parameters()).device
        return TRLConfig(
            output_dir=str(self.output_dir), report_to="none", save_strategy="no",
            # trl seeds the global RNGs (rollout sampling) when it is built: a seed per round and
            # rank, so rounds and ranks differ and a resumed round samples as it did.
            logging_steps=1, disable_tqdm=True,
            seed=self.seed + 7919 * io.round + 104_729 * distributed.rank(),
            use_cpu=device.type == "cpu", bf16=cfg.autocast_dtype(device) is torch.bfloat16,
            per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation,
            steps_per_generation=accumulation, num_generations=io.group_size,
            num_iterations=cfg.num_iterations, max_steps=io.steps * cfg.num_iterations,
            learning_rate=cfg.lr, beta=cfg.beta, epsilon=cfg.epsilon_low,
            epsilon_high=cfg.epsilon_high, loss_type=LOSS_TYPES[cfg.loss_agg],
            scale_rewards=cfg.scale_rewards,
            mask_truncated_completions=cfg.mask_truncated_completions,
            max_grad_norm=cfg.max_grad_norm, temperature=cfg.temperature,
            max_completion_length=self.max_completion_tokens,
            use_bias_correction_kl=cfg.kl_ratio_correction, reward_weights=self.reward_weights,
            shuffle_dataset=False, dataloader_num_workers=0, remove_unused_columns=False,
        )

    def train_round(self, io: RoundIO) -> None:
        """Run the round's `io.steps` updates with trl; every batch's trajectories go through
        `io.observe` (all ranks') and every update's metrics through `io.log`."""
        from transformers import TrainerCallback

        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        # pending: the last batch's metrics (from io.observe); logs: trl's logs since (one per
        # optimizer step, num_iterations of them per batch), flushed as one update.
        state: dict[str, Any] = {"step": 0, "pending": None, "logs": [],
                                 "flush": lambda: self._flush(state, io)}

        def rollout_func(prompts: list[str], trainer: Any) -> dict[str, Any]:
            return self._rollout(list(prompts), io, state)

        def term(name: str) -> Callable[..., list[float]]:
            def reward(completions: list[Any], reward_terms: list[dict[str, float]],
                       **_: Any) -> list[float]:
                return [float(t[name]) for t in reward_terms]

            reward.__name__ = name
            return reward

        trainer = self

        class Log(TrainerCallback):
            def on_log(self, args: Any, st: Any, control: Any, logs: Any = None,
                       **kw: Any) -> None:
                if not logs or "train_runtime" in logs:  # trl's end-of-training summary
                    return
                metrics = {k: float(v) for k, v in logs.items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool)}
                metrics.pop("epoch", None)
                metrics["learning_rate"] = float(trainer.scheduler.get_last_lr()[0])
                state["logs"].append(metrics)

        with warnings.catch_warnings():
            # trl uses transformers' deprecated gradient_checkpointing names; not ours to fix.
            warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
            self._train(io, state, rollout_func, [term(k) for k in REWARD_TERMS], Log())
        self._flush(state, io)
        self.model.eval()
        self.check_in_sync()

    def check_in_sync(self) -> None:
        """Raise if the ranks' weights differ after a round (trl's collectives keep them equal;
        a rank that trained alone would silently fork the policy)."""
        from trainers import distributed

        with torch.no_grad():
            sums = distributed.all_gather(
                [float(sum(p.double().sum() for p in self.model.parameters()))])
        if max(sums) - min(sums) > 1e-6 * max(1.0, max(abs(x) for x in sums)):
            raise RuntimeError(f"the ranks' policy weights differ after the round (sums {sums})")

    def _train(self, io: RoundIO, state: dict[str, Any], rollout_func: Any, rewards: list[Any],
               log: Any) -> None:
        from datasets import IterableDataset
        from transformers import PrinterCallback
        from trl import GRPOTrainer as TRLGRPOTrainer

        def draw() -> Iterator[dict[str, str]]:
            while True:
                for task in io.sample(io.tasks_per_step):
                    self._tasks[task.task_id] = task
                    yield {"prompt": task.task_id}

        if self.config.beta > 0:
            # trl builds its reference from the model's name_or_path: the saved cold start.
            self.model.config._name_or_path = str(self.reference_dir)
        trl_trainer = TRLGRPOTrainer(
            model=self.model, reward_funcs=rewards,
            args=self.trl_args(io), processing_class=self.tokenizer,
            train_dataset=IterableDataset.from_generator(
                _stream, gen_kwargs={"key": _register(draw)}),
            rollout_func=rollout_func, optimizers=(self.optimizer, self.scheduler),
            callbacks=[log])
        trl_trainer.remove_callback(PrinterCallback)  # the loop reports (io.log)
        self.last_trl = trl_trainer
        trl_trainer.train()

    @staticmethod
    def _flush(state: dict[str, Any], io: RoundIO) -> None:
        """Report the last batch as one update: its metrics and trl's logs of its optimizer
        steps (averaged)."""
        if state["pending"] is None:
            return
        logs: list[dict[str, float]] = state["logs"]
        merged = {k: sum(m[k] for m in logs if k in m) / sum(k in m for m in logs)
                  for k in {k for m in logs for k in m}}
        io.log({**merged, **state["pending"]})
        state["pending"], state["logs"] = None, []

    def _rollout(self, prompts: list[str], io: RoundIO, state: dict[str, Any]) -> dict[str, Any]:
        """trl's rollout_func: `prompts` are this rank's task ids, each repeated group_size times
        in a row."""
        from trainers import distributed

        state["flush"]()  # the previous batch's update is done
        g = io.group_size
        tasks = []
        for i in range(0, len(prompts), g):
            ids = set(prompts[i:i + g])
            if len(ids) != 1 or len(prompts[i:i + g]) != g:
                raise RuntimeError(f"trl handed this rank a split group: {prompts}")
            tasks.append(self._tasks[prompts[i]])
        was_training = self.model.training
        self.model.eval()
        try:
            trajs = io.rollout(tasks, g, f"r{io.round}s{state['step']}p{distributed.rank()}")
        finally:
            self.model.train(was_training)
        state["step"] += 1
        admitted, state["pending"] = io.observe(distributed.all_gather(trajs))
        out: dict[str, list[Any]] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs",
                                                     "env_mask", "reward_terms")}
        for t in trajs:
            # The policy's first token; a trajectory without one (its prompt filled the
            # budget) keeps its last token as a masked completion.
            cut = next((i for i, m in enumerate(t.loss_mask) if m), len(t.token_ids) - 1)
            out["prompt_ids"].append(list(t.token_ids[:cut]))
            out["completion_ids"].append(list(t.token_ids[cut:]))
            out["logprobs"].append([float(x) for x in t.logprobs[cut:]])
            # A group the curriculum's gate dropped (drop_zero_variance) trains no token.
            keep = int(t.traj_id in admitted)
            out["env_mask"].append([int(m) * keep for m in t.loss_mask[cut:]])
            out["reward_terms"].append(dict(t.reward_terms))
        return out
