"""The `reasoning_gym` family: specs name reproducible items, the dataset's own scorer decides
(only 1.0 passes), difficulty edits follow the dataset's curriculum, tools are optional."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from sentinel.env.tools import Calculator
from sentinel.tasks import SpecError, load_family
from sentinel.tasks.reasoning_gym import ReasoningGymConfig, ReasoningGymFamily

pytest.importorskip("reasoning_gym")


def _family(*datasets: tuple[str, dict], **config: object) -> ReasoningGymFamily:
    fam = load_family("reasoning_gym", {
        "datasets": [{"name": n, "config": c} for n, c in datasets], **config})
    assert isinstance(fam, ReasoningGymFamily)
    return fam


def test_spec_names_a_reproducible_item() -> None:
    from reasoning_gym.factory import create_dataset

    fam = _family(("chain_sum", {"max_terms": 2}))
    spec = {"dataset": "chain_sum", "config": {"max_terms": 2}, "seed": 11, "index": 3}
    task = fam.make_task(spec)
    item = create_dataset("chain_sum", seed=11, size=10, max_terms=2)[3]
    assert task.prompt[-1]["content"] == item["question"]
    assert task.answer == item["answer"]
    assert task.skills == ["dataset:chain_sum"]
    assert fam.make_task(dict(spec)).task_id == task.task_id
    assert fam.make_task({**spec, "seed": 12}).task_id != task.task_id
    solution = fam.solve(spec, fam.tool_map(spec))
    assert solution.calls == []
    assert solution.assistant_turns() == [f"<answer>{task.answer}</answer>"]


def test_only_a_full_score_passes() -> None:
    fam = _family(("countdown", {"max_numbers": 4}))
    task = fam.sample_task(random.Random(0))
    assert fam.verify(task, fam.solve(task.spec, {}).answer)
    # countdown gives 0.01 to a well-formed wrong expression; that is not success
    from sentinel.tasks.reasoning_gym import _score

    assert 0 < _score(task.spec, "1+1") < 1.0
    assert not fam.verify(task, "1+1")
    assert not fam.verify(task, None)


def test_sampling_mixes_datasets_by_weight() -> None:
    fam = load_family("reasoning_gym", {"datasets": [
        {"name": "chain_sum", "weight": 3.0}, {"name": "leg_counting", "weight": 1.0}]})
    rng = random.Random(0)
    names = [fam.sample_spec(rng)["dataset"] for _ in range(40)]
    assert set(names) == {"chain_sum", "leg_counting"}
    assert names.count("chain_sum") > names.count("leg_counting")


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"dataset": "nope", "config": {}, "seed": 1, "index": 0}, "unknown reasoning-gym"),
        ({"dataset": "chain_sum", "config": {"bogus": 1}, "seed": 1, "index": 0}, "refuses"),
        ({"dataset": "chain_sum", "config": {"min_terms": 5, "max_terms": 2}, "seed": 1,
          "index": 0}, "refuses"),
        ({"dataset": "chain_sum", "config": {"seed": 3}, "seed": 1, "index": 0}, "must not set"),
        ({"dataset": "chain_sum", "config": {}, "seed": 1, "index": 999}, "index must be"),
        ({"dataset": "chain_sum", "config": {}, "seed": 1}, "spec must be"),
        ({"dataset": "chain_sum", "config": {}, "seed": True, "index": 0}, "spec must be"),
    ],
)
def test_validate_spec_rejects(spec: object, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        _family(("chain_sum", {})).validate_spec(spec)


def test_escalate_follows_the_curriculum() -> None:
    fam = _family(("chain_sum", {"max_terms": 2, "max_digits": 1}))
    spec = fam.sample_spec(random.Random(0))
    harder = fam.escalate(spec, random.Random(5))
    assert harder is not None and harder["seed"] != spec["seed"]
    bumped = {k: v for k, v in harder["config"].items() if spec["config"].get(k) != v}
    assert bumped in ({"max_terms": 3}, {"max_digits": 2})
    assert fam.difficulty(harder) == fam.difficulty(spec) + 1
    top = fam.validate_spec({**spec, "config": {"max_terms": 12, "max_digits": 10}})
    assert fam.escalate(top, random.Random(0)) is None
    no_curriculum = _family(("gsm_symbolic", {}))
    assert no_curriculum.escalate(no_curriculum.sample_spec(random.Random(0)),
                                  random.Random(0)) is None
    assert fam.decompose(spec, 0) is None
    perturbed = fam.perturb(spec, random.Random(1))
    assert perturbed["config"] == spec["config"] and perturbed["seed"] != spec["seed"]


def test_tools_are_optional() -> None:
    fam = _family(("basic_arithmetic", {}), tools=["calculator"])
    assert isinstance(fam.tool_map()["calculator"], Calculator)
    assert "tool:calculator" in fam.make_task(fam.sample_spec(random.Random(0))).skills
    assert _family(("basic_arithmetic", {})).tool_map() == {}
    with pytest.raises(ValidationError, match="unknown tool 'shell'"):
        ReasoningGymConfig(tools=["shell"])
    with pytest.raises(ValidationError, match="at least one dataset"):
        ReasoningGymConfig(datasets=[])


def test_python_tool_when_available() -> None:
    from sentinel.env import tools

    if not hasattr(tools, "Python"):
        with pytest.raises(ValidationError, match="python tool is not available"):
            ReasoningGymConfig(tools=["python"])
        return
    fam = _family(("basic_arithmetic", {}), tools=["python"])
    assert set(fam.tool_map()) == {"python"}


def test_garbage_answers_score_zero_without_raising() -> None:
    for name in ("chain_sum", "countdown", "basic_arithmetic", "gsm_symbolic", "leg_counting",
                 "word_sorting"):
        fam = _family((name, {}))
        task = fam.sample_task(random.Random(1))
        for garbage in ("", "((", "\n", "<answer>", "1e999", "NaN"):
            assert not fam.verify(task, garbage), (name, garbage)
