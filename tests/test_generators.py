"""Tests of the generators package: `mutate`, the validation pipeline, the registry (built-ins,
`module:Class`, entry points) and fault isolation in `run_generators`. Real arith tasks, no mocks;
the faulty families and generators are small real classes defined here."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from pydantic import Field

from generators import (
    REJECTION_REASONS,
    BaseGenerator,
    DecomposeGenerator,
    EscalateConfig,
    EscalateGenerator,
    GenerationContext,
    GeneratorConfig,
    GeneratorLoadError,
    MutateConfig,
    MutateGenerator,
    Unparseable,
    load_generator,
    run_generators,
    validate_candidates,
)
from sentinel.env.tools import Calculator, Tool, ToolFailure
from sentinel.tasks import load_family
from sentinel.tasks.arith import ArithFamily
from sentinel.types import Candidate, Failure, Task

ARITH = load_family("arith")
FAMILIES = {"arith": ARITH}


def nothing_known(ids: Iterable[str]) -> set[str]:
    return set()


def failure(task: Task, mode: str = "wrong_answer", round: int = 3) -> Failure:
    return Failure(
        traj_id="traj-x",
        task_id=task.task_id,
        round=round,
        mode=mode,
        first_error_step=1,
        evidence="",
        skills=list(task.skills),
        family=task.family,
    )


def context(failures: list[Failure], tasks: list[Task], budget: int = 32) -> GenerationContext:
    return GenerationContext(
        round=4,
        failures=failures,
        tasks={t.task_id: t for t in tasks},
        families=FAMILIES,
        rng=random.Random(0),
        budget=budget,
    )


def validate(candidates: list[Any], known: Iterable[str] = ()):
    known = set(known)
    return validate_candidates(
        candidates,
        generator="test",
        families=FAMILIES,
        known_task_ids=lambda ids: known & set(ids),
        round=4,
    )


# -- mutate ---------------------------------------------------------------------------------------
def test_mutate_keeps_skills_and_lineage():
    parent = ARITH.make_task({"expr": "(3+4)*5"})
    failures = [failure(parent), failure(parent, "premature_answer")]
    gen = MutateGenerator(MutateConfig(per_failure=2))
    candidates = list(gen.generate(context(failures, [parent])))
    assert len(candidates) == 2
    for c in candidates:
        assert c.parent_task_id == parent.task_id
        assert c.failure_ids == [f.failure_id for f in failures]
        assert c.answer is None and c.spec != parent.spec
    tasks, rejections = validate(candidates)
    assert rejections == []
    for task in tasks:
        assert task.skills == parent.skills
        assert (task.origin, task.created_round, task.parent_task_id) == (
            "generated",
            4,
            parent.task_id,
        )
        assert task.failure_ids == [f.failure_id for f in failures]


def test_mutate_prefers_distinct_tasks_and_the_biggest_cluster():
    common = [ARITH.make_task({"expr": e}) for e in ("2+3", "4+9")]  # same skills, same mode
    rare = ARITH.make_task({"expr": "(6-2)*5"})
    failures = [failure(common[0]), failure(common[1]), failure(rare, "loop")]
    candidates = list(MutateGenerator().generate(context(failures, [*common, rare], budget=3)))
    parents = [c.parent_task_id for c in candidates]
    assert len(parents) == 3 and set(parents) == {t.task_id for t in [*common, rare]}
    assert parents[-1] == rare.task_id  # the bigger cluster comes first
    # Tasks missing from ctx.tasks are skipped, not guessed.
    orphan = failure(rare)
    orphan.task_id = "arith-unknown"
    assert list(MutateGenerator().generate(context([orphan], [rare]))) == []


# -- validation -----------------------------------------------------------------------------------
class BrokenCalculator(Calculator):
    def __call__(self, **arguments: Any) -> str:
        raise ToolFailure("calculator is down")


class DownArith(ArithFamily):
    """Arith whose calculator always fails: no task can be solved."""

    def tools(self) -> list[Tool]:
        return [BrokenCalculator()]


class PickyArith(ArithFamily):
    """Arith whose verifier refuses everything, its own answers included."""

    def verify(self, task: Task, answer: str | None) -> bool:
        return False


def test_validation_accepts_and_rejects_with_reasons():
    known = ARITH.make_task({"expr": "9*9"}).task_id
    candidates = [
        Candidate(
            "arith", {"expr": "2 + 3*4"}, answer="14", parent_task_id="p1", failure_ids=["f1"]
        ),
        Candidate("arith", {"expr": "2+3"}, answer="6"),
        Candidate("arith", {"expression": "2+3"}),
        Candidate("arith", {"expr": "7/2"}),
        Candidate("nope", {"expr": "2+3"}),
        "not a candidate",
        Candidate("arith", {"expr": "2+3*4"}),  # same canonical spec as the first
        Candidate("arith", {"expr": "9*9"}),
        Candidate("arith", {"expr": "1+1"}, failure_ids="f1"),  # type: ignore[arg-type]
    ]
    tasks, rejections = validate(candidates, known=[known])
    assert [t.spec for t in tasks] == [{"expr": "2+3*4"}]
    assert tasks[0].answer == "14" and tasks[0].generator == "test"
    assert (tasks[0].parent_task_id, tasks[0].failure_ids) == ("p1", ["f1"])
    reasons = [r.reason for r in rejections]
    assert reasons == [
        "answer_mismatch",
        "schema",
        "schema",
        "unknown_family",
        "not_a_candidate",
        "duplicate",
        "duplicate",
        "not_a_candidate",
    ]
    assert "earlier in this batch" in rejections[5].detail
    assert "already in the store" in rejections[6].detail
    assert "failure_ids" in rejections[7].detail
    assert "'6'" in rejections[0].detail and "'5'" in rejections[0].detail
    for r in rejections:
        assert r.round == 4 and r.generator == "test" and r.detail
        json.loads(r.spec)  # always JSON text: the store's column is JSON
    assert rejections[1].spec == '{"expression":"2+3"}'


def test_unsolvable_and_unverifiable():
    candidate = Candidate("arith", {"expr": "2+3"})
    _, rejections = validate_candidates(
        [candidate],
        generator="g",
        families={"arith": DownArith()},
        known_task_ids=nothing_known,
        round=1,
    )
    assert [r.reason for r in rejections] == ["unsolvable"]
    assert "ToolFailure" in rejections[0].detail
    _, rejections = validate_candidates(
        [candidate],
        generator="g",
        families={"arith": PickyArith()},
        known_task_ids=nothing_known,
        round=1,
    )
    assert [r.reason for r in rejections] == ["unverifiable"]


def test_known_task_ids_is_asked_once_with_the_surviving_ids():
    asked: list[list[str]] = []

    def known(ids: Iterable[str]) -> set[str]:
        asked.append(list(ids))
        return set()

    validate_candidates(
        [Candidate("arith", {"expr": "2+3"}), Candidate("arith", {"expr": "2+"})],
        generator="g",
        families=FAMILIES,
        known_task_ids=known,
        round=0,
    )
    assert asked == [[ARITH.make_task({"expr": "2+3"}).task_id]]


# -- plugins --------------------------------------------------------------------------------------
class MyGenConfig(GeneratorConfig):
    exprs: list[str] = Field(default_factory=lambda: ["2+3", "4*5"])


class MyGen:
    """A plugin generator, loaded as `tests.test_generators:MyGen`."""

    name = "mine"
    config_model = MyGenConfig

    def __init__(self, config: MyGenConfig) -> None:
        self.config = config

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        for expr in self.config.exprs:
            yield Candidate("arith", {"expr": expr})


class Bare:
    """A plugin without config model or constructor argument."""

    name = "bare"

    def generate(self, ctx: GenerationContext) -> list[Candidate]:
        return [Candidate("arith", {"expr": "8-3"})]


class NoGenerate:
    name = "nogen"


NOT_A_CLASS = 42


def test_load_builtin_and_module_class():
    gen = load_generator({"type": "mutate", "per_failure": 3})
    assert isinstance(gen, MutateGenerator) and gen.config.per_failure == 3
    mine = load_generator({"type": "tests.test_generators:MyGen", "exprs": ["1+2"]})
    assert isinstance(mine, MyGen) and mine.config.exprs == ["1+2"]
    assert load_generator({"type": "tests.test_generators:Bare"}).name == "bare"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "mutate", "per_failur": 3}, "'mutate'.*per_failur"),
        ({"type": "mutate", "per_failure": 0}, "per_failure"),
        ({"type": "tests.test_generators:MyGen", "exprs": "2+3"}, "MyGen.*exprs"),
        ({"type": "tests.test_generators:Bare", "extra": 1}, "Bare.*extra"),
        ({"type": "no_such_generator"}, "unknown generator 'no_such_generator'"),
        ({"type": "tests.no_such_module:Gen"}, "importing 'tests.no_such_module' failed"),
        ({"type": "tests.test_generators:Missing"}, "has no 'Missing'"),
        ({"type": "tests.test_generators:NOT_A_CLASS"}, "is a int, not a class"),
        ({"type": "tests.test_generators:NoGenerate"}, "has no generate"),
        ({"per_failure": 2}, "needs a string 'type'"),
    ],
)
def test_load_errors_name_the_generator_and_key(spec, message):
    with pytest.raises(GeneratorLoadError, match=message):
        load_generator(spec)


def test_entry_point_plugin(tmp_path, monkeypatch):
    dist = tmp_path / "my_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[sentinel.generators]\n"
        "mine = tests.test_generators:MyGen\n"
        "broken = tests.no_such_module:Gen\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert isinstance(load_generator({"type": "mine"}), MyGen)
    with pytest.raises(GeneratorLoadError, match=r"'broken'.*failed to load"):
        load_generator({"type": "broken"})


# -- fault isolation ------------------------------------------------------------------------------
class Raising:
    name = "raising"

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        yield Candidate("arith", {"expr": "6+6"})
        raise RuntimeError("plugin bug")


class Garbage:
    name = "garbage"

    def generate(self, ctx: GenerationContext) -> int:
        return 42


class Junk:
    name = "junk"

    def generate(self, ctx: GenerationContext) -> list[Any]:
        return ["junk", None]


class Slow:
    name = "slow"

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        for i in range(2, 100):
            time.sleep(0.05)
            yield Candidate("arith", {"expr": f"{i}+1"})


class Endless:
    name = "endless"

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
        i = 1
        while True:
            i += 1
            yield Candidate("arith", {"expr": f"{i}*2"})


def test_faulty_generators_are_isolated():
    generators = [Raising(), Garbage(), Junk(), MyGen(MyGenConfig(type="mine"))]
    tasks, rejections, stats = run_generators(
        generators, context([], []), known_task_ids=nothing_known
    )
    assert sorted(t.spec["expr"] for t in tasks) == ["2+3", "4*5", "6+6"]
    by_reason = {(r.generator, r.reason): r for r in rejections}
    assert "RuntimeError: plugin bug" in by_reason["raising", "generator_error"].detail
    assert "test_generators.py" in by_reason["raising", "generator_error"].detail
    assert "int" in by_reason["garbage", "generator_error"].detail
    assert [r.reason for r in rejections if r.generator == "junk"] == ["not_a_candidate"] * 2
    assert stats["raising"] == {"proposed": 1, "accepted": 1, "rejected": 0, "errors": 1}
    assert stats["garbage"] == {"proposed": 0, "accepted": 0, "rejected": 0, "errors": 1}
    assert stats["junk"] == {"proposed": 2, "accepted": 0, "rejected": 2, "errors": 0}
    assert stats["mine"] == {"proposed": 2, "accepted": 2, "rejected": 0, "errors": 0}


def test_slow_generator_is_cut_by_the_time_limit():
    generators = [Slow(), MyGen(MyGenConfig(type="mine"))]
    start = time.monotonic()
    tasks, rejections, stats = run_generators(
        generators, context([], []), known_task_ids=nothing_known, time_limit_s=0.2
    )
    assert time.monotonic() - start < 2.0
    assert [r.reason for r in rejections] == ["generator_timeout"]
    assert 1 <= stats["slow"]["proposed"] <= 4 and stats["slow"]["errors"] == 1
    assert stats["mine"]["accepted"] == 2
    assert {"2+3", "4*5"} <= {t.spec["expr"] for t in tasks}


def test_budget_cuts_and_cross_generator_duplicates():
    ctx = context([], [], budget=3)
    tasks, rejections, stats = run_generators(
        [
            Endless(),
            MyGen(MyGenConfig(type="mine", max_candidates=1)),
            MyGen(MyGenConfig(type="mine", exprs=["2*2"])),
        ],
        ctx,
        known_task_ids=nothing_known,
    )
    assert stats["endless"]["proposed"] == 3
    # The second `mine` re-proposes 2*2, which `endless` already had accepted.
    assert stats["mine"] == {"proposed": 2, "accepted": 1, "rejected": 1, "errors": 0}
    assert [r.reason for r in rejections] == ["duplicate"]
    assert len(tasks) == 4


# -- decompose ------------------------------------------------------------------------------------
def test_decompose_gives_the_failing_step_then_the_steps_before_it():
    parent = ARITH.make_task({"expr": "(2+3)*(4+1)-6"})  # ops: 2+3, 4+1, 5*5, 25-6
    fail = failure(parent)
    fail.first_error_step = 2
    candidates = list(DecomposeGenerator().generate(context([fail], [parent])))
    assert [c.spec["expr"] for c in candidates] == ["(2+3)*(4+1)", "4+1", "2+3"]
    for c in candidates:
        assert (c.parent_task_id, c.failure_ids) == (parent.task_id, [fail.failure_id])
    # A first error beyond the reference maps to its last step, whose sub-problem for arith is
    # the whole task (skipped): only the stepping stones before it remain.
    fail.first_error_step = 9
    gen = load_generator({"type": "decompose", "lead_up": False})
    assert list(gen.generate(context([fail], [parent]))) == []
    gen = load_generator({"type": "decompose", "per_failure": 1})
    assert [c.spec["expr"] for c in gen.generate(context([fail], [parent]))] == ["(2+3)*(4+1)"]
    tasks, rejections = validate(candidates)
    assert not rejections and {t.parent_task_id for t in tasks} == {parent.task_id}


def test_decompose_filters_modes_and_skips_unknown_steps():
    parent = ARITH.make_task({"expr": "(3+4)*5"})
    loop, no_step = failure(parent, "loop"), failure(parent, "no_answer")
    no_step.first_error_step = None
    gen = load_generator({"type": "decompose", "modes": ["wrong_answer"]})
    assert list(gen.generate(context([loop, no_step], [parent]))) == []
    assert [c.spec for c in DecomposeGenerator().generate(context([loop], [parent]))] == [
        {"expr": "3+4"}]
    with pytest.raises(GeneratorLoadError, match="unknown failure modes"):
        load_generator({"type": "decompose", "modes": ["wrong"]})


# -- escalate -------------------------------------------------------------------------------------
def test_escalate_makes_harder_variants_of_mastered_tasks():
    mastered = [ARITH.make_task({"expr": e}) for e in ("2+3", "4*5")]
    ctx = context([], [])
    ctx.mastered = mastered
    candidates = list(EscalateGenerator(EscalateConfig(per_task=2)).generate(ctx))
    assert [c.parent_task_id for c in candidates[:2]] == [t.task_id for t in mastered]
    assert 3 <= len(candidates) <= 4
    tasks, rejections = validate(candidates)
    assert not rejections
    for task in tasks:
        parent = next(t for t in mastered if t.task_id == task.parent_task_id)
        assert task.difficulty > parent.difficulty and task.failure_ids == []
    assert list(EscalateGenerator().generate(context([], []))) == []  # nothing mastered


# -- probe, unparseable output, target clusters ---------------------------------------------------
class Fixed:
    """Proposes fixed expressions, with the lineage of the first failure in the context."""

    def __init__(self, name: str, exprs: list[str]) -> None:
        self.name, self.exprs = name, exprs

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate | Unparseable]:
        ids = [f.failure_id for f in ctx.failures[:1]]
        for expr in self.exprs:
            if expr == "garbage":
                yield Unparseable("{not json", "no JSON task spec")
            else:
                yield Candidate("arith", {"expr": expr}, failure_ids=ids)


def rate_by_first_operand(tasks: list[Task]) -> dict[str, float]:
    """A deterministic stand-in for the policy: pass rate = first operand / 10."""
    return {t.task_id: int(t.spec["expr"].split("+")[0]) / 10 for t in tasks}


def test_probe_band_budget_and_reasons():
    calls: list[list[str]] = []

    def probe(tasks: list[Task]) -> dict[str, float]:
        calls.append([t.spec["expr"] for t in tasks])
        return rate_by_first_operand(tasks)

    parent = ARITH.make_task({"expr": "(3+4)*5"})
    ctx = context([failure(parent)], [parent])
    a = Fixed("a", ["9+1", "5+1", "0+1", "7+1", "3+1"])  # rates .9 .5 0 .7 .3
    b = Fixed("b", ["1+2", "garbage", "8+1"])  # rates .1, -, .8
    tasks, rejections, stats = run_generators(
        [a, b], ctx, known_task_ids=nothing_known, probe=probe, probe_band=(0.1, 0.7),
        probe_budget=6)
    # round-robin: a0 b0 a1 b1 a2 a3 are probed; a4 is over the budget
    assert calls == [["9+1", "1+2", "5+1", "8+1", "0+1", "7+1"]]
    assert sorted((t.spec["expr"], t.probe_pass_rate) for t in tasks) == [
        ("1+2", 0.1), ("5+1", 0.5), ("7+1", 0.7)]  # both bounds are inside
    reasons = sorted((r.generator, r.reason, json.loads(r.spec).get("expr", "")) for r in rejections
                     if r.reason != "unparseable")
    assert reasons == [("a", "probe_budget", "3+1"), ("a", "too_easy", "9+1"),
                       ("a", "too_hard", "0+1"), ("b", "too_easy", "8+1")]
    assert "0.900 > 0.7" in next(r.detail for r in rejections if r.reason == "too_easy")
    garbage = next(r for r in rejections if r.reason == "unparseable")
    assert (garbage.generator, json.loads(garbage.spec), garbage.detail) == (
        "b", "{not json", "no JSON task spec")
    assert stats["a"] == {"proposed": 5, "accepted": 2, "rejected": 3, "errors": 0}
    assert stats["b"] == {"proposed": 3, "accepted": 1, "rejected": 2, "errors": 0}
    assert {t.target_cluster_id for t in tasks} == {ctx.failures[0].cluster_id}
    assert {"unparseable", "probe_budget", "too_easy", "too_hard"} <= set(REJECTION_REASONS)


def test_probe_must_answer_for_every_task_and_band_is_checked():
    ctx = context([], [])
    with pytest.raises(ValueError, match="no pass rate"):
        run_generators([Fixed("a", ["2+1"])], ctx, known_task_ids=nothing_known,
                       probe=lambda tasks: {})
    with pytest.raises(ValueError, match="band"):
        run_generators([Fixed("a", ["2+1"])], ctx, known_task_ids=nothing_known,
                       probe=rate_by_first_operand, probe_band=(0.8, 0.2))
    # Without lineage there is no target cluster; without a probe nothing is probed.
    tasks, _, _ = run_generators([Fixed("a", ["2+1"])], ctx, known_task_ids=nothing_known)
    assert tasks[0].target_cluster_id is None and tasks[0].probe_pass_rate is None


def test_the_generator_sees_its_clamped_budget_as_ctx_budget() -> None:
    """One clamp, in the runner: a generator's `max_candidates` below the round's budget is the
    `ctx.budget` it is handed, and no more candidates than that are taken from it."""
    seen: list[int] = []

    class Endless(BaseGenerator):
        name = "endless"

        def generate(self, ctx: GenerationContext) -> Iterator[Candidate]:
            seen.append(ctx.budget)
            i = 0
            while True:
                i += 1
                yield Candidate(family="arith", spec={"expr": f"{i}+{i}"})

    capped = Endless(GeneratorConfig(type="endless", max_candidates=3))
    _, _, stats = run_generators([capped], context([], [], budget=10),
                                 known_task_ids=nothing_known)
    assert seen == [3] and stats["endless"]["proposed"] == 3
    _, _, stats = run_generators([Endless()], context([], [], budget=5),
                                 known_task_ids=nothing_known)
    assert seen == [3, 5] and stats["endless"]["proposed"] == 5


LONE = "\ud800"  # a lone surrogate: a Python str, but no UTF-8 text


@pytest.mark.parametrize("candidate, field", [
    (Candidate("arith", {"expr": "2+3", "note": f"x{LONE}"}), "spec.note"),
    (Candidate("arith", {f"k{LONE}": 1, "expr": "2+3"}), "spec key"),
    (Candidate("arith", {"expr": "2+3"}, parent_task_id=f"t{LONE}"), "parent_task_id"),
    (Candidate(f"arith{LONE}", {"expr": "2+3"}), "family"),
    (Candidate("arith", {"expr": "2+3"}, failure_ids=["f", LONE]), "failure_ids[1]"),
    (Candidate("arith", {"expr": "2+3"}, prefix=[LONE]), "prefix[0]"),
])
def test_text_that_cannot_be_stored_is_a_schema_rejection_that_commits(
        candidate, field, tmp_path):
    """A plugin's lone surrogate is a `schema` rejection naming the field, and the round with
    that rejection (and a good task beside it) commits to a real store."""
    from task_store import Store

    tasks, rejections = validate([candidate, Candidate("arith", {"expr": "4+4"})])
    assert [t.spec["expr"] for t in tasks] == ["4+4"]
    (rejection,) = rejections
    assert rejection.reason == "schema" and rejection.detail.startswith(field), rejection
    assert "UTF-8" in rejection.detail
    store = Store.create(tmp_path / "s.duckdb", "run", {})
    store.record_round(1, {"started_at": 0.0, "finished_at": 1.0},
                       tasks=[t.to_row() for t in tasks],
                       rejections=[r.to_row() for r in rejections])
    _, rows = store.query("SELECT reason, spec FROM rejections")
    assert rows[0][0] == "schema" and "2+3" in rows[0][1]


def test_the_removed_generator_keyword_still_works_with_a_warning():
    """A generator written from an earlier docs/generators.md passes `generator=`: it warns,
    is ignored (the runner names the generator) and the candidate validates."""
    with pytest.warns(DeprecationWarning, match="generator"):
        old = Candidate("arith", {"expr": "2+3"}, generator="mine")
    tasks, rejections = validate([old])
    assert rejections == [] and tasks[0].generator == "test"
    assert not hasattr(old, "generator") or old.generator is None
