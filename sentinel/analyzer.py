"""Why a failed trajectory failed: the failure taxonomy, one deterministic rule per mode.

`FailureAnalyzer.classify` runs the detectors of `DETECTORS` in order and reports the first that
fires, with the first erroneous step (credit assignment) and a short quote of it as evidence.
A detector is a small function `(Attempt) -> (first_error_step, evidence) | None`.

The mode names the error that *caused* the failure, so a generator aiming at a cluster aims at
what actually went wrong. Hence two rules:

1. A mistake the policy recovered from is not the cause. An unknown tool, bad arguments or a tool
   failure counts only if no later call to that tool succeeded (any later successful call, for an
   unknown tool); a parse error counts only if no well-formed step followed it. So "unknown tool,
   then the right call, then a wrong answer" is a `wrong_answer` (the reward has already charged
   the slip to `format`/`process`).
2. Among causes, the most specific and least recoverable comes first:

   1. `hallucinated_observation`: a step wrote its own `<tool_response>`. Everything after it
      rests on an invented observation, so nothing later can be trusted as the cause.
   2. `format_error`: the episode ended in ill-formed output: a trailing run of parse errors or a
      final turn that is neither a call nor an answer (also when the token limit cut that turn:
      the policy did not form a call or an answer within its budget).
   3. `unknown_tool`: an unrecovered call to a tool that does not exist.
   4. `bad_arguments`: an unrecovered call with invalid arguments.
   5. `loop`: the same (tool, arguments) `loop_repeats` times in a row. A retry after a transient
      `tool_error`/`timeout` is the right thing to do, so it does not extend a run.
   6. `tool_error_unrecovered`: a tool failed and that tool never succeeded again.
   7. `no_answer`: no answer at all (the turn or token limit ended the episode).
   8. `premature_answer`: a wrong answer after fewer successful calls than the reference solution
      makes (`family.solve` on the task's tools, cached per task id).
   9. `wrong_answer`: everything else; the family's `locate_error` says where.

The analyzer never crashes on garbage (steps with None fields, odd kinds, non-dict arguments): such
fields simply do not match the rule that looks for them. Family hooks (`solve`, `locate_error`)
that raise on garbage are reported in the evidence instead of being trusted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sentinel.tasks.base import TaskFamily
from sentinel.types import Failure, Step, Task, Trajectory

EVIDENCE_CHARS = 200
QUOTE_CHARS = 80
TRANSIENT_ERRORS = ("tool_error", "timeout")

Detection = tuple[int | None, str]


@dataclass
class Attempt:
    """What the detectors read: the task, the trajectory, its steps, and lazily the reference."""

    task: Task
    trajectory: Trajectory
    steps: list[Step]
    family: TaskFamily | None
    loop_repeats: int
    reference_calls: Callable[[], int | None]


# -- helpers ------------------------------------------------------------------------------------
def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _index(steps: list[Step], pos: int) -> int:
    """The step's own index (what `steps.step` stores), or its position if that is garbage."""
    index = steps[pos].index
    return index if isinstance(index, int) and not isinstance(index, bool) else pos


def _args_text(arguments: Any) -> str:
    try:
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(arguments)


def _quote(step: Step) -> str:
    """A short rendering of a step: the call and its error, else the answer, else the text."""
    if step.kind == "tool_call" or step.tool is not None:
        quoted = f"{step.tool}({_args_text(step.arguments)})"
        if step.error is not None:
            quoted += f" -> {step.error}"
    elif step.answer is not None:
        quoted = f"<answer>{step.answer}</answer>"
    else:
        quoted = f"{step.text!r}"
    return _clip(str(quoted), QUOTE_CHARS)


def _is_call(step: Step) -> bool:
    return step.kind == "tool_call"


def _succeeded(step: Step) -> bool:
    return _is_call(step) and step.error is None and step.error_kind is None


def _well_formed(step: Step) -> bool:
    return step.kind in ("tool_call", "answer") and step.error_kind != "parse"


def _recovered(steps: list[Step], pos: int, tool: str | None) -> bool:
    """Whether a later call succeeded: of `tool`, or of any tool when `tool` is None."""
    return any(_succeeded(s) and (tool is None or s.tool == tool) for s in steps[pos + 1 :])


def _answer_pos(attempt: Attempt) -> int | None:
    """Position of the last answer step, if any."""
    positions = [i for i, s in enumerate(attempt.steps) if s.kind == "answer"]
    return positions[-1] if positions else None


def _answered(attempt: Attempt) -> bool:
    return attempt.trajectory.answer is not None or _answer_pos(attempt) is not None


def _first_unrecovered(
    attempt: Attempt, error_kinds: tuple[str, ...], any_tool: bool
) -> Detection | None:
    """The first step with one of `error_kinds` after which no call succeeded (of the same tool,
    or of any tool when `any_tool`)."""
    steps = attempt.steps
    for pos, step in enumerate(steps):
        if step.error_kind in error_kinds and not _recovered(
            steps, pos, None if any_tool else step.tool
        ):
            return _index(steps, pos), f"step {_index(steps, pos)}: {_quote(step)}"
    return None


# -- detectors, one per mode --------------------------------------------------------------------
def detect_hallucinated_observation(attempt: Attempt) -> Detection | None:
    for pos, step in enumerate(attempt.steps):
        if step.hallucinated is True:
            return _index(attempt.steps, pos), (
                f"step {_index(attempt.steps, pos)} wrote its own <tool_response>: "
                f"{_clip(str(step.text), QUOTE_CHARS)!r}"
            )
    return None


def detect_format_error(attempt: Attempt) -> Detection | None:
    """The trailing run of ill-formed steps (after the last well-formed one), if any."""
    steps = attempt.steps
    last_good = max((i for i, s in enumerate(steps) if _well_formed(s)), default=-1)
    if last_good == len(steps) - 1:
        return None
    pos = last_good + 1
    step = steps[pos]
    why = step.error if step.error is not None else "neither a tool call nor an answer"
    return _index(steps, pos), (
        f"step {_index(steps, pos)} ill-formed ({_clip(str(why), QUOTE_CHARS)}): "
        f"{_clip(str(step.text), QUOTE_CHARS)!r}"
    )


def detect_unknown_tool(attempt: Attempt) -> Detection | None:
    return _first_unrecovered(attempt, ("unknown_tool",), any_tool=True)


def detect_bad_arguments(attempt: Attempt) -> Detection | None:
    return _first_unrecovered(attempt, ("bad_arguments",), any_tool=False)


def detect_loop(attempt: Attempt) -> Detection | None:
    """`loop_repeats` identical calls in a row; the first repeat is the first error."""
    steps = attempt.steps
    run_start, run = 0, 0
    previous: tuple[Any, str] | None = None
    for pos, step in enumerate(steps):
        key = (step.tool, _args_text(step.arguments)) if _is_call(step) else None
        retry = pos > 0 and steps[pos - 1].error_kind in TRANSIENT_ERRORS
        if key is not None and key == previous and not retry:
            run += 1
        else:
            run_start, run = pos, 1
        previous = key
        if key is not None and run >= attempt.loop_repeats:
            first_repeat = min(run_start + 1, pos)
            return _index(steps, first_repeat), (
                f"step {_index(steps, first_repeat)}: {_quote(step)} repeated {run} times in a row"
            )
    return None


def detect_tool_error_unrecovered(attempt: Attempt) -> Detection | None:
    return _first_unrecovered(attempt, TRANSIENT_ERRORS, any_tool=False)


def detect_no_answer(attempt: Attempt) -> Detection | None:
    if _answered(attempt):
        return None
    reason = attempt.trajectory.finish_reason
    if not attempt.steps:
        return None, f"no steps (finish_reason {reason!r})"
    last = len(attempt.steps) - 1
    return _index(attempt.steps, last), (
        f"no answer (finish_reason {reason!r}); last step {_index(attempt.steps, last)}: "
        f"{_quote(attempt.steps[last])}"
    )


def detect_premature_answer(attempt: Attempt) -> Detection | None:
    pos = _answer_pos(attempt)
    if pos is None:
        return None
    needed = attempt.reference_calls()
    made = sum(_succeeded(s) for s in attempt.steps[:pos])
    if needed is None or made >= needed:
        return None
    return _index(attempt.steps, pos), (
        f"step {_index(attempt.steps, pos)} answered {attempt.steps[pos].answer!r} after {made} "
        f"of the {needed} tool calls the reference makes"
    )


def detect_wrong_answer(attempt: Attempt) -> Detection:
    """Always fires. The first error is where `family.locate_error` puts it, else the answer."""
    steps = attempt.steps
    pos = _answer_pos(attempt)
    answer = steps[pos].answer if pos is not None else attempt.trajectory.answer
    first = _index(steps, pos) if pos is not None else None
    evidence = f"answered {_clip(str(answer), QUOTE_CHARS)!r}, expected {attempt.task.answer!r}"
    if attempt.family is not None:
        try:
            located = attempt.family.locate_error(attempt.task, steps)
        except Exception as exc:  # garbage steps may break family code; say so
            return first, f"{evidence} (locate_error raised {type(exc).__name__})"
        if isinstance(located, int) and located != first:
            quoted = next((_quote(s) for s in steps if s.index == located), "")
            evidence = f"{evidence}; first error at step {located}: {quoted}"
            first = located
    return first, evidence


Detector = Callable[[Attempt], Detection | None]

# Priority order: the first detector that fires names the mode (see the module docstring).
DETECTORS: dict[str, Detector] = {
    "hallucinated_observation": detect_hallucinated_observation,
    "format_error": detect_format_error,
    "unknown_tool": detect_unknown_tool,
    "bad_arguments": detect_bad_arguments,
    "loop": detect_loop,
    "tool_error_unrecovered": detect_tool_error_unrecovered,
    "no_answer": detect_no_answer,
    "premature_answer": detect_premature_answer,
    "wrong_answer": detect_wrong_answer,
}


class FailureAnalyzer:
    """Classifies failed trajectories into `FAILURE_MODES` (see the module docstring)."""

    def __init__(self, families: dict[str, TaskFamily], loop_repeats: int = 3) -> None:
        if loop_repeats < 2:
            raise ValueError(
                f"loop_repeats must be at least 2 (one call is not a loop), got {loop_repeats}"
            )
        self.families = families
        self.loop_repeats = loop_repeats
        self._reference_calls: dict[str, int | None] = {}

    def reference_calls(self, task: Task) -> int | None:
        """Tool calls of the family's reference solution of `task`, None if it cannot be
        solved here (unknown family, or the solver raised); cached per task id."""
        if task.task_id not in self._reference_calls:
            family = self.families.get(task.family)
            calls: int | None = None
            if family is not None:
                try:
                    calls = len(family.solve(task.spec, family.tool_map()).calls)
                except Exception:  # unknown then; premature_answer just won't fire
                    calls = None
            self._reference_calls[task.task_id] = calls
        return self._reference_calls[task.task_id]

    def classify(self, task: Task, trajectory: Trajectory) -> Failure | None:
        """The failure of `trajectory` on `task`, or None if it succeeded."""
        if trajectory.success:
            return None
        attempt = Attempt(
            task=task,
            trajectory=trajectory,
            steps=[s for s in (trajectory.steps or []) if isinstance(s, Step)],
            family=self.families.get(task.family),
            loop_repeats=self.loop_repeats,
            reference_calls=lambda: self.reference_calls(task),
        )
        # `wrong_answer` comes last and always fires, so `next` always finds a mode.
        mode, (first_error_step, evidence) = next(
            (mode, found) for mode, detect in DETECTORS.items() if (found := detect(attempt))
        )
        return Failure(
            traj_id=trajectory.traj_id,
            task_id=task.task_id,
            round=trajectory.round,
            mode=mode,
            first_error_step=first_error_step,
            evidence=_clip(evidence, EVIDENCE_CHARS),
            skills=list(task.skills or []),
            family=task.family,
        )


def cluster_key(failure: Failure) -> tuple[str, tuple[str, ...], str]:
    """(family, sorted skills, mode): failures a generator can aim at together."""
    return failure.family, tuple(sorted(str(s) for s in failure.skills or ())), failure.mode
