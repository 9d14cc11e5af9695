"""The validation pipeline every generated candidate passes before it can reach training.

Per candidate, in order (the first failing check is the rejection reason):

1. `not_a_candidate`: not a `Candidate`, or its fields have the wrong types; `unparseable`: the
   generator yielded `Unparseable` (free text it could not read, e.g. a teacher's garbage).
2. `unknown_family`: its family is not one of `families`.
3. `schema`: a text of the candidate (spec keys and values, family, lineage, prefix) cannot be
   stored (not UTF-8: a lone surrogate; the detail names the field), or `family.validate_spec`
   refuses the spec. Every text of a rejection is stored with such characters escaped.
4. `unsolvable`: `family.make_task` fails: the reference solver, really calling the tools, cannot
   solve it. The task's answer is whatever the tools produced, never the generator's claim.
5. `answer_mismatch`: the candidate claims an answer and the family's verifier refuses it.
6. `unverifiable`: the verifier refuses the reference answer itself (a family bug or a spec
   the verifier cannot judge); training on it would reward nothing.
7. `bad_prefix` (a candidate with a `prefix`, the revealed start state of `Task.prefix`):
   replaying the prefix through the environment under the run's limits ends the episode (an
   answer, a turn that is neither call nor answer, the turn limit, or more tokens than the
   budget leaves a turn), or the reference continuation from the state it reaches does not
   verify (`sentinel.tasks.prefix.prefix_problem`), or there is no `replay` to check it with.
   The detail says which, and holds the prefix (the `spec` column does not).
8. `duplicate`: the task id (a content hash of family, canonical spec and prefix) is already
   known (`known_task_ids`, asked once per batch) or came earlier in this batch.

Then, optionally and for the whole round at once (`probe_tasks`, called by `run_generators`):

9. `probe_budget` / `too_easy` / `too_hard`: the difficulty probe. At most `probe_budget` tasks
   are probed per round, taken round-robin across generators (one generator cannot use up the
   budget); the rest are *rejected* with `probe_budget`, so every accepted task passed every
   configured check (a rejected spec may be proposed again, and probed, in a later round). The
   probe returns each task's pass rate under the current policy; a task is kept when the rate is
   inside the band, bounds included (`lo <= rate <= hi`), else rejected as `too_easy` (above)
   or `too_hard` (below), the rate in the detail. Kept tasks carry it in `probe_pass_rate`.

Accepted tasks carry lineage: `origin="generated"`, `created_round`, `parent_task_id`,
`failure_ids` and `generator` (the name passed here, not whatever the candidate says, so a plugin
cannot pass its tasks off as another generator's). Every rejection keeps the spec as canonical JSON
text (the store's `rejections.spec` is a JSON column), the reason and a detail.

The spec is untrusted input flowing into family and tool code, so steps 3-7 turn *any* exception
into a rejection whose detail names the exception type and message: one bad candidate must not
abort the round, and nothing is dropped without a record.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import Any

from generators.base import Replay, Unparseable, round_robin
from sentinel.tasks import SpecError, TaskFamily
from sentinel.tasks.prefix import prefix_problem
from sentinel.types import Candidate, Rejection, Task, canonical_json

REJECTION_REASONS: tuple[str, ...] = (
    "not_a_candidate",
    "unknown_family",
    "schema",
    "unsolvable",
    "answer_mismatch",
    "unverifiable",
    "bad_prefix",
    "duplicate",
    "unparseable",
    # the difficulty probe (`probe_tasks`):
    "probe_budget",
    "too_easy",
    "too_hard",
    # recorded by `generators.run` for a generator as a whole:
    "generator_error",
    "generator_timeout",
)
DETAIL_CHARS = 500


def spec_text(spec: Any) -> str:
    """Canonical JSON of `spec`; a JSON string of its repr when it is not JSON-serialisable."""
    try:
        return canonical_json(spec)
    except (TypeError, ValueError):
        return json.dumps(repr(spec)[:DETAIL_CHARS])


def describe(exc: BaseException) -> str:
    """`Type: message`, short enough to store."""
    return f"{type(exc).__name__}: {exc}"[:DETAIL_CHARS]


def _unencodable(value: Any, where: str, depth: int = 0) -> str | None:
    """The first place in `value` (a spec, a text field) holding text that cannot be stored
    (not encodable as UTF-8: a lone surrogate), as `where` plus its path; None when all of it
    can."""
    if depth > 64:
        return None  # deeper nesting is the family's schema check's business
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"{where}: text that cannot be encoded as UTF-8 ({exc.reason} at {exc.start})"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            key_text = key if isinstance(key, str) else repr(key)
            if (found := _unencodable(key, f"{where} key", depth + 1)) is not None:
                return found
            if (found := _unencodable(item, f"{where}.{_storable(key_text)}", depth + 1)):
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if (found := _unencodable(item, f"{where}[{i}]", depth + 1)) is not None:
                return found
    return None


def _storable(text: str) -> str:
    """`text` with what UTF-8 cannot hold written as `\\udXXX` escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _storable_value(value: Any, depth: int = 0) -> Any:
    """`value` with every str (keys too) made `_storable`, for the rejection's JSON spec column
    (JSON's `\\ud800` escape of a lone surrogate is refused by the store's JSON type)."""
    if isinstance(value, str):
        return _storable(value)
    if depth > 64:
        return repr(value)
    if isinstance(value, dict):
        return {_storable_value(k, depth + 1): _storable_value(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable_value(v, depth + 1) for v in value]
    return value


def _text_problem(candidate: Candidate) -> str | None:
    """Text of a well-typed candidate that could not be stored (checked before anything is)."""
    fields = {"family": candidate.family, "spec": candidate.spec, "answer": candidate.answer,
              "parent_task_id": candidate.parent_task_id, "failure_ids": candidate.failure_ids,
              "prefix": candidate.prefix, "hint": getattr(candidate, "hint", "")}
    for name, value in fields.items():
        if (found := _unencodable(value, name)) is not None:
            return found
    return None


def _field_problem(candidate: Candidate) -> str | None:
    if not isinstance(candidate.family, str):
        return f"family must be a str, got {type(candidate.family).__name__}"
    if not (candidate.answer is None or isinstance(candidate.answer, str)):
        return f"answer must be a str or None, got {type(candidate.answer).__name__}"
    if not (candidate.parent_task_id is None or isinstance(candidate.parent_task_id, str)):
        kind = type(candidate.parent_task_id).__name__
        return f"parent_task_id must be a str or None, got {kind}"
    if not isinstance(candidate.failure_ids, list) or not all(
        isinstance(f, str) for f in candidate.failure_ids
    ):
        return "failure_ids must be a list of str"
    if not isinstance(candidate.prefix, list) or not all(
        isinstance(t, str) for t in candidate.prefix
    ):
        return "prefix must be a list of str (assistant turn texts)"
    if not isinstance(getattr(candidate, "hint", ""), str):
        return "hint must be a str (the revealed start of the next turn)"
    return None


def _build(
    candidate: Any, generator: str, families: dict[str, TaskFamily], round: int,
    replay: Replay | None,
) -> Task | Rejection:
    """Checks 1-7 for one candidate: the task, or why not."""

    def reject(reason: str, detail: str) -> Rejection:
        is_candidate = isinstance(candidate, Candidate)
        # Every text of the rejection is made storable: it may quote what could not be stored.
        return Rejection(
            round=round,
            generator=generator,
            family=_storable(candidate.family)
            if is_candidate and isinstance(candidate.family, str) else "",
            spec=spec_text(_storable_value(candidate.spec if is_candidate else candidate)),
            reason=reason,
            detail=_storable(detail[:DETAIL_CHARS]),
            parent_task_id=(
                _storable(candidate.parent_task_id)
                if is_candidate and isinstance(candidate.parent_task_id, str)
                else None
            ),
        )

    if isinstance(candidate, Unparseable):
        return Rejection(
            round=round,
            generator=generator,
            family="",
            spec=json.dumps(str(candidate.text)[:DETAIL_CHARS]),
            reason="unparseable",
            detail=_storable(str(candidate.error)[:DETAIL_CHARS]),
            parent_task_id=(
                _storable(candidate.parent_task_id)
                if isinstance(candidate.parent_task_id, str) else None
            ),
        )
    if not isinstance(candidate, Candidate):
        return reject("not_a_candidate", f"got {type(candidate).__name__}, not a Candidate")
    if (problem := _field_problem(candidate)) is not None:
        return reject("not_a_candidate", problem)
    if (problem := _text_problem(candidate)) is not None:
        return reject("schema", problem)
    family = families.get(candidate.family)
    if family is None:
        known = ", ".join(sorted(families))
        return reject("unknown_family", f"unknown family {candidate.family!r}; known: {known}")
    try:
        spec = family.validate_spec(candidate.spec)
    except SpecError as exc:
        return reject("schema", str(exc))
    except Exception as exc:  # recorded; see the module docstring
        return reject("schema", describe(exc))
    try:
        task = family.make_task(
            spec,
            origin="generated",
            created_round=round,
            parent_task_id=candidate.parent_task_id,
            failure_ids=candidate.failure_ids,
            generator=generator,
        )
    except Exception as exc:  # SpecError or a tool's error alike: unsolvable
        return reject("unsolvable", describe(exc))
    try:
        if candidate.answer is not None and not family.verify(task, candidate.answer):
            return reject(
                "answer_mismatch",
                f"claimed {candidate.answer!r}, the tools give {task.answer!r}",
            )
        if not family.verify(task, task.answer):
            return reject("unverifiable", f"the verifier refuses its own answer {task.answer!r}")
    except Exception as exc:  # recorded; see the module docstring
        return reject("unverifiable", f"verify raised {describe(exc)}")
    hint = getattr(candidate, "hint", "")
    if not candidate.prefix and not hint:
        return task
    task = dataclasses.replace(task, prefix=list(candidate.prefix), hint=hint, task_id="")
    shown = f" (prefix of {len(task.prefix)} turns: {canonical_json(task.prefix)}" + (
        f", hint {hint!r})" if hint else ")")
    if replay is None:
        return reject("bad_prefix", "no environment to replay the prefix in" + shown)
    try:
        problem = prefix_problem(family, task, replay.chat, replay.parser, replay.env)
    except Exception as exc:  # recorded; see the module docstring
        problem = f"replaying the prefix raised {describe(exc)}"
    if problem is not None:
        return reject("bad_prefix", problem + shown)
    return task


def validate_candidates(
    candidates: Iterable[Any],
    *,
    generator: str,
    families: dict[str, TaskFamily],
    known_task_ids: Callable[[Iterable[str]], set[str]],
    round: int,
    replay: Replay | None = None,
) -> tuple[list[Task], list[Rejection]]:
    """Run the pipeline on `candidates` (see the module docstring).

    `known_task_ids(ids)` returns the subset of `ids` already stored; it is called once, with the
    ids of the candidates that passed every other check. `replay` (the rollouts' chat format,
    parser and env config) checks candidates with a prefix. Returns (accepted tasks,
    rejections), each in candidate order.
    """
    built = [_build(c, generator, families, round, replay) for c in candidates]
    known = known_task_ids([b.task_id for b in built if isinstance(b, Task)])
    tasks: list[Task] = []
    rejections: list[Rejection] = []
    seen: set[str] = set()
    for item in built:
        if isinstance(item, Rejection):
            rejections.append(item)
        elif item.task_id in known or item.task_id in seen:
            where = "already in the store" if item.task_id in known else "earlier in this batch"
            rejections.append(
                Rejection(
                    round=round,
                    generator=generator,
                    family=item.family,
                    spec=canonical_json(item.spec),
                    reason="duplicate",
                    detail=f"task {item.task_id} is {where}",
                    parent_task_id=item.parent_task_id,
                )
            )
        else:
            seen.add(item.task_id)
            tasks.append(item)
    return tasks, rejections


def probe_tasks(
    batches: list[list[Task]],
    probe: Callable[[list[Task]], dict[str, float]],
    *,
    band: tuple[float, float],
    budget: int,
    round: int,
) -> tuple[list[list[Task]], list[Rejection]]:
    """The difficulty probe (step 9 of the module docstring) over one round's accepted tasks.

    `batches` holds each generator's accepted tasks (its name is `task.generator`); returns the
    kept tasks per batch, in order, with `probe_pass_rate` set, and the rejections. `probe` is
    called once, with the tasks within the budget; it must return a pass rate in [0, 1] for every
    one of them (a probe that does not is a bug in the caller: `ValueError`).
    """
    lo, hi = band
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"probe band must satisfy 0 <= lo <= hi <= 1, got {band}")
    probed = list(round_robin(batches, max(0, budget)))
    chosen = {t.task_id for t in probed}
    rates = probe(probed) if probed else {}
    bad = [t.task_id for t in probed if not _is_rate(rates.get(t.task_id))]
    if bad:
        raise ValueError(f"the probe returned no pass rate in [0, 1] for tasks {bad[:5]}")
    kept: list[list[Task]] = []
    rejections: list[Rejection] = []
    for batch in batches:
        keep = []
        for task in batch:
            reason, detail = None, ""
            if task.task_id not in chosen:
                reason = "probe_budget"
                detail = f"the probe budget of {budget} tasks this round was used up"
            else:
                rate = float(rates[task.task_id])
                task.probe_pass_rate = rate
                if rate > hi:
                    reason, detail = "too_easy", f"pass rate {rate:.3f} > {hi}"
                elif rate < lo:
                    reason, detail = "too_hard", f"pass rate {rate:.3f} < {lo}"
            if reason is None:
                keep.append(task)
            else:
                rejections.append(
                    Rejection(
                        round=round,
                        generator=task.generator or "",
                        family=task.family,
                        spec=canonical_json(task.spec),
                        reason=reason,
                        detail=detail,
                        parent_task_id=task.parent_task_id,
                    )
                )
        kept.append(keep)
    return kept, rejections


def _is_rate(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0


