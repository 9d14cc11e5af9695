"""Why a failed trajectory failed: the failure taxonomy, one deterministic rule per mode, and the
clusters of failures that generators aim at.

`FailureAnalyzer.classify` runs the detectors of `DETECTORS` in order and reports the first that
fires, with the first erroneous step (credit assignment) and a short quote of it as evidence.
A detector is a small function `(Attempt) -> (first_error_step, evidence) | None`.

The mode names the error that *caused* the failure, as a person reading the transcript would name
it, so a generator aiming at a cluster aims at what actually went wrong. The rules were fixed
against a hand-labelled corpus (tests/data/failure_corpus.jsonl, per-mode precision and recall in
tests/test_analyzer_corpus.py). Calls are compared by their *normalised* key: tool name and
arguments with whitespace removed from string values and case folded, so `3+4` and `3 + 4` are
the same call.

1. A mistake the policy recovered from is not the cause. An unknown tool counts only if no later
   call succeeded; bad arguments only if no later call to that tool succeeded; a tool failure
   (`tool_error`/`timeout`) only if the same call (same normalised key) never succeeded later
   (answering from a guess instead of retrying is not recovery); a parse error only if no
   well-formed step followed it. So "unknown tool, then the right calls, then a wrong answer" is
   a `wrong_answer` whose first error is the answer, not the recovered slip (the reward has
   already charged the slip to `format`/`process`).
2. Among causes, the most specific and least recoverable comes first:

   1. `hallucinated_observation`: a step wrote its own `<tool_response>` and the invented text was
      not what the tools returned: an invented observation in a turn without a successful call,
      or one that differs from that turn's real observations. Everything after it rests on an
      invented value. A turn that makes a call and merely echoes the tool's true result is a
      harmless style slip (charged by the process reward), not the cause.
   2. `format_error`: the episode ended in ill-formed output: a trailing run of parse errors or a
      final turn that is neither a call nor an answer (also when the token limit cut that turn:
      the policy did not form a call or an answer within its budget). Exception: a final prose
      turn after an unrecovered unknown tool, bad arguments or tool failure is the policy giving
      up on that error, which is then the cause.
   3. `unknown_tool`: an unrecovered call to a tool that does not exist.
   4. `bad_arguments`: an unrecovered call with invalid arguments.
   5. `loop`: one call (normalised key) made `loop_repeats` times more than the reference needs
      it (`loop_repeats - 1` pointless repeats beyond the reference's count, at least one use
      allowed), in a row or not: A B A B A B is a loop too. A call that failed transiently does
      not count, so retrying it is not a loop. The first error is the first pointless repeat.
   6. `tool_error_unrecovered`: a tool failed and the same call never succeeded later.
   7. `no_answer`: no answer at all (the turn or token limit ended the episode). The first error
      is the step after the one that obtained the final answer (it should have answered then),
      else the last step.
   8. `premature_answer`: a wrong answer before the work was done: fewer distinct successful
      calls than the reference solution makes (`family.solve` on the task's tools, cached per
      task id), and no call ever returned the final answer. Repeating a call is not progress,
      so "3+4, 3+4, answer 7" is premature. An agent that did obtain the right result and then
      answered something else made a `wrong_answer` (a transcription error). The first error is
      the answer, unless the family's `locate_error` finds a call before it that was no progress
      (a copy error: `11*11` where `4*11` was due; the answer only followed from it), as for
      `wrong_answer`.
   9. `wrong_answer`: everything else; the family's `locate_error`, run on the steps without the
      (recovered) errored ones, says where.

A task with a revealed prefix (`Task.prefix`): the detectors read the whole episode (a fault met
in the prefix and never retried by the policy is still unrecovered), but the first erroneous step
is never a revealed one: an error placed on the prefix moves to the policy's first step, the first
move it made from the state it was given (None when the prefix left it none).

The analyzer never crashes on garbage (steps with None fields, odd kinds, non-dict arguments): such
fields simply do not match the rule that looks for them. Family hooks (`solve`, `locate_error`)
that raise on garbage are reported in the evidence instead of being trusted.

`cluster_failures` groups a round's failures by `cluster_id` (family, sorted skills, mode) into
the rows of the store's `clusters` table, each with a plain-text summary that the `teacher`
generator reads.

Fault tasks (a `recover:T` skill, T the fault type; `fault_type_of`): their skill set keeps fault
types apart in the clusters, and each cluster row names its `fault_type`, which its summary states
with the round's total for that type (the other skills split one type over several clusters). An
`unknown_tool`, `bad_arguments` or `tool_error_unrecovered` failure of a fault task says the fault
type first in its evidence (`fault timeout: step 1: ...`).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from sentinel.env.parser import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    RESPONSE_CLOSE,
    RESPONSE_OPEN,
    RESPONSE_RE,
)
from sentinel.tasks.base import TaskFamily
from sentinel.types import Failure, Step, Task, Trajectory, canonical_json

EVIDENCE_CHARS = 200
QUOTE_CHARS = 80
SUMMARY_CHARS = 600
TRANSIENT_ERRORS = ("tool_error", "timeout")
CALL_ERRORS = ("unknown_tool", "bad_arguments", *TRANSIENT_ERRORS)
TREND_ROUNDS = 3  # earlier rounds in the trend's least-squares fit
TREND_FLAT = 0.005  # |slope| below this (share per round) reads as "steady"
# A task carries fault type T when its skills hold `recover:T` (as in the store's
# `recovery_rates` view); these modes' evidence names it, since the fault is what went wrong.
RECOVER_PREFIX = "recover:"
FAULT_EVIDENCE_MODES = ("unknown_tool", "bad_arguments", "tool_error_unrecovered")

_SPACE_RE = re.compile(r"\s+")

Detection = tuple[int | None, str]
CallKey = tuple[str, str]


@dataclass
class Reference:
    """What the family's reference solution of a task does: its calls (normalised keys, in
    order) and its final answer."""

    calls: list[CallKey] = field(default_factory=list)
    answer: str = ""


@dataclass
class Attempt:
    """What the detectors read: the task, the trajectory, its steps, and lazily the reference."""

    task: Task
    trajectory: Trajectory
    steps: list[Step]
    family: TaskFamily | None
    loop_repeats: int
    reference: Callable[[], Reference | None]


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


def _normalise(value: Any) -> Any:
    if isinstance(value, str):
        return _SPACE_RE.sub("", value).casefold()
    if isinstance(value, dict):
        return {str(k): _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    return value


def call_key(tool: Any, arguments: Any) -> CallKey:
    """The normalised identity of a call: `3+4` and `3 + 4` are the same call."""
    return str(tool), _args_text(_normalise(arguments))


def _key(step: Step) -> CallKey:
    return call_key(step.tool, step.arguments)


def _quote(step: Step) -> str:
    """A short rendering of a step: the call and its error, else the answer, else the text."""
    if step.kind == "tool_call" or step.tool is not None:
        quoted = f"{step.tool}({_args_text(step.arguments)})"
        if step.error is not None:
            quoted += f" -> {step.error}"
    elif step.answer is not None:
        quoted = f"{ANSWER_OPEN}{step.answer}{ANSWER_CLOSE}"
    else:
        quoted = f"{step.text!r}"
    return _clip(str(quoted), QUOTE_CHARS)


def _is_call(step: Step) -> bool:
    return step.kind == "tool_call"


def _succeeded(step: Step) -> bool:
    return _is_call(step) and step.error is None and step.error_kind is None


def _well_formed(step: Step) -> bool:
    return step.kind in ("tool_call", "answer") and step.error_kind != "parse"


def _recovered(steps: list[Step], pos: int) -> bool:
    """Whether the error of `steps[pos]` was repaired later (see rule 1 of the docstring)."""
    step, later = steps[pos], [s for s in steps[pos + 1 :] if _succeeded(s)]
    if step.error_kind == "unknown_tool":
        return bool(later)
    if step.error_kind == "bad_arguments":
        return any(s.tool == step.tool for s in later)
    if step.error_kind in TRANSIENT_ERRORS:
        return any(_key(s) == _key(step) for s in later)
    return any(_well_formed(s) for s in steps[pos + 1 :])


def _answer_pos(attempt: Attempt) -> int | None:
    """Position of the last answer step, if any."""
    positions = [i for i, s in enumerate(attempt.steps) if s.kind == "answer"]
    return positions[-1] if positions else None


def _answered(attempt: Attempt) -> bool:
    return attempt.trajectory.answer is not None or _answer_pos(attempt) is not None


def _first_unrecovered(attempt: Attempt, error_kinds: tuple[str, ...]) -> Detection | None:
    """The first step with one of `error_kinds` that was never recovered from."""
    steps = attempt.steps
    for pos, step in enumerate(steps):
        if step.error_kind in error_kinds and not _recovered(steps, pos):
            return _index(steps, pos), f"step {_index(steps, pos)}: {_quote(step)}"
    return None


def _invents(steps: list[Step], pos: int) -> bool:
    """Whether the hallucinated `steps[pos]` invented something: its turn (the steps sharing its
    text) has no successful call, or a `<tool_response>` in it is not one of the turn's real
    observations (or cannot be read at all)."""
    text = steps[pos].text if isinstance(steps[pos].text, str) else ""
    turn = [s for s in steps if s.text == text and s.hallucinated is True]
    real = {str(s.observation).strip() for s in turn if _succeeded(s)}
    invented = RESPONSE_RE.findall(text)
    complete = len(invented) == text.count(RESPONSE_OPEN) == text.count(RESPONSE_CLOSE)
    return not (real and invented and complete and all(i.strip() in real for i in invented))


# -- detectors, one per mode --------------------------------------------------------------------
def detect_hallucinated_observation(attempt: Attempt) -> Detection | None:
    for pos, step in enumerate(attempt.steps):
        if step.hallucinated is True and _invents(attempt.steps, pos):
            return _index(attempt.steps, pos), (
                f"step {_index(attempt.steps, pos)} wrote its own {RESPONSE_OPEN}: "
                f"{_clip(str(step.text), QUOTE_CHARS)!r}"
            )
    return None


def _policy_step(steps: list[Step], first: int | None) -> int | None:
    """`first`, unless it is a revealed step: then the policy's first step (None if none)."""
    revealed = {_index(steps, p) for p, s in enumerate(steps) if s.revealed is True}
    if first not in revealed:
        return first
    return next((_index(steps, p) for p, s in enumerate(steps) if s.revealed is not True), None)


def detect_format_error(attempt: Attempt) -> Detection | None:
    """The trailing run of ill-formed steps (after the last well-formed one), if any, unless it
    is prose giving up after an unrecovered call error."""
    steps = attempt.steps
    last_good = max((i for i, s in enumerate(steps) if _well_formed(s)), default=-1)
    if last_good == len(steps) - 1:
        return None
    pos = last_good + 1
    gave_up = all(s.kind == "text" for s in steps[pos:]) and _first_unrecovered(
        attempt, CALL_ERRORS
    )
    if gave_up:
        return None
    step = steps[pos]
    why = step.error if step.error is not None else "neither a tool call nor an answer"
    return _index(steps, pos), (
        f"step {_index(steps, pos)} ill-formed ({_clip(str(why), QUOTE_CHARS)}): "
        f"{_clip(str(step.text), QUOTE_CHARS)!r}"
    )


def detect_unknown_tool(attempt: Attempt) -> Detection | None:
    return _first_unrecovered(attempt, ("unknown_tool",))


def detect_bad_arguments(attempt: Attempt) -> Detection | None:
    return _first_unrecovered(attempt, ("bad_arguments",))


def detect_loop(attempt: Attempt) -> Detection | None:
    """A call made `loop_repeats - 1` times more than the reference needs it; the first
    pointless repeat is the first error."""
    steps = attempt.steps
    reference = attempt.reference()
    needed = Counter(reference.calls) if reference is not None else Counter()
    seen: Counter[CallKey] = Counter()
    first_excess: dict[CallKey, int] = {}
    for pos, step in enumerate(steps):
        if not _is_call(step) or step.error_kind in TRANSIENT_ERRORS:
            continue
        key = _key(step)
        seen[key] += 1
        allowed = max(1, needed[key])
        if seen[key] == allowed + 1:
            first_excess[key] = pos
        if seen[key] >= allowed + attempt.loop_repeats - 1:
            first = first_excess[key]
            return _index(steps, first), (
                f"step {_index(steps, first)}: {_quote(step)} made {seen[key]} times "
                f"(the reference needs it {needed[key]} times)"
            )
    return None


def detect_tool_error_unrecovered(attempt: Attempt) -> Detection | None:
    return _first_unrecovered(attempt, TRANSIENT_ERRORS)


def detect_no_answer(attempt: Attempt) -> Detection | None:
    """No answer. The first error is the step after the one that obtained the final answer (it
    should have answered there), else the last step (the limit came before the work was done)."""
    if _answered(attempt):
        return None
    steps = attempt.steps
    reason = attempt.trajectory.finish_reason
    if not steps:
        return None, f"no steps (finish_reason {reason!r})"
    last = len(steps) - 1
    reference = attempt.reference()
    had = next(
        (
            pos
            for pos, s in enumerate(steps)
            if reference is not None and _succeeded(s)
            and str(s.observation).strip() == reference.answer
        ),
        None,
    )
    if had is not None and had < last:
        return _index(steps, had + 1), (
            f"no answer (finish_reason {reason!r}) although step {_index(steps, had)} obtained "
            f"it: {_quote(steps[had])}; then step {_index(steps, had + 1)}: "
            f"{_quote(steps[had + 1])}"
        )
    return _index(steps, last), (
        f"no answer (finish_reason {reason!r}); last step {_index(steps, last)}: "
        f"{_quote(steps[last])}"
    )


def detect_premature_answer(attempt: Attempt) -> Detection | None:
    pos = _answer_pos(attempt)
    reference = attempt.reference()
    if pos is None or reference is None:
        return None
    done = [s for s in attempt.steps[:pos] if _succeeded(s)]
    made = len({_key(s) for s in done})
    needed = len(reference.calls)
    if made >= needed or any(str(s.observation).strip() == reference.answer for s in done):
        return None
    return _located(attempt, _index(attempt.steps, pos), (
        f"step {_index(attempt.steps, pos)} answered {attempt.steps[pos].answer!r} after {made} "
        f"of the {needed} distinct tool calls the reference makes"
    ))


def detect_wrong_answer(attempt: Attempt) -> Detection:
    """Always fires. The first error is where `family.locate_error` puts it (on the steps without
    errors: any error left at this point was recovered from), else the answer."""
    steps = attempt.steps
    pos = _answer_pos(attempt)
    answer = steps[pos].answer if pos is not None else attempt.trajectory.answer
    first = _index(steps, pos) if pos is not None else None
    evidence = f"answered {_clip(str(answer), QUOTE_CHARS)!r}, expected {attempt.task.answer!r}"
    return _located(attempt, first, evidence)


def _located(attempt: Attempt, first: int | None, evidence: str) -> Detection:
    """`(first, evidence)` with the first error moved to where `family.locate_error` puts it on
    the steps without errors (any error left was recovered from): a copy error in a call before
    the answer, rather than the answer that followed from it."""
    if attempt.family is None:
        return first, evidence
    steps = attempt.steps
    clean = [s for s in steps if s.error is None and s.error_kind is None and s.kind != "text"]
    try:
        located = attempt.family.locate_error(attempt.task, clean)
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
        self._references: dict[str, Reference | None] = {}
        # cluster_id -> [(round, share of rollouts)] of earlier rounds: the trend's input.
        self.history: dict[str, list[tuple[int, float]]] = defaultdict(list)

    def reference(self, task: Task) -> Reference | None:
        """The family's reference solution of `task` (normalised calls and answer), None if it
        cannot be solved here (unknown family, or the solver raised); cached per task id."""
        if task.task_id not in self._references:
            family = self.families.get(task.family)
            found: Reference | None = None
            if family is not None:
                try:
                    solution = family.solve(task.spec, family.tool_map(task.spec))
                    found = Reference(
                        calls=[call_key(c.tool, c.arguments) for c in solution.calls],
                        answer=str(solution.answer).strip(),
                    )
                except Exception:  # unknown then; premature_answer just won't fire
                    found = None
            self._references[task.task_id] = found
        return self._references[task.task_id]

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
            reference=lambda: self.reference(task),
        )
        # `wrong_answer` comes last and always fires, so `next` always finds a mode.
        mode, (first_error_step, evidence) = next(
            (mode, found) for mode, detect in DETECTORS.items() if (found := detect(attempt))
        )
        if (moved := _policy_step(attempt.steps, first_error_step)) != first_error_step:
            evidence = f"from revealed step {first_error_step} to the policy's {moved}: {evidence}"
            first_error_step = moved
        fault = fault_type_of(task.skills)
        if fault is not None and mode in FAULT_EVIDENCE_MODES:
            evidence = f"fault {fault}: {evidence}"
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

    def analyze(self, trajectories: list[Trajectory], tasks: dict[str, Task],
                round: int) -> tuple[list[Failure], list[ClusterRow]]:
        """A round's training trajectories: the failures of the failed ones (in order) and their
        clusters (`cluster_failures`, shares over all of `trajectories`, trends from the rounds
        this analyzer saw before); the clusters are remembered for later rounds' trends."""
        failures = [f for t in trajectories if not t.success
                    for f in [self.classify(tasks[t.task_id], t)] if f is not None]
        if not trajectories:
            return failures, []
        clusters = cluster_failures(failures, round, len(trajectories), history=self.history,
                                    tasks=tasks)
        self.remember((c["cluster_id"], c["round"], c["share"]) for c in clusters)
        return failures, clusters

    def remember(self, shares: Iterable[tuple[str, int, float]]) -> None:
        """Add `(cluster_id, round, share)` rows (a resumed run's stored clusters) to the trend
        history."""
        for cluster_id, r, share in shares:
            self.history[cluster_id].append((r, share))


def fault_types(skills: Iterable[Any] | None) -> list[str]:
    """The fault types a task's skills carry, sorted: T of each `recover:T` tag (a bare
    `recover:` is no type).

    >>> fault_types(["op:add", "recover:timeout", "recover:notation", "recover:"])
    ['notation', 'timeout']
    """
    return sorted({str(s)[len(RECOVER_PREFIX):] for s in skills or ()
                   if str(s).startswith(RECOVER_PREFIX) and len(str(s)) > len(RECOVER_PREFIX)})


def fault_type_of(skills: Iterable[Any] | None) -> str | None:
    """A task's fault type: its `fault_types` joined by `+`, None for a clean task.

    >>> fault_type_of(["op:add", "recover:timeout", "steps:2"])
    'timeout'
    >>> fault_type_of(["recover:timeout", "recover:notation"]), fault_type_of(["op:add"])
    ('notation+timeout', None)
    """
    return "+".join(fault_types(skills)) or None


def cluster_key(failure: Failure) -> tuple[str, tuple[str, ...], str]:
    """(family, sorted skills, mode): failures a generator can aim at together."""
    return failure.family, tuple(sorted(str(s) for s in failure.skills or ())), failure.mode


# -- clusters -----------------------------------------------------------------------------------
class ClusterRow(TypedDict):
    """One row of the store's `clusters` table, plus `fault_type` (`fault_type_of` its skills),
    which is not a column: the store derives it from `skills` where it needs it."""

    round: int
    cluster_id: str
    family: str
    skills: list[str]
    mode: str
    n_failures: int
    share: float
    trend: float | None
    exemplar_traj_ids: list[str]
    summary: str
    fault_type: str | None


def share_trend(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of share per round through `points` ((round, share)); None (NULL in
    the store: no trend yet) with fewer than two distinct rounds.

    >>> share_trend([(1, 0.1), (2, 0.2), (3, 0.3)])
    0.1
    >>> share_trend([(4, 0.5)]) is None
    True
    """
    if len({r for r, _ in points}) < 2:
        return None
    n = len(points)
    mean_r = sum(r for r, _ in points) / n
    mean_s = sum(s for _, s in points) / n
    num = sum((r - mean_r) * (s - mean_s) for r, s in points)
    den = sum((r - mean_r) ** 2 for r, _ in points)
    return round(num / den, 6)


def _trend_word(trend: float | None) -> str:
    if trend is None:
        return "new"
    if trend > TREND_FLAT:
        return "rising"
    if trend < -TREND_FLAT:
        return "falling"
    return "steady"


def _exemplars(failures: list[Failure], k: int) -> list[Failure]:
    """Up to `k` failures, distinct tasks first, in the order they came."""
    first_of_task: dict[str, Failure] = {}
    for f in failures:
        first_of_task.setdefault(f.task_id, f)
    chosen = list(first_of_task.values())[:k]
    rest = [f for f in failures if f not in chosen]
    return (chosen + rest)[:k]


def _summary(rows_failures: list[Failure], row: ClusterRow, tasks: dict[str, Task],
             by_fault: Counter[str], clusters_of_fault: Counter[str]) -> str:
    skills = ", ".join(row["skills"]) or "-"
    head = (
        f"{row['family']} | {skills} | {row['mode']}: {row['n_failures']} failures "
        f"({row['share']:.0%} of rollouts, {_trend_word(row['trend'])})"
    )
    parts = [head]
    fault = row["fault_type"]
    if fault is not None:
        # The other skills (operations, steps) split one fault type over several clusters.
        parts.append(f"fault {fault}: {by_fault[fault]} failures of this fault type this round, "
                     f"in {clusters_of_fault[fault]} clusters")
    steps = Counter(f.first_error_step for f in rows_failures if f.first_error_step is not None)
    if steps:
        step, _ = min(steps.items(), key=lambda kv: (-kv[1], kv[0]))
        parts.append(f"first error usually at step {step}")
    examples = []
    for f in _exemplars(rows_failures, 2):
        task = tasks.get(f.task_id)
        spec = canonical_json(task.spec) if task is not None else f.task_id
        examples.append(f"task {spec}: {f.evidence}")
    if examples:
        parts.append("e.g. " + "; ".join(examples))
    return _clip("; ".join(parts), SUMMARY_CHARS)


def cluster_failures(
    failures: list[Failure],
    round: int,
    n_rollouts: int,
    history: dict[str, list[tuple[int, float]]] | None = None,
    exemplars: int = 3,
    tasks: dict[str, Task] | None = None,
) -> list[ClusterRow]:
    """Group `failures` (one round's) by `cluster_id` into rows of the `clusters` table.

    `share` = n_failures / `n_rollouts` (the round's training rollouts); `trend` = least-squares
    slope of share per round over the last `TREND_ROUNDS` rounds of `history` (cluster_id ->
    [(round, share)], earlier rounds only; later or equal rounds are ignored) plus this round, None
    (NULL) for a new cluster; `exemplar_traj_ids` = up to `exemplars` failed trajectories, distinct
    tasks first; `summary` = a short plain-text paragraph (the `teacher` generator's input) quoting
    up to two exemplar tasks when `tasks` (task_id -> Task) has them, and for a cluster of fault
    tasks its fault type and that type's failures and clusters in the round; `fault_type` =
    `fault_type_of(skills)`. Rows come biggest cluster first.

    This is the run's one trend definition: the store's `failure_patterns` view shows the stored
    `clusters.trend` of a pattern's last round instead of fitting a slope of its own.
    """
    if n_rollouts < 1:
        raise ValueError(f"n_rollouts must be at least 1, got {n_rollouts}")
    history = history or {}
    tasks = tasks or {}
    groups: dict[str, list[Failure]] = defaultdict(list)
    for f in failures:
        groups[f.cluster_id].append(f)
    fault_of = {cid: fault_type_of(cluster_key(members[0])[1]) for cid, members in groups.items()}
    by_fault: Counter[str] = Counter()  # fault type -> the round's failures of it
    clusters_of_fault: Counter[str] = Counter()
    for cid, members in groups.items():
        if (fault := fault_of[cid]) is not None:
            by_fault[fault] += len(members)
            clusters_of_fault[fault] += 1
    rows: list[ClusterRow] = []
    for cluster_id, members in groups.items():
        family, skills, mode = cluster_key(members[0])
        share = len(members) / n_rollouts
        past = sorted((r, s) for r, s in history.get(cluster_id, []) if r < round)
        past = past[-TREND_ROUNDS:]
        row = ClusterRow(
            round=round,
            cluster_id=cluster_id,
            family=family,
            skills=list(skills),
            mode=mode,
            n_failures=len(members),
            share=share,
            trend=share_trend([*past, (round, share)]),
            exemplar_traj_ids=[f.traj_id for f in _exemplars(members, exemplars)],
            summary="",
            fault_type=fault_of[cluster_id],
        )
        row["summary"] = _summary(members, row, tasks, by_fault, clusters_of_fault)
        rows.append(row)
    rows.sort(key=lambda r: (-r["n_failures"], r["cluster_id"]))
    return rows
