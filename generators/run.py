"""Running a round's generators with fault isolation.

Each generator is called in turn, and its candidates are consumed lazily, up to its budget
(`ctx.budget`, and its config's `max_candidates` when it has one): a generator that yields forever
is simply cut. A generator that raises, returns something that is not iterable, or runs past
`time_limit_s` is recorded as a `Rejection` (`generator_error` / `generator_timeout`, the detail
says what happened) and the others go on; the candidates it yielded before that are kept and
validated like any others.

The time limit is checked each time a candidate arrives (and when `generate` returns), in this
process: a generator stuck inside one step is not interrupted, only stopped at its next yield.
Running plugins in a subprocess would close that gap, at the price of pickling contexts; not done.

Validation happens after a generator is done (its time does not count against it). Tasks accepted
from one generator count as known to the next, so two generators proposing the same task do not
store it twice. When a `probe` is given, the tasks every generator had accepted then pass the
round's difficulty probe together (`generators.validate.probe_tasks`: a shared `probe_budget`,
taken round-robin across generators, and the pass-rate band), which does not count against any
generator's time either.

Every accepted task gets its `target_cluster_id`: the cluster (`Failure.cluster_id`) most of its
`failure_ids` belong to among `ctx.failures` (first seen wins a tie), None when it names none (an
`escalate` task, or a plugin that sets no lineage).
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable

from generators.base import GenerationContext, TaskGenerator
from generators.validate import describe, probe_tasks, validate_candidates
from sentinel.types import Rejection, Task


def _where(exc: BaseException) -> str:
    """`file:line in function` of the innermost frame, to find a plugin's bug quickly."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {last.filename}:{last.lineno} in {last.name})"


def _budget(generator: TaskGenerator, ctx: GenerationContext) -> int:
    """The one budget clamp: the round's per-generator budget, and the generator's own
    `max_candidates` when its config has one. The generator sees it as `ctx.budget`."""
    configured = getattr(getattr(generator, "config", None), "max_candidates", None)
    return min(ctx.budget, configured) if isinstance(configured, int) else ctx.budget


def _collect(
    generator: TaskGenerator, ctx: GenerationContext, time_limit_s: float
) -> tuple[list[object], tuple[str, str] | None]:
    """Consume `generator` within its budget and time; returns (candidates, (reason, detail) of
    the fault that stopped it, if one did)."""
    limit = _budget(generator, ctx)
    candidates: list[object] = []
    if limit <= 0:
        return candidates, None
    ctx = dataclasses.replace(ctx, budget=limit)
    start = time.monotonic()

    def late() -> tuple[str, str]:
        elapsed = time.monotonic() - start
        return "generator_timeout", (
            f"stopped after {elapsed:.2f}s (limit {time_limit_s}s) with {len(candidates)} "
            "candidates"
        )

    try:
        produced = generator.generate(ctx)
        try:
            iterator = iter(produced)
        except TypeError:
            return candidates, (
                "generator_error",
                f"generate() returned {type(produced).__name__}, not an iterable of Candidates",
            )
        if time.monotonic() - start > time_limit_s:
            return candidates, late()
        for candidate in iterator:
            if time.monotonic() - start > time_limit_s:
                return candidates, late()
            candidates.append(candidate)
            if len(candidates) >= limit:
                break
    except Exception as exc:  # isolation is the point; recorded with its cause
        return candidates, ("generator_error", describe(exc) + _where(exc))
    return candidates, None


def _target_clusters(tasks: list[Task], ctx: GenerationContext) -> None:
    cluster_of = {f.failure_id: f.cluster_id for f in ctx.failures}
    for task in tasks:
        clusters = Counter(cluster_of[f] for f in task.failure_ids if f in cluster_of)
        task.target_cluster_id = clusters.most_common(1)[0][0] if clusters else None


def run_generators(
    generators: list[TaskGenerator],
    ctx: GenerationContext,
    *,
    known_task_ids: Callable[[Iterable[str]], set[str]],
    time_limit_s: float = 30.0,
    probe: Callable[[list[Task]], dict[str, float]] | None = None,
    probe_band: tuple[float, float] = (0.05, 0.75),
    probe_budget: int = 64,
) -> tuple[list[Task], list[Rejection], dict[str, dict[str, int]]]:
    """Run `generators` on `ctx`, validate what they propose, and isolate their faults.

    `probe(tasks) -> {task_id: pass rate}`, when given, is the difficulty probe: it is called
    once, with at most `probe_budget` of the tasks that passed validation, and tasks whose rate is
    outside `probe_band` (bounds included) are rejected (see `generators.validate`).

    Returns (accepted tasks, rejections, stats), where stats maps each generator's name to
    `proposed` (candidates taken), `accepted`, `rejected` (candidates refused by validation or
    the probe) and `errors` (1 if the generator failed or timed out; its `Rejection` is in the
    list).
    """
    batches: list[list[Task]] = []
    rejections: list[Rejection] = []
    stats: dict[str, dict[str, int]] = {}
    names: list[str] = []
    accepted_ids: set[str] = set()

    def known(ids: Iterable[str]) -> set[str]:
        ids = list(ids)
        return set(known_task_ids(ids)) | (set(ids) & accepted_ids)

    for generator in generators:
        name = str(getattr(generator, "name", type(generator).__name__))
        candidates, fault = _collect(generator, ctx, time_limit_s)
        accepted, refused = validate_candidates(
            candidates,
            generator=name,
            families=ctx.families,
            known_task_ids=known,
            round=ctx.round,
            replay=ctx.replay,
        )
        if fault is not None:
            reason, detail = fault
            refused.append(
                Rejection(
                    round=ctx.round,
                    generator=name,
                    family="",
                    spec="null",
                    reason=reason,
                    detail=detail,
                )
            )
        accepted_ids.update(t.task_id for t in accepted)
        batches.append(accepted)
        names.append(name)
        rejections += refused
        counts = stats.setdefault(name, {"proposed": 0, "accepted": 0, "rejected": 0, "errors": 0})
        counts["proposed"] += len(candidates)
        counts["rejected"] += len(refused) - (fault is not None)
        counts["errors"] += fault is not None
    if probe is not None:
        batches, refused = probe_tasks(
            batches, probe, band=probe_band, budget=probe_budget, round=ctx.round
        )
        rejections += refused
        for rejection in refused:
            stats[rejection.generator]["rejected"] += 1
    tasks: list[Task] = []
    for name, batch in zip(names, batches, strict=True):
        stats[name]["accepted"] += len(batch)
        tasks += batch
    _target_clusters(tasks, ctx)
    return tasks, rejections, stats
