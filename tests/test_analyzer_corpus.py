"""The analyzer against a hand-labelled corpus of failed episodes (tests/data/failure_corpus.jsonl,
built by tests/data/build_corpus.py, which says how the cases and labels were made).

Per-mode precision and recall must be at least 0.95 and the first erroneous step must agree on at
least 0.95 of the cases; the table is printed (`pytest -s` shows it).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sentinel.analyzer import FailureAnalyzer
from sentinel.env.chat import ChatFormat
from sentinel.policy import build_tokenizer
from sentinel.tasks import load_family
from sentinel.types import FAILURE_MODES, Step, Trajectory
from tests.data.build_corpus import replay_case

CORPUS = Path(__file__).parent / "data" / "failure_corpus.jsonl"
ARITH = load_family("arith")
MIN_SCORE = 0.95
MIN_PER_MODE = 5


def load_corpus() -> list[dict[str, Any]]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def classify(case: dict[str, Any]):
    task = ARITH.make_task(case["task"]["spec"])
    traj = Trajectory(
        task_id=task.task_id, messages=[], token_ids=[], loss_mask=[], logprobs=[],
        steps=[Step(**s) for s in case["steps"]], finish_reason=case["finish_reason"],
        answer=case["answer"], success=False,
    )
    return FailureAnalyzer({"arith": ARITH}).classify(task, traj)


def scores(cases: list[dict[str, Any]]) -> tuple[dict[str, tuple[float, float, int]], float, str]:
    """Per mode (precision, recall, support), first-error-step agreement, and the table."""
    pairs = [(c["mode"], classify(c)) for c in cases]
    predicted = Counter(f.mode for _, f in pairs)
    truth = Counter(m for m, _ in pairs)
    hits = Counter(m for m, f in pairs if f.mode == m)
    table = [f"{'mode':<26}{'precision':>10}{'recall':>8}{'n':>4}"]
    result = {}
    for mode in FAILURE_MODES:
        precision = hits[mode] / predicted[mode] if predicted[mode] else 0.0
        recall = hits[mode] / truth[mode] if truth[mode] else 0.0
        result[mode] = (precision, recall, truth[mode])
        table.append(f"{mode:<26}{precision:>10.2f}{recall:>8.2f}{truth[mode]:>4}")
    steps_ok = sum(f.first_error_step == c["first_error_step"] for c, (_, f) in zip(
        cases, pairs, strict=True))
    table.append(f"first_error_step agreement {steps_ok}/{len(cases)}")
    misses = [f"  {c['id']}: labelled {c['mode']}@{c['first_error_step']}, "
              f"got {f.mode}@{f.first_error_step} ({f.evidence})"
              for c, (_, f) in zip(cases, pairs, strict=True)
              if (f.mode, f.first_error_step) != (c["mode"], c["first_error_step"])]
    return result, steps_ok / len(cases), "\n".join(table + misses)


def test_corpus_covers_every_mode():
    cases = load_corpus()
    assert len(cases) >= 60
    assert len({c["id"] for c in cases}) == len(cases)
    support = Counter(c["mode"] for c in cases)
    assert set(support) == set(FAILURE_MODES)
    assert min(support.values()) >= MIN_PER_MODE, support


def test_per_mode_precision_and_recall():
    result, step_agreement, table = scores(load_corpus())
    print("\n" + table)
    weak = {m: pr for m, pr in result.items() if min(pr[:2]) < MIN_SCORE}
    assert not weak, table
    assert step_agreement >= MIN_SCORE, table


def test_scores_can_fail():
    """Relabelling a few cases must break the bar: the measure is not vacuous."""
    cases = load_corpus()
    for case in cases[:3]:
        case["mode"] = "loop" if case["mode"] != "loop" else "no_answer"
    result, _, _ = scores(cases)
    assert min(min(pr[:2]) for pr in result.values()) < MIN_SCORE


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(build_tokenizer())


def test_corpus_is_what_the_environment_produces(chat: ChatFormat):
    """The stored steps are still what replaying the turns through the real environment gives."""
    for case in load_corpus():
        replayed = replay_case(case, chat)
        assert replayed["success"] is False, case["id"]
        for key in ("finish_reason", "answer", "steps"):
            assert replayed[key] == case[key], (case["id"], key)


@pytest.mark.parametrize("case_id", ["wrong-copy-equals-intermediate",
                                     "wrong-miscopied-operand-same-result"])
def test_a_copy_error_whose_result_is_an_intermediate_value_is_the_first_error(case_id):
    """Issue #20: `18-(3+11)` → `3+11`, `1*14`, answer 14 — the copy error `1*14` is the first
    wrong step although its result equals an intermediate value by chance."""
    case = next(c for c in load_corpus() if c["id"] == case_id)
    failure = classify(case)
    assert (failure.mode, failure.first_error_step) == ("wrong_answer", 1)
