"""Tests of the hybrid reward (`sentinel.rewards`) on hand-built arith trajectories."""

from __future__ import annotations

import doctest

import pytest
from pydantic import ValidationError

import sentinel.rewards
from sentinel.rewards import RewardConfig, format_score, process_score, score
from sentinel.tasks import load_family
from sentinel.types import Step, Task, Trajectory

ARITH = load_family("arith")


def arith_task() -> Task:
    return ARITH.make_task({"expr": "(3+4)*5"})


def call(i: int, expression: str, **fields) -> Step:
    return Step(
        i,
        f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}'
        "</tool_call>",
        "tool_call",
        tool="calculator",
        arguments={"expression": expression},
        **fields,
    )


def answer(i: int, value: str, **fields) -> Step:
    return Step(i, f"<answer>{value}</answer>", "answer", answer=value, **fields)


def trajectory(steps: list[Step], finish_reason: str = "answer") -> Trajectory:
    answers = [s.answer for s in steps if s.kind == "answer"]
    return Trajectory(
        task_id="t",
        messages=[],
        token_ids=[],
        loss_mask=[],
        logprobs=[],
        steps=steps,
        finish_reason=finish_reason,
        answer=answers[-1] if answers else None,
    )


def test_doctests_pass():
    assert doctest.testmod(sentinel.rewards).failed == 0


def test_malformed_below_wellformed_wrong_below_correct():
    task, config = arith_task(), RewardConfig()
    malformed = trajectory(
        [
            call(0, "3+4", observation="7"),
            Step(
                1,
                "<tool_call>{oops</tool_call>",
                "malformed",
                error="invalid JSON",
                error_kind="parse",
            ),
            answer(2, "35"),
        ]
    )
    malformed_wrong = trajectory(
        [Step(0, "<tool_call>{oops", "malformed", error_kind="parse"), answer(1, "34")]
    )
    text_only = trajectory([Step(0, "the answer is 35", "text")], finish_reason="stop")
    wrong = trajectory(
        [call(0, "3+4", observation="7"), call(1, "7*5", observation="35"), answer(2, "34")]
    )
    correct = trajectory(
        [call(0, "3+4", observation="7"), call(1, "7*5", observation="35"), answer(2, "35")]
    )
    r_wrong, _, s_wrong = score(task, wrong, ARITH, config)
    r_correct, terms, s_correct = score(task, correct, ARITH, config)
    for bad in (malformed_wrong, text_only):
        r_bad, _, s_bad = score(task, bad, ARITH, config)
        assert r_bad < r_wrong
        assert not s_bad
    assert r_wrong < r_correct
    assert not s_wrong and s_correct
    assert terms == {"outcome": 1.0, "format": 1.0, "process": 1.0}
    assert r_correct == pytest.approx(1.3)
    # A malformed turn costs format even when the answer is right.
    assert score(task, malformed, ARITH, config)[0] < r_correct


def test_terms_on_hand_built_cases():
    task = arith_task()
    steps = [
        call(
            0,
            "3+4",
            observation="Error: calculator timed out",
            error="timed out",
            error_kind="timeout",
        ),
        Step(1, "", "tool_call", tool="calc", arguments={}, error_kind="unknown_tool"),
        call(2, "3+", error="malformed expression", error_kind="bad_arguments"),
        call(3, "3+4", observation="7", hallucinated=True),
        answer(4, "35"),
    ]
    reward, terms, success = score(task, trajectory(steps), ARITH, RewardConfig())
    # well-formed: steps 0, 1, 2, 4 (3 is hallucinated); sound calls: only the timed-out one.
    assert terms == {"outcome": 1.0, "format": 0.8, "process": 0.25}
    assert success
    assert reward == pytest.approx(1.0 + 0.2 * 0.8 + 0.1 * 0.25)


def test_empty_and_answer_only_trajectories():
    assert format_score([]) == 0.0
    assert process_score([]) == 0.0
    assert process_score([answer(0, "1")]) == 1.0
    reward, terms, success = score(arith_task(), trajectory([], "max_turns"), ARITH, RewardConfig())
    assert (reward, success) == (0.0, False)
    assert terms == {"outcome": 0.0, "format": 0.0, "process": 0.0}


def test_weights_come_from_config_and_reject_negatives():
    task = arith_task()
    wrong = trajectory([answer(0, "34")])
    reward, _, _ = score(task, wrong, ARITH, RewardConfig(w_format=0.5, w_process=0.0))
    assert reward == pytest.approx(0.5)
    with pytest.raises(ValidationError, match="w_format"):
        RewardConfig(w_format=-1.0)
    with pytest.raises(ValidationError, match="w_typo"):
        RewardConfig(w_typo=1.0)
