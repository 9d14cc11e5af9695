"""Rollout backends and the driver that runs multi-turn episodes with them.

A backend only samples: given token contexts and per-context budgets it returns, for each, the new
token ids and their sampling log-probs. The driver (`run_episodes`) owns the turn loop: it asks
every unfinished episode for its context, samples one turn for all of them in a batch, and hands
each turn back to its episode, which runs the tools. Backends: `hf` (transformers, CPU or GPU);
`vllm` is the GPU backend for real models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from sentinel.env.environment import Episode


class RolloutBackend(Protocol):
    def sample(self, contexts: Sequence[list[int]], budgets: Sequence[int], *, temperature: float,
               greedy: bool) -> list[tuple[list[int], list[float]]]: ...


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
