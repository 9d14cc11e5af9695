"""Tests of the failure taxonomy (`sentinel.analyzer`) on hand-built arith trajectories.

The task is (3+4)*5: the reference makes two calculator calls (3+4 -> 7, 7*5 -> 35).
"""

from __future__ import annotations

import dataclasses

import pytest

from sentinel.analyzer import (
    DETECTORS,
    FailureAnalyzer,
    cluster_failures,
    cluster_key,
    fault_type_of,
    share_trend,
)
from sentinel.tasks import load_family
from sentinel.types import FAILURE_MODES, Failure, Step, Task, Trajectory, cluster_id_for

ARITH = load_family("arith")
TASK: Task = ARITH.make_task({"expr": "(3+4)*5"})


def call(i: int, expression: str, observation: str | None = None, **fields) -> Step:
    return Step(
        i,
        f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}'
        "</tool_call>",
        "tool_call",
        tool="calculator",
        arguments={"expression": expression},
        observation=observation,
        **fields,
    )


def failed(i: int, expression: str, error_kind: str) -> Step:
    return call(i, expression, f"Error: {error_kind}", error=error_kind, error_kind=error_kind)


def answer(i: int, value: str) -> Step:
    return Step(i, f"<answer>{value}</answer>", "answer", answer=value)


def trajectory(steps: list, finish_reason: str = "answer", success: bool = False) -> Trajectory:
    answers = [s.answer for s in steps if isinstance(s, Step) and s.kind == "answer"]
    return Trajectory(
        task_id=TASK.task_id,
        messages=[],
        token_ids=[],
        loss_mask=[],
        logprobs=[],
        steps=steps,
        finish_reason=finish_reason,
        answer=answers[-1] if answers else None,
        success=success,
        round=4,
    )


def classify(steps: list, finish_reason: str = "answer", **kwargs):
    analyzer = FailureAnalyzer({"arith": ARITH}, **kwargs)
    return analyzer.classify(TASK, trajectory(steps, finish_reason))


def test_every_mode_has_one_detector_and_wrong_answer_is_last():
    assert sorted(DETECTORS) == sorted(FAILURE_MODES)
    assert list(DETECTORS)[-1] == "wrong_answer"


def test_success_is_not_a_failure():
    steps = [call(0, "3+4", "7"), call(1, "7*5", "35"), answer(2, "35")]
    assert FailureAnalyzer({"arith": ARITH}).classify(TASK, trajectory(steps, success=True)) is None


CASES = {
    "hallucinated_observation": (
        [
            call(0, "3+4", "7"),
            Step(
                1,
                '<tool_call>{"name": "calculator", "arguments": {"expression": "7*5"}}'
                "</tool_call><tool_response>36</tool_response>",
                "tool_call",
                tool="calculator",
                arguments={"expression": "7*5"},
                observation="35",
                hallucinated=True,
            ),
            answer(2, "36"),
        ],
        "answer",
        1,
    ),
    "format_error": (
        [
            call(0, "3+4", "7"),
            Step(
                1,
                "<tool_call>{7*5",
                "malformed",
                error="unbalanced <tool_call> tags",
                error_kind="parse",
            ),
            Step(
                2,
                "<tool_call>{oops}</tool_call>",
                "malformed",
                error="invalid JSON",
                error_kind="parse",
            ),
        ],
        "max_turns",
        1,
    ),
    "unknown_tool": (
        [
            call(0, "3+4", "7"),
            Step(
                1,
                "",
                "tool_call",
                tool="multiply",
                arguments={"a": 7, "b": 5},
                error="unknown tool 'multiply'",
                error_kind="unknown_tool",
            ),
            answer(2, "34"),
        ],
        "answer",
        1,
    ),
    "bad_arguments": (
        [call(0, "3+4", "7"), failed(1, "7*", "bad_arguments"), answer(2, "34")],
        "answer",
        1,
    ),
    "loop": (
        [call(0, "3+4", "7"), call(1, "3+4", "7"), call(2, "3+4", "7"), call(3, "3+4", "7")],
        "max_turns",
        1,
    ),
    "tool_error_unrecovered": (
        [call(0, "3+4", "7"), failed(1, "7*5", "timeout"), answer(2, "36")],
        "answer",
        1,
    ),
    "no_answer": (
        [call(0, "3+4", "7"), call(1, "7*5", "35")],
        "max_turns",
        1,
    ),
    "premature_answer": (
        [call(0, "3+4", "7"), answer(1, "7")],
        "answer",
        1,
    ),
    "wrong_answer": (
        # The 7*6 call is where it went wrong (locate_error), not the answer step.
        [call(0, "3+4", "7"), call(1, "7*6", "42"), answer(2, "42")],
        "answer",
        1,
    ),
}


@pytest.mark.parametrize("mode", sorted(CASES))
def test_each_mode_detected_with_first_error_step(mode):
    steps, finish_reason, first = CASES[mode]
    failure = classify(steps, finish_reason)
    assert failure is not None
    assert (failure.mode, failure.first_error_step) == (mode, first)
    assert failure.evidence and len(failure.evidence) <= 200
    assert failure.task_id == TASK.task_id and failure.round == 4
    assert failure.skills == TASK.skills and failure.family == "arith"


def test_evidence_quotes_the_offending_step():
    failure = classify(*CASES["unknown_tool"][:2])
    assert "multiply" in failure.evidence and "step 1" in failure.evidence
    failure = classify(*CASES["bad_arguments"][:2])
    assert "7*" in failure.evidence


def test_wrong_final_answer_points_at_the_answer_step():
    failure = classify([call(0, "3+4", "7"), call(1, "7*5", "35"), answer(2, "34")])
    assert (failure.mode, failure.first_error_step) == ("wrong_answer", 2)
    assert "'34'" in failure.evidence and "'35'" in failure.evidence


def test_recovered_mistakes_are_not_the_cause():
    # Unknown tool, then the right calls, then a wrong answer: the answer is what failed.
    unknown = Step(
        0,
        "",
        "tool_call",
        tool="mul",
        arguments={},
        error="unknown tool 'mul'",
        error_kind="unknown_tool",
    )
    failure = classify([unknown, call(1, "3+4", "7"), call(2, "7*5", "35"), answer(3, "34")])
    assert failure.mode == "wrong_answer"
    # A parse error followed by well-formed steps is not a format error.
    malformed = Step(0, "<tool_call>{", "malformed", error="invalid JSON", error_kind="parse")
    failure = classify([malformed, call(1, "3+4", "7"), call(2, "7*5", "35"), answer(3, "34")])
    assert failure.mode == "wrong_answer"
    # Retrying after transient failures is recovery, not a loop.
    steps = [
        failed(0, "3+4", "timeout"),
        failed(1, "3+4", "tool_error"),
        call(2, "3+4", "7"),
        call(3, "7*5", "35"),
        answer(4, "34"),
    ]
    assert classify(steps).mode == "wrong_answer"


def test_text_turn_ending_the_episode_is_a_format_error():
    steps = [call(0, "3+4", "7"), Step(1, "so it is 35", "text")]
    failure = classify(steps, "stop")
    assert (failure.mode, failure.first_error_step) == ("format_error", 1)


def test_priority_hallucination_over_everything_and_loop_over_no_answer():
    steps = [
        Step(0, "<tool_response>7</tool_response>", "text", hallucinated=True),
    ]
    assert classify(steps, "stop").mode == "hallucinated_observation"
    # An unrecovered unknown tool, repeated: the unknown name is the more specific cause.
    unknown = [
        Step(i, "", "tool_call", tool="mul", arguments={"a": 1}, error_kind="unknown_tool")
        for i in range(3)
    ]
    failure = classify(unknown, "max_turns")
    assert (failure.mode, failure.first_error_step) == ("unknown_tool", 0)
    # A shorter loop threshold.
    steps = [call(0, "3+4", "7"), call(1, "3+4", "7")]
    assert classify(steps, "max_turns", loop_repeats=2).mode == "loop"
    assert classify(steps, "max_turns").mode == "no_answer"
    with pytest.raises(ValueError, match="loop_repeats"):
        FailureAnalyzer({}, loop_repeats=1)


def test_premature_needs_the_family_and_caches_the_reference():
    analyzer = FailureAnalyzer({"arith": ARITH})
    analyzer.classify(TASK, trajectory([answer(0, "7")]))
    reference = analyzer.reference(TASK)
    assert reference is not None and len(reference.calls) == 2
    assert analyzer.reference(TASK) is reference  # cached, not solved again
    # Without the family the reference is unknown, so only wrong_answer can say what happened.
    failure = FailureAnalyzer({}).classify(TASK, trajectory([answer(0, "7")]))
    assert (failure.mode, failure.first_error_step) == ("wrong_answer", 0)


def test_empty_trajectory_is_no_answer():
    failure = classify([], "max_tokens")
    assert (failure.mode, failure.first_error_step) == ("no_answer", None)


def test_garbage_never_crashes():
    garbage = [
        [Step(None, None, None)],  # type: ignore[arg-type]
        [
            Step(
                0,
                "x" * 5000,
                "tool_call",
                tool=None,
                arguments=["not", "a", "dict"],
                error_kind="weird",
            )
        ],  # type: ignore[arg-type]
        [Step("3", "\x00\ufffd", "answer", answer=5)],  # type: ignore[arg-type]
        [None, 42, Step(1, "", "malformed")],
        [Step(0, "", "tool_call", tool=["list"], arguments={"a": {1, 2}}) for _ in range(4)],
        [
            Step(
                0,
                "",
                "tool_call",
                tool="calculator",
                arguments={"expression": None},
                observation=None,
                hallucinated="yes",
            )
        ],  # type: ignore[arg-type]
    ]
    for steps in garbage:
        for finish_reason in ("answer", "stop", "max_turns", "nonsense"):
            traj = trajectory(steps, finish_reason)
            traj.answer = "🙂" * 300 if finish_reason == "answer" else None
            failure = FailureAnalyzer({"arith": ARITH}).classify(TASK, traj)
            assert failure is not None and failure.mode in FAILURE_MODES
            assert len(failure.evidence) <= 200
    traj = trajectory([], "stop")
    traj.steps = None  # type: ignore[assignment]
    assert FailureAnalyzer({"arith": ARITH}).classify(TASK, traj).mode == "no_answer"


def test_cluster_key_groups_by_family_sorted_skills_and_mode():
    failure = classify(*CASES["premature_answer"][:2])
    failure.skills = ["steps:2", "op:add", "parens"]
    assert cluster_key(failure) == ("arith", ("op:add", "parens", "steps:2"), "premature_answer")


# -- rules fixed against the labelled corpus ------------------------------------------------------
def echo(i: int, expression: str, observation: str, echoed: str) -> Step:
    """A call whose turn also writes a <tool_response> with `echoed` in it."""
    step = call(i, expression, observation, hallucinated=True)
    step.text += f"<tool_response>{echoed}</tool_response>"
    return step


def test_echoing_the_true_observation_is_not_the_cause():
    steps = [call(0, "3+4", "7"), echo(1, "7*5", "35", "35"), answer(2, "34")]
    assert classify(steps).mode == "wrong_answer"
    steps = [call(0, "3+4", "7"), echo(1, "7*5", "35", "36"), answer(2, "36")]
    assert (classify(steps).mode, classify(steps).first_error_step) == (
        "hallucinated_observation",
        1,
    )


def test_loop_counts_normalised_non_consecutive_repeats_beyond_the_reference():
    cycling = [call(i, e, o) for i, (e, o) in enumerate([("3+4", "7"), ("7*5", "35")] * 3)]
    failure = classify(cycling, "max_turns")
    assert (failure.mode, failure.first_error_step) == ("loop", 2)
    spaced = [call(0, "3+4", "7"), call(1, "3 + 4", "7"), call(2, " 3+4", "7")]
    assert classify(spaced, "max_turns").mode == "loop"
    # (2*2)+(2*2)+(2*2) needs 2*2 three times: doing so is the work, not a loop.
    task = ARITH.make_task({"expr": "2*2+2*2+2*2"})
    steps = [call(0, "2*2", "4"), call(1, "2*2", "4"), call(2, "2*2", "4"), call(3, "4+4", "8")]
    traj = trajectory(steps, "max_turns")
    traj.task_id = task.task_id
    assert FailureAnalyzer({"arith": ARITH}).classify(task, traj).mode == "no_answer"


def test_giving_up_in_prose_after_a_tool_failure_is_the_tool_failure():
    steps = [call(0, "3+4", "7"), failed(1, "7*5", "timeout"), Step(2, "It is down.", "text")]
    failure = classify(steps, "stop")
    assert (failure.mode, failure.first_error_step) == ("tool_error_unrecovered", 1)


def test_a_failed_call_is_recovered_only_by_the_same_call():
    steps = [failed(0, "3+4", "timeout"), call(1, "8*5", "40"), answer(2, "40")]
    assert classify(steps).mode == "tool_error_unrecovered"


def test_repeating_a_call_is_not_progress_but_obtaining_the_result_is():
    failure = classify([call(0, "3+4", "7"), call(1, "3+4", "7"), answer(2, "7")])
    assert (failure.mode, failure.first_error_step) == ("premature_answer", 2)
    failure = classify([call(0, "(3+4)*5", "35"), answer(1, "53")])
    assert (failure.mode, failure.first_error_step) == ("wrong_answer", 1)


def test_a_premature_answer_after_a_copy_error_blames_the_copy():
    # (3+4)*5: the first call copies the wrong operands (3*5, not 3+4) and the answer follows it.
    # The copy is the first error (a restart task starts right before it, not at the hopeless
    # state after it), not the answer. (All calls progress: the answer, CASES above.)
    failure = classify([call(0, "3*5", "15"), answer(1, "15")])
    assert (failure.mode, failure.first_error_step) == ("premature_answer", 0)
    assert "first error at step 0" in failure.evidence


def test_recovered_slips_do_not_move_the_first_error():
    unknown = Step(0, "", "tool_call", tool="mul", arguments={}, error_kind="unknown_tool")
    failure = classify([unknown, call(1, "3+4", "7"), call(2, "7*5", "35"), answer(3, "34")])
    assert (failure.mode, failure.first_error_step) == ("wrong_answer", 3)


# -- clusters -------------------------------------------------------------------------------------
def _failure(task: Task, mode: str, traj: str, step: int | None = 1) -> Failure:
    return Failure(traj, task.task_id, 5, mode, step, f"evidence of {traj}", task.skills, "arith")


def test_cluster_failures_rows():
    other = ARITH.make_task({"expr": "(2+9)*4"})  # same skills as TASK
    failures = [
        _failure(TASK, "wrong_answer", "t1"),
        _failure(TASK, "wrong_answer", "t2"),
        _failure(other, "wrong_answer", "t3", step=2),
        _failure(other, "wrong_answer", "t4"),
        _failure(TASK, "loop", "t5"),
    ]
    cid = cluster_id_for("arith", TASK.skills, "wrong_answer")
    history = {cid: [(1, 0.9), (2, 0.0), (3, 0.1), (4, 0.2), (7, 0.9)]}
    rows = cluster_failures(failures, 5, 40, history, exemplars=2, tasks={TASK.task_id: TASK})
    assert [r["mode"] for r in rows] == ["wrong_answer", "loop"]
    row = rows[0]
    assert set(row) == {
        "round", "cluster_id", "family", "skills", "mode", "n_failures", "share", "trend",
        "exemplar_traj_ids", "summary", "fault_type",
    }
    assert row["fault_type"] is None and "fault" not in row["summary"]  # a clean task
    assert (row["round"], row["cluster_id"], row["n_failures"]) == (5, cid, 4)
    assert row["skills"] == sorted(TASK.skills) and row["family"] == "arith"
    assert row["share"] == pytest.approx(0.1)
    # rounds 2, 3, 4 (shares 0, .1, .2) and this round (.1): slope 0.04; rounds 1 and 7 ignored
    assert row["trend"] == pytest.approx(0.04)
    assert row["exemplar_traj_ids"] == ["t1", "t3"]  # distinct tasks first
    summary = row["summary"]
    assert summary.startswith("arith | op:add, op:mul, parens, steps:2 | wrong_answer: 4 failures")
    assert "10% of rollouts, rising" in summary and "first error usually at step 1" in summary
    assert '{"expr":"(3+4)*5"}' in summary and "evidence of t1" in summary
    # A new cluster has no trend yet: None (NULL in `clusters.trend`, as docs/schema.md says).
    assert rows[1]["trend"] is None and "new" in rows[1]["summary"]
    with pytest.raises(ValueError, match="n_rollouts"):
        cluster_failures(failures, 5, 0)


def _with_skills(task: Task, *skills: str) -> Task:
    return dataclasses.replace(task, skills=sorted([*task.skills, *skills]))


def test_clusters_name_their_fault_type_and_its_total_over_clusters():
    """Fault types stay apart (the `recover:T` skill is in the cluster key), each row names its
    fault type, and its summary gives the round's total of that type, which the other skills
    split over several clusters; cluster ids are still those of (family, skills, mode)."""
    timeout = _with_skills(TASK, "recover:timeout")
    timeout_other = _with_skills(ARITH.make_task({"expr": "2+9"}), "recover:timeout")
    renamed = _with_skills(TASK, "recover:renamed")
    failures = [
        _failure(timeout, "tool_error_unrecovered", "t1"),
        _failure(timeout, "tool_error_unrecovered", "t2"),
        _failure(timeout_other, "tool_error_unrecovered", "t3"),
        _failure(renamed, "tool_error_unrecovered", "t4"),
        _failure(TASK, "tool_error_unrecovered", "t5"),
    ]
    rows = {r["cluster_id"]: r for r in cluster_failures(failures, 5, 40)}
    assert len(rows) == 4
    by_task = {cluster_id_for("arith", t.skills, "tool_error_unrecovered"): t
               for t in (timeout, timeout_other, renamed, TASK)}
    assert set(rows) == set(by_task)  # ids unchanged: (family, sorted skills, mode)
    assert {cid: r["fault_type"] for cid, r in rows.items()} == {
        cid: fault_type_of(t.skills) for cid, t in by_task.items()}
    assert sorted(str(r["fault_type"]) for r in rows.values()) == [
        "None", "renamed", "timeout", "timeout"]
    for row in rows.values():
        fault = row["fault_type"]
        if fault == "timeout":  # 2 + 1 failures of timeout tasks, in 2 clusters
            assert "fault timeout: 3 failures of this fault type this round, in 2 clusters" \
                in row["summary"], row["summary"]
        elif fault == "renamed":
            assert "fault renamed: 1 failures of this fault type this round, in 1 clusters" \
                in row["summary"], row["summary"]
        else:
            assert "fault" not in row["summary"]


def test_fault_type_of_skills():
    assert fault_type_of(["op:add", "recover:timeout", "steps:2"]) == "timeout"
    assert fault_type_of(["tool:lookup", "recover:tool_error"]) == "tool_error"
    assert fault_type_of(["recover:timeout", "recover:notation"]) == "notation+timeout"
    assert fault_type_of(["op:add", "recover:"]) is None  # a bare prefix is no type
    assert fault_type_of(["recover:", "recover:timeout"]) == "timeout"
    assert fault_type_of(None) is None


@pytest.mark.parametrize("mode", ["unknown_tool", "bad_arguments", "tool_error_unrecovered"])
def test_fault_task_evidence_names_the_fault_type(mode):
    steps, finish_reason, first = CASES[mode]
    task = _with_skills(TASK, "recover:renamed")
    failure = FailureAnalyzer({"arith": ARITH}).classify(task, trajectory(steps, finish_reason))
    assert (failure.mode, failure.first_error_step) == (mode, first)
    clean = classify(steps, finish_reason)
    assert failure.evidence == f"fault renamed: {clean.evidence}"
    assert not clean.evidence.startswith("fault")


def test_other_modes_of_a_fault_task_keep_their_evidence():
    steps, finish_reason, _ = CASES["wrong_answer"]
    task = _with_skills(TASK, "recover:timeout")
    failure = FailureAnalyzer({"arith": ARITH}).classify(task, trajectory(steps, finish_reason))
    assert failure.mode == "wrong_answer"
    assert failure.evidence == classify(steps, finish_reason).evidence


def test_share_trend():
    assert share_trend([(1, 0.3), (2, 0.2), (3, 0.1)]) == pytest.approx(-0.1)
    assert share_trend([(2, 0.3), (2, 0.1)]) is None


# -- the priority order and the recovery rules, one pinned case each ------------------------------
def lookup(i: int, key: str, observation: str) -> Step:
    """A successful call to another tool than the calculator."""
    return Step(i, "", "tool_call", tool="lookup", arguments={"key": key}, observation=observation)


def test_loop_outranks_an_unrecovered_tool_error():
    # Both detectors fire: 3+4 is made three times (the reference needs it once) and 7*5 timed
    # out and was never retried. The docstring's order (5. loop before 6.
    # tool_error_unrecovered) names the loop, at its first pointless repeat.
    steps = [call(0, "3+4", "7"), call(1, "3+4", "7"), call(2, "3+4", "7"),
             failed(3, "7*5", "timeout"), answer(4, "36")]
    failure = classify(steps)
    assert (failure.mode, failure.first_error_step) == ("loop", 1)
    # Without the repeats the same episode is the tool error: the case really has both causes.
    failure = classify([call(0, "3+4", "7"), failed(1, "7*5", "timeout"), answer(2, "36")])
    assert (failure.mode, failure.first_error_step) == ("tool_error_unrecovered", 1)


def test_bad_arguments_are_recovered_only_by_the_same_tool():
    # A bad calculator call followed by a successful call to *another* tool: not recovered.
    steps = [call(0, "3+4", "7"), failed(1, "7*", "bad_arguments"), lookup(2, "x", "5"),
             answer(3, "35")]
    failure = classify(steps)
    assert (failure.mode, failure.first_error_step) == ("bad_arguments", 1)
    # A later successful calculator call, even with other arguments, is the recovery.
    steps = [call(0, "3+4", "7"), failed(1, "7*", "bad_arguments"), call(2, "7*5", "35"),
             answer(3, "34")]
    assert classify(steps).mode == "wrong_answer"


def test_unknown_tool_is_recovered_by_any_later_successful_call():
    unknown = Step(1, "", "tool_call", tool="mul", arguments={}, error_kind="unknown_tool")
    failure = classify([call(0, "3+4", "7"), unknown, answer(2, "36")])
    assert (failure.mode, failure.first_error_step) == ("unknown_tool", 1)
    failure = classify([call(0, "3+4", "7"), unknown, lookup(2, "x", "5"), answer(3, "36")])
    assert failure.mode != "unknown_tool"


def test_analyze_classifies_failed_rollouts_and_remembers_shares_for_the_trend():
    """`analyze` is one round: failures of the failed rollouts (successes skipped), clusters
    with shares over all rollouts, and a trend from the rounds this analyzer saw; `remember`
    gives a resumed analyzer the same history."""
    wrong = [call(0, "3+4", "7"), call(1, "7*5", "35"), answer(2, "36")]
    right = [call(0, "3+4", "7"), call(1, "7*5", "35"), answer(2, "35")]
    tasks = {TASK.task_id: TASK}

    def round_of(n_wrong: int, n: int) -> list[Trajectory]:
        return [trajectory(wrong) for _ in range(n_wrong)] + [
            trajectory(right, success=True) for _ in range(n - n_wrong)]

    analyzer = FailureAnalyzer({"arith": ARITH})
    failures, clusters = analyzer.analyze(round_of(2, 4), tasks, round=1)
    assert [f.mode for f in failures] == ["wrong_answer", "wrong_answer"]
    assert len(clusters) == 1 and clusters[0]["share"] == 0.5 and clusters[0]["trend"] is None
    _, clusters = analyzer.analyze(round_of(1, 4), tasks, round=2)
    assert clusters[0]["share"] == 0.25 and clusters[0]["trend"] == pytest.approx(-0.25)
    resumed = FailureAnalyzer({"arith": ARITH})
    resumed.remember([(clusters[0]["cluster_id"], 1, 0.5)])
    assert resumed.analyze(round_of(1, 4), tasks, round=2)[1][0]["trend"] == pytest.approx(-0.25)
    assert analyzer.analyze([], tasks, round=3) == ([], [])


def test_no_answer_after_obtaining_the_result_points_at_the_next_step():
    # 7*5 gave 35 at step 1, the answer; it should have answered at step 2, not called again.
    steps = [call(0, "3+4", "7"), call(1, "7*5", "35"), call(2, "35*1", "35")]
    failure = classify(steps, "max_turns")
    assert (failure.mode, failure.first_error_step) == ("no_answer", 2)


def test_an_unclosed_invented_response_is_a_hallucination_even_beside_a_true_echo():
    # The turn echoes the real 35, then opens a <tool_response> of its own that never closes.
    step = call(1, "7*5", "35", hallucinated=True)
    step.text += "<tool_response>35</tool_response><tool_response>36"
    failure = classify([call(0, "3+4", "7"), step, answer(2, "36")])
    assert (failure.mode, failure.first_error_step) == ("hallucinated_observation", 1)


def test_a_parse_error_is_ill_formed_whatever_kind_the_step_claims():
    # Steps read back from the store or another trainer's rollouts may carry both.
    bad = Step(1, "<tool_call>{7*5", "tool_call", tool="calculator", error="invalid JSON",
               error_kind="parse")
    failure = classify([call(0, "3+4", "7"), bad], "max_turns")
    assert (failure.mode, failure.first_error_step) == ("format_error", 1)
