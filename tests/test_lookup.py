"""The `lookup` family: reproducible worlds, multi-hop reference solutions, compute questions, the
forced first-call fault, environment fault injection with retries, and failure analysis."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from sentinel.analyzer import FailureAnalyzer
from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig, Episode, FaultConfig
from sentinel.env.parser import HermesParser, format_answer, format_call
from sentinel.env.tools import BadArguments, ToolFailure
from sentinel.policy import build_tokenizer
from sentinel.tasks import SpecError, load_family
from sentinel.tasks.lookup import LookupConfig, LookupFamily
from sentinel.types import Step


@pytest.fixture(scope="module")
def family() -> LookupFamily:
    fam = load_family("lookup", {"style": "terse", "instruction": ""})
    assert isinstance(fam, LookupFamily)
    return fam


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(build_tokenizer())


def _spec(family: LookupFamily, path: list[str], *, seed: int = 3, fault: bool = False,
          start_type: str = "company") -> dict:
    """A spec over world `seed` starting at the first entity of `start_type` in sorted order."""
    from sentinel.tasks.lookup import _type_of

    start = sorted(e for e in family.world(seed) if _type_of(e) == start_type)[0]
    return family.validate_spec({"seed": seed, "chains": [[start, *path]], "op": None,
                                 "fault": fault})


def test_world_is_reproducible_from_the_seed(family: LookupFamily) -> None:
    assert family.world(5) == load_family("lookup").world(5)
    assert family.world(5) != family.world(6)
    world = family.world(5)
    assert len(world) == family.config.people + family.config.companies + family.config.cities


def test_three_hop_reference_walks_the_chain(family: LookupFamily) -> None:
    spec = _spec(family, ["ceo", "city", "pop"])
    world = family.world(3)
    acme = spec["chains"][0][0]
    ceo = world[acme]["ceo"]
    city = world[ceo]["city"]
    solution = family.solve(spec, family.tool_map(spec))
    assert [(c.tool, c.arguments) for c in solution.calls] == [
        ("lookup", {"entity": acme, "attribute": "ceo"}),
        ("lookup", {"entity": ceo, "attribute": "city"}),
        ("lookup", {"entity": city, "attribute": "pop"}),
    ]
    assert solution.answer == world[city]["pop"]
    task = family.make_task(spec)
    assert task.prompt == [{"role": "user", "content": f"pop of city of ceo of {acme}?"}]
    assert task.skills == ["attr:ceo", "attr:city", "attr:pop", "hops:3"]
    natural = load_family("lookup").render(spec)[-1]["content"]
    assert natural == f"What is the population of the city of the CEO of {acme}?"


def test_compute_question_uses_the_calculator(family: LookupFamily) -> None:
    world = family.world(4)
    person = sorted(e for e in world if e in ("Ana", "Ann", "Bo", "Bob", "Cy", "Dee", "Eli",
                                                  "Eve", "Gus", "Ian", "Ivy", "Jo", "Joe"))[0]
    city = world[person]["city"]
    spec = family.validate_spec({"seed": 4, "chains": [[person, "age"], [city, "pop"]],
                                 "op": "-", "fault": False})
    task = family.make_task(spec)
    assert task.answer == str(int(world[person]["age"]) - int(world[city]["pop"]))
    solution = family.solve(spec, family.tool_map(spec))
    assert solution.calls[-1].tool == "calculator"
    assert "compute" in task.skills
    assert family.render(spec)[-1]["content"] == f"age of {person} - pop of {city}?"


def test_lookup_tool_errors_are_the_callers(family: LookupFamily) -> None:
    tool = family.tool_map(_spec(family, ["staff"]))["lookup"]
    with pytest.raises(BadArguments, match="unknown entity 'Nobody'"):
        tool(entity="Nobody", attribute="pop")
    company = _spec(family, ["staff"])["chains"][0][0]
    with pytest.raises(BadArguments, match="has no 'pop'; it has ceo, city, staff"):
        tool(entity=company, attribute="pop")
    with pytest.raises(BadArguments, match="missing argument"):
        tool(entity=company)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"seed": 3, "chains": [["Zzz", "pop"]], "op": None, "fault": False}, "not in world"),
        ({"seed": 3, "chains": [["X"]], "op": None, "fault": False}, "1 to 4 attributes"),
        ({"seed": 3, "chains": [], "op": None, "fault": False}, "one chain"),
        ({"seed": 3, "chains": [["X", "a"]], "op": "*", "fault": False}, "lookup spec must be"),
        ({"seed": "3", "chains": [["X", "a"]], "op": None, "fault": False}, "lookup spec must"),
        ({"seed": 3, "chains": [["X", "a"]], "op": None}, "lookup spec must be"),
        (None, "lookup spec must be"),
    ],
)
def test_validate_spec_rejects(family: LookupFamily, spec: object, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        family.validate_spec(spec)


def test_validate_spec_rejects_broken_chains(family: LookupFamily) -> None:
    company = _spec(family, ["staff"])["chains"][0][0]
    with pytest.raises(SpecError, match="has no attribute 'age'"):
        family.validate_spec({"seed": 3, "chains": [[company, "age"]], "op": None,
                              "fault": False})
    with pytest.raises(SpecError, match="must end in a number"):
        family.validate_spec({"seed": 3, "chains": [[company, "ceo"], [company, "staff"]],
                              "op": "+", "fault": False})


def test_sampling_respects_the_config() -> None:
    fam = load_family("lookup", {"min_hops": 2, "max_hops": 3, "compute_share": 0.0,
                                 "fault_share": 0.0})
    rng = random.Random(0)
    hops = set()
    for _ in range(40):
        spec = fam.sample_spec(rng)
        assert spec["op"] is None and not spec["fault"]
        hops.add(len(spec["chains"][0]) - 1)
    assert hops == {2, 3}
    with pytest.raises(ValidationError, match="min_hops"):
        LookupConfig(min_hops=3, max_hops=2)


def test_forced_fault_fails_the_first_call_only(family: LookupFamily) -> None:
    spec = _spec(family, ["ceo", "age"], fault=True)
    tools = family.tool_map(spec)
    company = spec["chains"][0][0]
    with pytest.raises(ToolFailure, match="lookup is temporarily unavailable"):
        tools["lookup"](entity=company, attribute="ceo")
    assert tools["lookup"](entity=company, attribute="ceo") == family.world(3)[company]["ceo"]
    assert tools["calculator"](expression="1+1") == "2"  # the fault is spent, for every tool
    fresh = family.tool_map(spec)  # a new episode fails again
    with pytest.raises(ToolFailure):
        fresh["calculator"](expression="1+1")
    solution = family.solve(spec, family.tool_map(spec))
    assert solution.calls[0].observation.startswith("Error: ")
    assert solution.calls[0].arguments == solution.calls[1].arguments
    assert len(solution.calls) == 3
    assert "recover:tool_error" in family.make_task(spec).skills


def _run(family: LookupFamily, chat: ChatFormat, spec: dict, turns: list[str],
         faults: FaultConfig, seed: int = 0) -> Episode:
    task = family.make_task(spec)
    episode = Episode(task, family.tool_map(spec), chat, HermesParser(),
                      EnvConfig(max_turns=30, max_tokens=1 << 14, faults=faults),
                      random.Random(seed))
    for text in turns:
        if episode.done:
            break
        ids = chat.assistant_ids(text)
        episode.add_policy_turn(ids, [0.0] * len(ids))
    return episode


def test_env_fault_injection_and_retrying_works(family: LookupFamily, chat: ChatFormat) -> None:
    spec = _spec(family, ["ceo", "city"])
    company = spec["chains"][0][0]
    call = format_call("lookup", {"entity": company, "attribute": "ceo"})
    episode = _run(family, chat, spec, [call] * 5, FaultConfig(rate=1.0))
    assert {s.error_kind for s in episode.steps} <= {"tool_error", "timeout"}
    assert all(s.observation.startswith("Error: lookup") for s in episode.steps)
    # at rate 0.5 a policy that retries every failed call gets every fact
    ceo = family.world(3)[company]["ceo"]
    episode = _run(family, chat, spec, [call] * 12, FaultConfig(rate=0.5), seed=1)
    kinds = [s.error_kind for s in episode.steps]
    assert None in kinds and ("tool_error" in kinds or "timeout" in kinds)
    assert {s.observation for s in episode.steps if s.error_kind is None} == {ceo}


def test_unrecovered_fault_is_classified(family: LookupFamily, chat: ChatFormat) -> None:
    spec = _spec(family, ["ceo", "city"], fault=True)
    task = family.make_task(spec)
    company = spec["chains"][0][0]
    call = format_call("lookup", {"entity": company, "attribute": "ceo"})
    gave_up = _run(family, chat, spec, [call, format_answer("Lyon")], FaultConfig())
    traj = gave_up.trajectory()
    assert not family.verify_trajectory(task, traj)
    failure = FailureAnalyzer({"lookup": family}).classify(task, traj)
    assert failure is not None and failure.mode == "tool_error_unrecovered"
    assert failure.first_error_step == 0 and "recover:tool_error" in failure.skills
    # the reference retries and succeeds
    turns = family.solve(spec, family.tool_map(spec)).assistant_turns()
    done = _run(family, chat, spec, turns, FaultConfig()).trajectory()
    assert done.steps[0].error_kind == "tool_error" and family.verify_trajectory(task, done)


def _step(index: int, kind: str, **fields: object) -> Step:
    return Step(index=index, text="", kind=kind, **fields)  # type: ignore[arg-type]


def test_locate_error(family: LookupFamily) -> None:
    spec = _spec(family, ["ceo", "city"])
    task = family.make_task(spec)
    world = family.world(3)
    company = spec["chains"][0][0]
    ceo = world[company]["ceo"]
    good = [_step(0, "tool_call", tool="lookup",
                  arguments={"entity": company, "attribute": "ceo"}, observation=ceo),
            _step(1, "tool_call", tool="lookup",
                  arguments={"entity": ceo, "attribute": "city"}, observation=task.answer)]
    assert family.locate_error(task, [*good, _step(2, "answer", answer=task.answer)]) is None
    assert family.locate_error(task, [*good, _step(2, "answer", answer="Nowhere")]) == 2
    twin = [good[0], _step(1, "tool_call", tool="lookup",
                           arguments={"entity": "Zzz", "attribute": "city"}, observation="x")]
    assert family.locate_error(task, [*twin, _step(2, "answer", answer="x")]) == 1
    flaky = [_step(0, "tool_call", tool="lookup", arguments=good[0].arguments,
                   error="down", error_kind="timeout"), *good]
    assert family.locate_error(task, [*flaky, _step(3, "answer", answer="Nowhere")]) == 3
    assert family.locate_error(task, [_step(0, "text")]) == 0


def test_decompose_and_escalate(family: LookupFamily) -> None:
    spec = _spec(family, ["ceo", "city", "pop"])
    company = spec["chains"][0][0]
    assert family.decompose(spec, 0)["chains"] == [[company, "ceo"]]
    assert family.decompose(spec, 1)["chains"] == [[company, "ceo", "city"]]
    assert family.decompose(spec, 2) is None  # the whole question
    assert family.decompose(spec, 5) is None
    harder = family.escalate(spec, random.Random(0))
    assert harder is not None and len(harder["chains"][0]) == 5
    assert harder["chains"][0][2:] == ["ceo", "city", "pop"]
    assert family.make_task(harder).answer == family.make_task(spec).answer
    four = family.validate_spec({**harder})
    assert family.escalate(four, random.Random(0)) is None  # already 4 hops
