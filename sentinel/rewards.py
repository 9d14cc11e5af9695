"""The hybrid verifiable reward of one trajectory.

    reward = w_outcome * outcome + w_format * format + w_process * process

Each term is in [0, 1]: `outcome` is the family's verdict on the whole episode
(`TaskFamily.verify_trajectory`), `format` and `process` are pure functions of the steps,
documented and doctested below; `score` returns the weighted sum, the unweighted terms
(what the store logs) and success.

- `outcome`: 1.0 when the family's verifier accepts the final answer, else 0.0. It alone decides
  success.
- `format`: the share of steps that are well-formed: a parsed tool call or an answer, not a parse
  error, without a self-written `<tool_response>`. 0.0 for an empty trajectory.
- `process`: the share of parsed tool calls that were sound: a known tool, valid arguments, no
  hallucinated observation. A tool that failed on its own (`tool_error`, `timeout`, e.g. an
  injected fault) does not count against the policy, so recovery is never punished. With no parsed
  call at all, the term is 1.0 if the trajectory gave an answer (answering directly is judged by
  `outcome`, not here) and 0.0 otherwise (a trajectory of only garbage earns nothing).

The ordering users rely on, for any `w_format > 0` and `w_outcome > 0`: a trajectory with an
ill-formed step (format < 1, process <= 1, outcome 0) scores strictly below a wrong answer whose
steps are all well-formed and sound (exactly `w_format + w_process`), which scores below the same
trajectory with a correct answer (`w_outcome` more).

`format` and `process` judge the policy's own steps: the revealed steps of a task's prefix
(`Step.revealed`, replayed by the environment) are left out, so a slip in the revealed start state
is never charged to the policy.

Simplifications: no length penalty and no partial credit for intermediate values; both are easy
to add as further terms but reward hacking on them is hard to rule out.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from sentinel.tasks.base import TaskFamily
from sentinel.types import Step, Task, Trajectory

WELL_FORMED_KINDS = ("tool_call", "answer")
# Errors that are the policy's fault; `tool_error`/`timeout` are the tool's and `parse` is already
# what `format` measures.
POLICY_CALL_ERRORS = ("unknown_tool", "bad_arguments", "parse")


class RewardConfig(BaseModel):
    """Weights of the reward terms. Negative weights would reward the very behaviour a term
    measures against (and break the ordering malformed < wrong < correct), so they are refused."""

    model_config = ConfigDict(extra="forbid")
    w_outcome: float = Field(1.0, ge=0.0, description="weight of the verifier's verdict")
    w_format: float = Field(0.2, ge=0.0, description="weight of the share of well-formed steps")
    w_process: float = Field(0.1, ge=0.0, description="weight of the share of sound tool calls")


def is_well_formed(step: Step) -> bool:
    """A parsed tool call or an answer, not a parse error, with no self-written observation."""
    return (
        step.kind in WELL_FORMED_KINDS
        and step.error_kind != "parse"
        and step.hallucinated is not True
    )


def format_score(steps: Sequence[Step]) -> float:
    """Share of `steps` that are well-formed (`is_well_formed`); 0.0 when there are none.

    >>> from sentinel.types import Step
    >>> call = Step(0, "", "tool_call", tool="calculator", arguments={"expression": "3+4"})
    >>> bad = Step(1, "", "malformed", error="invalid JSON", error_kind="parse")
    >>> answer = Step(2, "", "answer", answer="7")
    >>> format_score([call, bad, answer])
    0.6666666666666666
    >>> format_score([Step(0, "<answer>7</answer><tool_response>", "answer", hallucinated=True)])
    0.0
    >>> format_score([])
    0.0
    """
    if not steps:
        return 0.0
    return sum(is_well_formed(s) for s in steps) / len(steps)


def is_sound_call(step: Step) -> bool:
    """A parsed call to a known tool with valid arguments and no self-written observation; a
    failure of the tool itself (`tool_error`, `timeout`) still counts as sound."""
    return step.error_kind not in POLICY_CALL_ERRORS and step.hallucinated is not True


def process_score(steps: Sequence[Step]) -> float:
    """Share of parsed tool calls (kind `tool_call`) that are sound (`is_sound_call`). With no
    parsed call: 1.0 if some step answered, else 0.0.

    >>> from sentinel.types import Step
    >>> ok = Step(0, "", "tool_call", tool="calculator", arguments={"expression": "3+4"})
    >>> unknown = Step(1, "", "tool_call", tool="calc", error_kind="unknown_tool")
    >>> flaky = Step(2, "", "tool_call", tool="calculator", error_kind="timeout")
    >>> process_score([ok, unknown, flaky])
    0.6666666666666666
    >>> process_score([Step(0, "", "answer", answer="7")])
    1.0
    >>> process_score([Step(0, "", "malformed", error_kind="parse")])
    0.0
    """
    calls = [s for s in steps if s.kind == "tool_call"]
    if not calls:
        return 1.0 if any(s.kind == "answer" for s in steps) else 0.0
    return sum(is_sound_call(s) for s in calls) / len(calls)


def score(
    task: Task, trajectory: Trajectory, family: TaskFamily, config: RewardConfig
) -> tuple[float, dict[str, float], bool]:
    """(reward, unweighted terms `outcome`/`format`/`process`, success) of `trajectory` on `task`.

    Success is the verifier's verdict alone. Nothing here catches exceptions: a verifier that
    raises is a bug to surface, not a zero reward.
    """
    policy_steps = [s for s in trajectory.steps if not s.revealed]
    terms = {
        # The whole episode: families judged on final state (bfcl) need more than the answer.
        "outcome": 1.0 if family.verify_trajectory(task, trajectory) else 0.0,
        "format": format_score(policy_steps),
        "process": process_score(policy_steps),
    }
    reward = (
        config.w_outcome * terms["outcome"]
        + config.w_format * terms["format"]
        + config.w_process * terms["process"]
    )
    return reward, terms, terms["outcome"] == 1.0
