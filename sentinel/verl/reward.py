"""`reward.custom_reward_function` for veRL: Sentinel's hybrid reward as `compute_score`.

veRL's reward manager (`naive`, `verl/experimental/reward_loop/reward_manager/naive.py`) calls

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **kwargs)

with the item's `extra_info` merged with the agent loop's `extra_fields` (`tool_extra_fields`).
It takes `result["score"]` as the reward and every key of the dict as `reward_extra_info`, which
veRL logs and, with `trainer.rollout_data_dir`, dumps per sample. So the dict holds:

- `score`: the hybrid reward (`sentinel.rewards.score`, the weights of the version's `reward`);
- `outcome`, `format`, `process`: the unweighted terms; `success`: the verifier's verdict;
- `task_id` and `sentinel`: a JSON string with the task row, its family config and the scored
  trajectory, which `sentinel ingest verl-rollouts` stores (strings are skipped by veRL's metrics).

The trajectory comes from Sentinel's agent loop (`extra_info["sentinel_episode"]`, with the tools
really run); without it (veRL's `single_turn_agent`) the response text is parsed as one assistant
turn with the env's parser and no tool runs. Nothing here catches exceptions: a task whose
ground truth disagrees with the dataset's, or a verifier that raises, fails the step loudly.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from sentinel.rewards import score
from sentinel.verl.episode import RECORD_KEY, steps_from_text, trajectory_from_record
from sentinel.verl.version import context_of

TERMS = ("outcome", "format", "process")


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    """Sentinel's hybrid reward of one veRL sample: `score`, the terms, `success`, `task_id` and
    the `sentinel` record (JSON text). Extra keyword arguments of veRL's managers are ignored."""
    from sentinel.env.parser import parser_class
    from sentinel.types import Trajectory

    ctx = context_of(extra_info or {})
    task = ctx.task
    if ground_truth is not None and str(ground_truth) != task.answer:
        raise ValueError(f"ground truth {ground_truth!r} of {task.task_id} is not the task's "
                         f"answer {task.answer!r}: the item and its task disagree")
    if data_source != f"sentinel/{task.family}":
        raise ValueError(f"data_source {data_source!r} is not sentinel/{task.family}")
    record = (extra_info or {}).get(RECORD_KEY)
    if record is not None:
        if record["task_id"] != task.task_id:
            raise ValueError(f"the episode ran task {record['task_id']}, the item is "
                             f"{task.task_id}")
        trajectory = trajectory_from_record(record)
    else:
        steps = steps_from_text(solution_str, parser_class(ctx.env.parser)())
        answers = [s.answer for s in steps if s.kind == "answer"]
        trajectory = Trajectory(
            task_id=task.task_id, messages=[*task.prompt,
                                            {"role": "assistant", "content": solution_str}],
            token_ids=[], loss_mask=[], logprobs=[], steps=steps,
            finish_reason="answer" if answers else "stop", answer=answers[-1] if answers else None)
        record = {"task_id": task.task_id, "messages": trajectory.messages, "token_ids": [],
                  "loss_mask": [], "prompt_len": 0,
                  "steps": [asdict(s) for s in steps], "finish_reason": trajectory.finish_reason,
                  "answer": trajectory.answer}
    reward, terms, success = score(task, trajectory, ctx.family, ctx.reward)
    stored = {"task": ctx.task.to_row(), "family_config": ctx.family_config,
              "version": ctx.version, "episode": record, "reward": reward, "terms": terms,
              "success": success}
    return {"score": reward, **{k: terms[k] for k in TERMS}, "success": success,
            "task_id": task.task_id, "sentinel": json.dumps(stored, ensure_ascii=False)}
