"""An episode as plain JSON, so it can cross veRL's process boundaries (agent loop → reward
worker → rollout dump → `sentinel ingest`) and come back as the `Trajectory` it was.

`episode_record` is what the agent loop puts in `extra_fields["sentinel_episode"]`;
`trajectory_from_record` rebuilds the trajectory (steps included) for the reward and the ingest.
`steps_from_text` is the fallback for a response no Sentinel agent loop produced (veRL's
`single_turn_agent`): the text is parsed as one assistant turn, tools are not run.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sentinel.env.environment import Episode
from sentinel.env.parser import ToolCallParser
from sentinel.types import Step, Trajectory

RECORD_KEY = "sentinel_episode"


def episode_record(episode: Episode) -> dict[str, Any]:
    """The finished episode's trajectory as JSON-serialisable data (log-probs left out: veRL
    keeps them in `rollout_log_probs`)."""
    return {
        "task_id": episode.task.task_id,
        "messages": episode.messages,
        "token_ids": list(episode.token_ids),
        "loss_mask": list(episode.loss_mask),
        "prompt_len": episode.prompt_len,
        "steps": [asdict(s) for s in episode.steps],
        "finish_reason": episode.finish_reason,
        "answer": episode.answer,
    }


def trajectory_from_record(record: dict[str, Any], **fields: Any) -> Trajectory:
    """The `Trajectory` of an `episode_record` (log-probs 0.0); `fields` set the others
    (round, split, group_id, ...)."""
    return Trajectory(
        task_id=record["task_id"], messages=list(record["messages"]),
        token_ids=[int(t) for t in record["token_ids"]],
        loss_mask=[int(m) for m in record["loss_mask"]],
        logprobs=[0.0] * len(record["token_ids"]),
        steps=[Step(**s) for s in record["steps"]], finish_reason=record["finish_reason"],
        answer=record["answer"], prompt_len=int(record["prompt_len"]), **fields)


def steps_from_text(text: str, parser: ToolCallParser) -> list[Step]:
    """The steps of `text` read as one assistant turn, as `Episode` reads a turn, without running
    any tool: calls are `tool_call` steps (or `malformed` when they do not parse)."""
    turn = parser.parse(text)
    if turn.calls:
        steps = [Step(index=i, text=text, kind="malformed" if c.error else "tool_call",
                      tool=c.name, arguments=c.arguments, error=c.error,
                      error_kind="parse" if c.error else None)
                 for i, c in enumerate(turn.calls)]
    elif turn.answer is not None and turn.format_error is None:
        steps = [Step(index=0, text=text, kind="answer", answer=turn.answer)]
    elif turn.format_error is not None:
        steps = [Step(index=0, text=text, kind="malformed", error=turn.format_error,
                      error_kind="parse")]
    else:
        steps = [Step(index=0, text=text, kind="text")]
    for step in steps:
        step.hallucinated = turn.hallucinated
    return steps
