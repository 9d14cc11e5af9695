"""Fault schedules carried by tasks (`sentinel.env.faults`, arith's `faults`): deterministic per
task, each type met where scheduled, each remedy verified and each non-remedy failing, with the
real tiny tokenizer, the real environment and the real calculator."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sentinel.analyzer import FailureAnalyzer
from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig, replay
from sentinel.env.faults import FAULT_TYPES, TRUNCATED, check_schedule, truncate
from sentinel.env.parser import HermesParser, format_answer, format_call
from sentinel.tasks import SpecError
from sentinel.tasks.arith import ArithConfig, ArithFamily
from sentinel.tasks.mixture import TaskMixture, _apportion
from sentinel.types import Task, Trajectory

ENV = EnvConfig(max_turns=10, max_tokens=2048, max_turn_tokens=64)


@pytest.fixture(scope="module")
def faulty() -> ArithFamily:
    return ArithFamily(ArithConfig(instruction="", fault_share=1.0,
                                   fault_types=list(FAULT_TYPES)))


def run(family: ArithFamily, task: Task, turns: list[str], chat: ChatFormat) -> Trajectory:
    """Scripted assistant turns through a fresh episode of `task` (its scheduled tools)."""
    traj = replay(task, turns, family.tool_map(task.spec), chat, HermesParser(), ENV)
    traj.success = family.verify_trajectory(task, traj)
    return traj


def calc(expression: str, tool: str = "calculator") -> str:
    return format_call(tool, {"expression": expression})


# Two-operation tasks with the fault on the second call: (spec, the remedy's turns, a non-remedy's).
CASES: dict[str, tuple[dict[str, Any], list[str], list[str]]] = {
    "timeout": ({"expr": "3*4+5", "faults": [{"type": "timeout", "call": 1}]},
                [calc("3*4"), calc("12+5"), calc("12+5"), format_answer("17")],
                # moving on without the value: answer a guess
                [calc("3*4"), calc("12+5"), format_answer("12")]),
    "rate_limit": ({"expr": "3*4+5", "faults": [{"type": "rate_limit", "call": 1}]},
                   [calc("3*4"), calc("12+5"), format_call("wait", {"seconds": 2}), calc("12+5"),
                    format_answer("17")],
                   # retrying at once, again and again, never waiting: refused every time
                   [calc("3*4"), calc("12+5"), calc("12+5"), calc("12+5"), format_answer("12")]),
    "notation": ({"expr": "3*4+5", "faults": [{"type": "notation", "call": 0}]},
                 [calc("3x4"), calc("3*4"), calc("12+5"), format_answer("17")],
                 # repeating the user's notation
                 [calc("3x4"), calc("3x4"), format_answer("12")]),
    "renamed": ({"expr": "3*4+5", "faults": [{"type": "renamed", "call": 1}]},
                [calc("3*4"), calc("12+5"), calc("12+5", "calc"), format_answer("17")],
                # calling the old name again: it stays gone
                [calc("3*4"), calc("12+5"), calc("12+5"), format_answer("12")]),
    "truncated": ({"expr": "3*4+5", "faults": [{"type": "truncated", "call": 1}]},
                  [calc("3*4"), calc("12+5"), calc("12+5"), format_answer("17")],
                  # using the cut value
                  [calc("3*4"), calc("12+5"), format_answer("1")]),
    "colon": ({"expr": "24/2+5", "faults": [{"type": "colon", "call": 0}]},
              [calc("24:2"), calc("24/2"), calc("12+5"), format_answer("17")],
              # reading the colon as another operator
              [calc("24:2"), calc("24*2"), calc("48+5"), format_answer("53")]),
    "plus": ({"expr": "3*4+5", "faults": [{"type": "plus", "call": 1}]},
             [calc("3*4"), calc("12 plus 5"), calc("12+5"), format_answer("17")],
             # repeating the user's word
             [calc("3*4"), calc("12 plus 5"), calc("12 plus 5"), format_answer("12")]),
    "minus": ({"expr": "3*8-7", "faults": [{"type": "minus", "call": 1}]},
              [calc("3*8"), calc("24 minus 7"), calc("24-7"), format_answer("17")],
              # dropping the refused operation
              [calc("3*8"), calc("24 minus 7"), format_answer("24")]),
}


def test_cases_cover_every_fault_type() -> None:
    assert set(CASES) == set(FAULT_TYPES)


@pytest.mark.parametrize("fault_type", FAULT_TYPES)
def test_remedy_verifies_and_non_remedy_fails(faulty: ArithFamily, chat: ChatFormat,
                                              fault_type: str) -> None:
    spec, remedy, wrong = CASES[fault_type]
    task = faulty.make_task(spec)
    assert f"recover:{fault_type}" in task.skills and task.answer == "17"
    good = run(faulty, task, remedy, chat)
    assert good.success, [s.observation for s in good.steps]
    # The fault was really met on the scheduled call: an error or a cut result there.
    met = good.steps[0] if fault_type in ("notation", "colon") else good.steps[1]
    assert met.error is not None or (met.observation or "").endswith(TRUNCATED)
    assert not run(faulty, task, wrong, chat).success


@pytest.mark.parametrize("fault_type", FAULT_TYPES)
def test_reference_solution_is_the_remedy(faulty: ArithFamily, chat: ChatFormat,
                                          fault_type: str) -> None:
    """The SFT demonstration: the reference replayed through the environment meets the fault,
    remedies it and verifies; its turns are exactly the hand-written remedy."""
    spec, remedy, _ = CASES[fault_type]
    task = faulty.make_task(spec)
    traj = faulty.reference_trajectory(task, chat, HermesParser(), ENV)
    assert faulty.verify_trajectory(task, traj)
    assert [m["content"] for m in traj.messages if m["role"] == "assistant"] == remedy


def test_schedule_is_deterministic_per_task(faulty: ArithFamily, chat: ChatFormat) -> None:
    """Every episode of a task meets the same fault at the same call: the state is per episode,
    so a second episode (a second sample of the group) starts the schedule afresh."""
    task = faulty.make_task(CASES["timeout"][0])
    turns = [calc("3*4"), calc("12+5"), calc("12+5"), format_answer("17")]
    first, second = run(faulty, task, turns, chat), run(faulty, task, turns, chat)
    assert [s.error_kind for s in first.steps] == [s.error_kind for s in second.steps] == \
        [None, "timeout", None, None]
    # The fault follows the call count, whatever the call: a different first call still leaves
    # the second call to time out.
    other = run(faulty, task, [calc("4*3"), calc("5+12")], chat)
    assert [s.error_kind for s in other.steps] == [None, "timeout"]


def test_rate_limit_holds_until_a_long_enough_wait(faulty: ArithFamily, chat: ChatFormat) -> None:
    task = faulty.make_task(CASES["rate_limit"][0])
    short = run(faulty, task, [calc("3*4"), calc("12+5"), format_call("wait", {"seconds": 1}),
                               calc("12+5")], chat)
    assert short.steps[-1].error is not None and "rate limit" in short.steps[-1].error


def test_renamed_tool_is_hidden_until_the_rename(faulty: ArithFamily, chat: ChatFormat) -> None:
    task = faulty.make_task(CASES["renamed"][0])
    traj = run(faulty, task, [calc("3*4", "calc")], chat)
    assert traj.steps[0].error_kind == "unknown_tool"
    prompt = chat.decode(traj.token_ids[: traj.prompt_len])
    assert "calc," not in prompt and "calc<" not in prompt and "calculator" in prompt


def test_unknown_tool_error_lists_the_new_name_after_the_rename(
        faulty: ArithFamily, chat: ChatFormat) -> None:
    """After the rename a misspelt call is told the tool's current name, never the old one."""
    task = faulty.make_task(CASES["renamed"][0])
    traj = run(faulty, task, [calc("3*4"), calc("12+5"), calc("12+5", "clc")], chat)
    assert [s.error_kind for s in traj.steps] == [None, "unknown_tool", "unknown_tool"]
    assert traj.steps[-1].error == "unknown tool 'clc'; available: calc, wait"


def test_wait_is_listed_for_every_task_when_rate_limits_are_configured(
        faulty: ArithFamily, chat: ChatFormat) -> None:
    """The tool list must not tell which task carries a rate limit."""
    clean = faulty.make_task({"expr": "3*4+5"})
    limited = faulty.make_task(CASES["rate_limit"][0])
    prompts = [chat.decode(run(faulty, t, [], chat).token_ids) for t in (clean, limited)]
    assert all("wait" in p for p in prompts)
    assert "wait" not in chat.decode(run(ArithFamily(ArithConfig(instruction="")), clean, [],
                                         chat).token_ids)


def test_notation_is_rendered_at_the_scheduled_operation(faulty: ArithFamily) -> None:
    spec = {"expr": "2*3+4*5", "faults": [{"type": "notation", "call": 1}]}
    assert faulty.make_task(spec).prompt[-1]["content"] == "Compute 2*3+4x5"
    with pytest.raises(SpecError, match="multiplication"):
        faulty.validate_spec({"expr": "2*3+4*5", "faults": [{"type": "notation", "call": 2}]})


@pytest.mark.parametrize("fault_type, prompt, refused", [
    ("colon", "Compute 2*3+20:5-1", "write division as /"),
    ("plus", "Compute 2*3 plus 20/5-1", "write addition as +"),
    ("minus", "Compute 2*3+20/5 minus 1", "write subtraction as -"),
])
def test_each_notation_is_rendered_and_refused_with_its_hint(
        faulty: ArithFamily, fault_type: str, prompt: str, refused: str) -> None:
    """A notation type writes only its own operator in the user's form, and the calculator's
    refusal names the accepted form (what the remedy needs to know)."""
    rng = random.Random(0)
    spec = faulty.with_fault({"expr": "2*3+20/5-1"}, fault_type, rng)
    task = faulty.make_task(spec)
    assert task.prompt[-1]["content"] == prompt
    solution = faulty.solve(spec, faulty.tool_map(spec))
    errors = [c.observation for c in solution.calls if c.observation.startswith("Error")]
    assert len(errors) == 1 and errors[0].endswith(refused)
    assert solution.answer == "9"
    with pytest.raises(SpecError, match="needs a"):  # no operation of its operator
        faulty.validate_spec({"expr": "2*3", "faults": [{"type": fault_type, "call": 0}]})


@pytest.mark.parametrize("faults, message", [
    ([{"type": "meteor", "call": 0}], "unknown fault type"),
    ([{"type": "timeout", "call": 5}], r"\[0, 2\)"),
    ([{"type": "timeout", "call": 0}, {"type": "truncated", "call": 0}], "one fault per call"),
    ([{"type": "timeout"}], "type"),
    ("timeout", "list"),
])
def test_bad_schedules_are_spec_errors(faulty: ArithFamily, faults: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        faulty.validate_spec({"expr": "3*4+5", "faults": faults})


def test_clean_spec_keeps_its_id(arith: ArithFamily) -> None:
    """No `faults` key on a clean task, so ids stored before fault schedules stay valid."""
    assert arith.validate_spec({"expr": "3+4", "faults": []}) == {"expr": "3+4"}
    assert arith.make_task({"expr": "3+4"}).task_id == arith.make_task(
        {"expr": "3+4", "faults": []}).task_id


def test_check_schedule_sorts_by_call() -> None:
    schedule = [{"type": "truncated", "call": 2}, {"type": "timeout", "call": 0}]
    assert [f["call"] for f in check_schedule(schedule, 3)] == [0, 2]


def test_truncate_cuts_the_value() -> None:
    assert truncate("1234") == "12" + TRUNCATED and truncate("7") == TRUNCATED


def test_base_distribution_fault_share(faulty: ArithFamily) -> None:
    rng = random.Random(3)
    specs = [faulty.sample_spec(rng) for _ in range(200)]
    assert all(len(s.get("faults", [])) == 1 for s in specs)
    types = {s["faults"][0]["type"] for s in specs}
    assert types == set(FAULT_TYPES)
    clean = ArithFamily(ArithConfig(fault_share=0.0, fault_types=["timeout"]))
    assert not any("faults" in clean.sample_spec(rng) for _ in range(50))


def test_fault_weights_choose_the_base_distributions_types() -> None:
    """`fault_weights` draws the fault types by weight: types weighted 0 or missing never come,
    yet stay in `fault_types`, so `wait` is still listed (the prompt does not change); 3:1 comes
    out near 3:1."""
    family = ArithFamily(ArithConfig(fault_share=1.0, fault_types=list(FAULT_TYPES),
                                     fault_weights={"plus": 1.0, "colon": 1.0, "minus": 0.0}))
    rng = random.Random(5)
    types = [family.sample_spec(rng)["faults"][0]["type"] for _ in range(300)]
    assert set(types) == {"plus", "colon"}
    assert "wait" in {tool.name for tool in family.tools()}
    skewed = ArithFamily(ArithConfig(fault_share=1.0, fault_types=["timeout", "rate_limit"],
                                     fault_weights={"timeout": 3.0, "rate_limit": 1.0}))
    counts = [skewed.sample_spec(rng)["faults"][0]["type"] for _ in range(2000)]
    assert 0.70 < counts.count("timeout") / len(counts) < 0.80
    assert ArithConfig(fault_share=1.0, fault_types=["timeout"]).fault_weights is None


@pytest.mark.parametrize(("weights", "message"), [
    ({"meteor": 1.0}, "not in fault_types"), ({"timeout": -1.0, "plus": 1.0}, ">= 0"),
    ({"timeout": 0.0}, "at least one > 0")])
def test_bad_fault_weights_are_config_errors(weights: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ArithConfig(fault_share=0.5, fault_types=["timeout", "plus"], fault_weights=weights)


def test_with_fault_and_perturb_keep_the_type(faulty: ArithFamily) -> None:
    rng = random.Random(0)
    spec = faulty.with_fault({"expr": "(3+4)*5-6"}, "notation", rng)
    assert spec is not None and spec["faults"] == [{"type": "notation", "call": 1}]
    assert faulty.with_fault({"expr": "3+4"}, "notation", rng) is None
    moved = faulty.perturb(spec, rng)
    assert moved["faults"] == spec["faults"] and moved["expr"] != spec["expr"]
    assert faulty.without_faults(spec) == {"expr": "(3+4)*5-6"}


def test_config_rejects_unknown_types() -> None:
    with pytest.raises(ValueError, match="fault_types"):
        ArithConfig(fault_types=["meteor"])
    with pytest.raises(ValueError, match="fault_share"):
        ArithConfig(fault_share=0.5)


@pytest.mark.parametrize("fault_type, mode", [
    ("timeout", "tool_error_unrecovered"), ("rate_limit", "tool_error_unrecovered"),
    ("notation", "bad_arguments"), ("renamed", "unknown_tool"), ("truncated", "premature_answer"),
    ("plus", "bad_arguments"), ("minus", "bad_arguments"),
])
def test_analyzer_names_the_unrecovered_fault(faulty: ArithFamily, chat: ChatFormat,
                                              fault_type: str, mode: str) -> None:
    """The non-remedies fail for the reason a reader would give; the fault's skill tag is on the
    failure, so its cluster is the fault type's."""
    spec, _, wrong = CASES[fault_type]
    task = faulty.make_task(spec)
    traj = run(faulty, task, wrong, chat)
    failure = FailureAnalyzer({"arith": faulty}).classify(task, traj)
    assert failure is not None and failure.mode == mode
    assert f"recover:{fault_type}" in failure.skills


def test_stratified_draw_gives_exact_counts() -> None:
    members = [("arith", ArithFamily(ArithConfig(instruction="", fault_share=1.0,
                                                  fault_types=[t]))) for t in FAULT_TYPES[:3]]
    mixture = TaskMixture([(n, f, 1.0) for n, f in members])
    tasks = mixture.draw(30, seed=7, stratified=True)
    counts = {t: sum(f"recover:{t}" in task.skills for task in tasks) for t in FAULT_TYPES[:3]}
    assert counts == {t: 10 for t in FAULT_TYPES[:3]}
    assert _apportion(10, [2, 1, 1]) == [5, 3, 2]


def _cold_start_mix(tmp_path: Any, types: dict[str, float] | None) -> dict[str, int]:
    """The fault types of 600 cold-start examples drawn as `Loop._cold_start` draws them, every
    one a recovery demonstration (`recovery_share: 1`)."""
    from sentinel.config import load_config
    from sentinel.loop import Loop

    loop = Loop(load_config(data={
        "families": [{"type": "arith", "max_value": 20, "instruction": "",
                      "fault_types": ["timeout", "notation", "rate_limit"]}],
        "sft": {"recovery_share": 1.0, "recovery_types": types}}), tmp_path / "run")
    rng, counts = random.Random(0), {}
    for _ in range(600):
        task = loop._recovery_example(loop.mixture.sample(rng), 1.0, rng, types)
        kind = next((s for s in task.skills if s.startswith("recover:")), "clean")
        counts[kind] = counts.get(kind, 0) + 1
    # A spec where the drawn fault cannot happen (`with_fault` gives None: notation needs a `*`
    # to rewrite) stays clean.
    assert counts.pop("clean", 0) < 120
    return counts


def test_cold_start_recovery_types_weigh_the_demonstrations(tmp_path: Any) -> None:
    """`sft.recovery_types` sets each fault type's share of the recovery demonstrations: a type
    weighted 0 or missing gets none, the others follow their weights; null: uniform."""
    counts = _cold_start_mix(tmp_path / "w", {"timeout": 3.0, "rate_limit": 1.0})
    assert set(counts) == {"recover:timeout", "recover:rate_limit"}
    assert 0.70 < counts["recover:timeout"] / sum(counts.values()) < 0.82
    uniform = _cold_start_mix(tmp_path / "u", None)
    assert set(uniform) == {"recover:timeout", "recover:notation", "recover:rate_limit"}
    assert abs(uniform["recover:timeout"] - uniform["recover:rate_limit"]) < 60


@pytest.mark.parametrize("types, message", [
    ({"timeout": 1.0, "oops": 1.0}, "unknown fault type"),
    ({"timeout": 0.0}, "at least one > 0"),
    ({"timeout": -1.0, "notation": 2.0}, "weights must be >= 0"),
])
def test_bad_recovery_types_are_config_errors(types: dict[str, float], message: str) -> None:
    from sentinel.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config(data={"sft": {"recovery_share": 0.05, "recovery_types": types}})


@pytest.mark.parametrize("fault_type", ["timeout", "rate_limit", "renamed", "truncated"])
def test_echo_quotes_the_call_and_keeps_remedies(chat: ChatFormat, fault_type: str) -> None:
    """`fault_echo`: the fault's message quotes the call it met; the remedy and the non-remedy
    are judged as without it, and the reference still is the remedy."""
    echoing = ArithFamily(ArithConfig(instruction="", fault_share=1.0, fault_echo=True,
                                      fault_types=list(FAULT_TYPES)))
    spec, remedy, wrong = CASES[fault_type]
    task = echoing.make_task(spec)
    good = run(echoing, task, remedy, chat)
    assert good.success, [s.observation for s in good.steps]
    met = good.steps[1]
    shown = met.error if met.error is not None else met.observation
    assert '{"expression": "12+5"}' in (shown or ""), shown
    if fault_type == "truncated":
        assert shown == '{"expression": "12+5"} = 1' + TRUNCATED
    plain = run(ArithFamily(ArithConfig(instruction="", fault_share=1.0,
                                        fault_types=list(FAULT_TYPES))), task, remedy, chat)
    quoted = plain.steps[1].error or plain.steps[1].observation
    assert '"expression"' not in (quoted or "")  # off by default
    assert not run(echoing, task, wrong, chat).success
    traj = echoing.reference_trajectory(task, chat, HermesParser(), ENV)
    assert echoing.verify_trajectory(task, traj)
    assert [m["content"] for m in traj.messages if m["role"] == "assistant"] == remedy
