"""Rollouts: backends that sample tokens, the driver that runs multi-turn episodes with them, and
`Rollouts`, which turns tasks into scored trajectories.

A backend only samples: given token contexts and per-context budgets it returns, for each, the new
token ids and their sampling log-probs (`RolloutBackend`, the seam a new backend plugs into). The
driver (`run_episodes`) owns the turn loop: it asks every unfinished episode for its context,
samples one turn for all of them in a batch, and hands each turn back to its episode, which runs
the tools. `Rollouts.run` builds the episodes of a list of tasks (a group of samples per task),
drives them, and scores every trajectory with the hybrid reward.

Backends: `hf` (transformers: the static-KV-cache sampler, or `generate`) and `vllm` (an
in-process vLLM engine that follows the trained weights by pushes; `sentinel.rollout.vllm_backend`).
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig, Episode
from sentinel.env.parser import ToolCallParser
from sentinel.rewards import RewardConfig, score
from sentinel.tasks.base import TaskFamily
from sentinel.types import Split, Task, Trajectory


class RolloutBackend(Protocol):
    """Samples one turn for each context: `(new token ids, their sampling log-probs)`, at most
    `budgets[i]` tokens, stopping at eos. With `greedy`, argmax decoding (log-probs still those of
    softmax(logits / temperature))."""

    def sample(self, contexts: Sequence[list[int]], budgets: Sequence[int], *, temperature: float,
               greedy: bool) -> list[tuple[list[int], list[float]]]: ...


def build_backend(name: str, model: Any, tokenizer: Any, *, batch_size: int,
                  engine: str = "auto", vllm: Any = None, seed: int = 0) -> RolloutBackend:
    """The rollout backend `name` over the policy `(model, tokenizer)`; `vllm` holds the vllm
    backend's engine options (`VLLMOptions`)."""
    if name == "hf":
        from sentinel.rollout.hf import HFBackend

        return HFBackend(model, tokenizer, batch_size=batch_size, engine=engine)
    if name == "vllm":
        from sentinel.rollout.vllm_backend import VLLMBackend

        return VLLMBackend(model, tokenizer, batch_size=batch_size, options=vllm, seed=seed)
    raise ValueError(f"rollout.backend {name!r} is not available; use 'hf' or 'vllm'")


def run_episodes(backend: RolloutBackend, episodes: list[Episode], *, temperature: float,
                 greedy: bool = False, on_turn: Callable[[int], None] | None = None) -> None:
    """Drive every episode to its end. `on_turn(n_finished)` reports progress after each turn."""
    while True:
        active = [e for e in episodes if not e.done]
        if not active:
            break
        budgets = [e.turn_budget() for e in active]
        outputs = backend.sample([e.token_ids for e in active], budgets,
                                 temperature=temperature, greedy=greedy)
        for episode, (ids, logprobs) in zip(active, outputs, strict=True):
            if not ids:  # no budget left: the token limit ended the episode
                episode._finish("max_tokens")
                continue
            episode.add_policy_turn(ids, logprobs)
        if on_turn is not None:
            on_turn(sum(e.done for e in episodes))


class Rollouts:
    """Tasks in, scored trajectories out: everything a rollout needs but the tasks.

    `rng` seeds each episode's own RNG (fault injection), one draw per episode in task-major
    order, so a run's rollouts are reproducible from the loop's seed. `families` maps every family
    name a task may carry to the family that runs and verifies it.
    """

    def __init__(self, backend: RolloutBackend, chat: ChatFormat, parser: ToolCallParser,
                 families: Mapping[str, TaskFamily], env: EnvConfig, reward: RewardConfig, *,
                 temperature: float, rng: random.Random) -> None:
        self.backend, self.chat, self.parser = backend, chat, parser
        self.families, self.env, self.reward = families, env, reward
        self.temperature, self.rng = temperature, rng

    def run(self, tasks: Sequence[Task], samples: int, *, split: Split, round: int,
            group_prefix: str, greedy: bool = False,
            on_turn: Callable[[int], None] | None = None) -> list[Trajectory]:
        """`samples` rollouts of each task (group id `<group_prefix>-<task_id>`), scored."""
        episodes: list[tuple[Task, int, Episode]] = []
        for task in tasks:
            family = self.families[task.family]
            for k in range(samples):
                episode = Episode(task, family.tool_map(task.spec), self.chat, self.parser,
                                  self.env, random.Random(self.rng.getrandbits(64)),
                                  follow_ups=family.follow_up_turns(task.spec))
                episodes.append((task, k, episode))
        run_episodes(self.backend, [e for _, _, e in episodes], temperature=self.temperature,
                     greedy=greedy, on_turn=on_turn)
        trajectories = []
        for task, k, episode in episodes:
            traj = episode.trajectory(round=round, split=split, sample_idx=k,
                                      group_id=f"{group_prefix}-{task.task_id}")
            traj.reward, traj.reward_terms, traj.success = score(
                task, traj, self.families[task.family], self.reward)
            trajectories.append(traj)
        return trajectories


def batch_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """A step's rollout metrics, trl's names: mean and (population) std of the reward, success
    rate, mean completion length in policy tokens."""
    rewards = [t.reward for t in trajectories]
    n = max(len(trajectories), 1)
    return {
        "reward": sum(rewards) / n,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "success": sum(t.success for t in trajectories) / n,
        "completions/mean_length": sum(t.n_policy_tokens for t in trajectories) / n,
    }


def pass_rates(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Each task's share of successful trajectories."""
    outcomes: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories:
        outcomes[t.task_id].append(t.success)
    return {task_id: sum(v) / len(v) for task_id, v in outcomes.items()}
