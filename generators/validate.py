"""The validation pipeline every generated candidate passes before it can reach training.

Per candidate, in order (the first failing check is the rejection reason):

1. `not_a_candidate`: not a `Candidate`, or its fields have the wrong types.
2. `unknown_family`: its family is not one of `families`.
3. `schema`: `family.validate_spec` refuses the spec.
4. `unsolvable`: `family.make_task` fails: the reference solver, really calling the tools, cannot
   solve it. The task's answer is whatever the tools produced, never the generator's claim.
5. `answer_mismatch`: the candidate claims an answer and the family's verifier refuses it.
6. `unverifiable`: the verifier refuses the reference answer itself (a family bug or a spec
   the verifier cannot judge); training on it would reward nothing.
7. `duplicate`: the task id (a content hash of family and canonical spec) is already known
   (`known_task_ids`, asked once per batch) or came earlier in this batch.

Accepted tasks carry lineage: `origin="generated"`, `created_round`, `parent_task_id`,
`failure_ids` and `generator` (the name passed here, not whatever the candidate says, so a plugin
cannot pass its tasks off as another generator's). Every rejection keeps the spec as canonical JSON
text (the store's `rejections.spec` is a JSON column), the reason and a detail.

The spec is untrusted input flowing into family and tool code, so steps 3-6 turn *any* exception
into a rejection whose detail names the exception type and message: one bad candidate must not
abort the round, and nothing is dropped without a record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from sentinel.tasks import SpecError, TaskFamily
from sentinel.types import Candidate, Rejection, Task, canonical_json

REJECTION_REASONS: tuple[str, ...] = (
    "not_a_candidate",
    "unknown_family",
    "schema",
    "unsolvable",
    "answer_mismatch",
    "unverifiable",
    "duplicate",
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
    return None


def _build(
    candidate: Any, generator: str, families: dict[str, TaskFamily], round: int
) -> Task | Rejection:
    """Checks 1-6 for one candidate: the task, or why not."""

    def reject(reason: str, detail: str) -> Rejection:
        is_candidate = isinstance(candidate, Candidate)
        return Rejection(
            round=round,
            generator=generator,
            family=candidate.family if is_candidate and isinstance(candidate.family, str) else "",
            spec=spec_text(candidate.spec if is_candidate else candidate),
            reason=reason,
            detail=detail[:DETAIL_CHARS],
            parent_task_id=(
                candidate.parent_task_id
                if is_candidate and isinstance(candidate.parent_task_id, str)
                else None
            ),
        )

    if not isinstance(candidate, Candidate):
        return reject("not_a_candidate", f"got {type(candidate).__name__}, not a Candidate")
    if (problem := _field_problem(candidate)) is not None:
        return reject("not_a_candidate", problem)
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
    return task


def validate_candidates(
    candidates: Iterable[Any],
    *,
    generator: str,
    families: dict[str, TaskFamily],
    known_task_ids: Callable[[Iterable[str]], set[str]],
    round: int,
) -> tuple[list[Task], list[Rejection]]:
    """Run the pipeline on `candidates` (see the module docstring).

    `known_task_ids(ids)` returns the subset of `ids` already stored; it is called once, with the
    ids of the candidates that passed every other check. Returns (accepted tasks, rejections), each
    in candidate order.
    """
    built = [_build(c, generator, families, round) for c in candidates]
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
