"""Fuzzing the path from model output to failure mode.

Garbage assistant turns (broken JSON, unclosed and nested tags, huge and deeply nested
arguments, JSON escapes that decode to lone surrogates or NUL, RTL marks, many calls, every
`<answer>` variant) and raw random token ids go through `Episode.add_policy_turn` (encoded with
the tiny policy's tokenizer, cut to the turn budget as a rollout backend would), then
`sentinel.rewards.score` and `FailureAnalyzer.classify`. None of them may raise; the
trajectory must stay consistent (ids, mask and log-probs aligned; reward terms in [0, 1]); and
every failed trajectory must land in exactly one mode of `FAILURE_MODES`.

Hypothesis runs derandomized with bounded `max_examples`, so CI sees the same inputs each time
and the file stays within ~20 s; raise `FUZZ_EXAMPLES` locally for a longer hunt.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.analyzer import FailureAnalyzer
from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig, Episode, FaultConfig
from sentinel.env.parser import HermesParser, format_answer, format_call
from sentinel.policy import build_tokenizer
from sentinel.rewards import RewardConfig, score
from sentinel.tasks import load_family
from sentinel.types import FAILURE_MODES, Task

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

CHAT = ChatFormat(build_tokenizer())
FAMILY = load_family("arith")
TASK: Task = FAMILY.make_task({"expr": "(3+4)*5"})
ANALYZER = FailureAnalyzer({"arith": FAMILY})
REWARD = RewardConfig()
ENV_CONFIGS = [
    EnvConfig(max_turns=6, max_tokens=512, max_turn_tokens=64),
    EnvConfig(max_turns=12, max_tokens=1 << 16, max_turn_tokens=1 << 14,
              faults=FaultConfig(rate=0.3)),
]

# -- strategies --------------------------------------------------------------------------------

TAGS = ["<tool_call>", "</tool_call>", "<answer>", "</answer>", "<tool_response>",
        "</tool_response>", "<|im_end|>", "<|im_start|>", "<|pad|>", "<tool_call><tool_call>",
        "<answer><answer>", "</answer></answer>", "<ANSWER>", "< answer>", "<answer/>"]
ODD_TEXT = ["\u202e", "\u200f", "\u0000", "\\u0000", "\\ud800", "\\udfff\\ud800", "\ufeff",
            "é", "𝟘", "\n", "\t", '"', "\\", "{", "}", "[", "]", ":", ","]
TOOL_NAMES = ["calculator", "python", "lookup", "", "Calculator", "x" * 300, "calculator\u0000",
              "<tool_call>"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=4),
    max_leaves=12,
)
expressions = st.one_of(
    st.sampled_from(["3+4", "7*5", "(3+4)*5", "1/0", "2**3", "", " ", "-", "((1)", "1e309",
                     "9" * 400, "1" + "+1" * 2000, "(" * 3000 + "1" + ")" * 3000,
                     "-" * 3000 + "1", "<tool_call>1+1</tool_call>", "\u202e3+4"]),
    st.text(alphabet="0123456789+-*/() ", max_size=40),
)


@st.composite
def calls(draw: st.DrawFn) -> str:
    """A tool call: mostly well-formed JSON with odd names/arguments, sometimes mangled."""
    name = draw(st.sampled_from(TOOL_NAMES) | st.text(max_size=12))
    arguments: Any = draw(st.one_of(
        st.fixed_dictionaries({"expression": expressions}),
        st.fixed_dictionaries({"code": st.sampled_from(["print(1)", "while True: pass"])}),
        st.dictionaries(st.text(max_size=10), json_values, max_size=3),
        json_values,
    ))
    body = json.dumps({"name": name, "arguments": arguments})
    mangle = draw(st.sampled_from(["none", "none", "cut", "string-args", "escape", "nest"]))
    if mangle == "cut":
        body = body[: draw(st.integers(0, len(body)))]
    elif mangle == "string-args":
        body = json.dumps({"name": name, "arguments": json.dumps(arguments)})
    elif mangle == "escape":  # JSON escapes that decode to lone surrogates, NUL, RTL
        escape = draw(st.sampled_from(["\\ud800", "\\udfff", "\\u0000", "\\u202e"]))
        body = body.replace('": "', '": "' + escape, draw(st.integers(1, 3)))
    elif mangle == "nest":
        body = body.replace("+", format_call("calculator", {"expression": "1+1"}), 1)
    return f"<tool_call>{body}</tool_call>"


fragments = st.one_of(
    calls(),
    st.sampled_from(TAGS),
    st.sampled_from(ODD_TEXT),
    st.text(max_size=30),
    st.builds(format_answer, st.sampled_from(["35", " 35 ", "", "34", "35\u0000", "<answer>35"])),
    st.builds(lambda c, n: c * n, st.sampled_from([format_call("calculator",
                                                               {"expression": "3+4"})]),
              st.integers(2, 40)),
)
turn_texts = st.lists(fragments, min_size=0, max_size=6).map("".join)


# -- the property ------------------------------------------------------------------------------


def _check_pipeline(turns: list[tuple[list[int], bool]], config: EnvConfig, seed: int) -> None:
    """Run turns of ids through an episode, the reward and the analyzer; check the contract."""
    episode = Episode(TASK, FAMILY.tool_map(), CHAT, HermesParser(), config, random.Random(seed))
    for ids, eos in turns:
        if episode.done:
            break
        budget = episode.turn_budget()
        ids = [*ids[: budget - 1], CHAT.eos_token_id] if eos else ids[:budget]
        episode.add_policy_turn(ids, [-1.0] * len(ids))
    trajectory = episode.trajectory()
    assert len(trajectory.token_ids) == len(trajectory.loss_mask) == len(trajectory.logprobs)
    assert all(s.index == i for i, s in enumerate(trajectory.steps))
    reward, terms, success = score(TASK, trajectory, FAMILY, REWARD)
    assert all(0.0 <= v <= 1.0 for v in terms.values())
    assert 0.0 <= reward <= REWARD.w_outcome + REWARD.w_format + REWARD.w_process
    trajectory.reward, trajectory.reward_terms, trajectory.success = reward, terms, success
    failure = ANALYZER.classify(TASK, trajectory)
    if success:
        assert failure is None
    else:
        assert failure is not None and failure.mode in FAILURE_MODES
        assert failure.first_error_step is None or isinstance(failure.first_error_step, int)
    rows = [trajectory.to_row(), *(s.to_row(trajectory.traj_id) for s in trajectory.steps)]
    if failure is not None:
        rows.append(failure.to_row())
    for row in rows:  # storable: the store (DuckDB, Arrow) refuses lone surrogates
        json.dumps(row, ensure_ascii=False).encode("utf-8")


@FUZZ
@given(texts=st.lists(st.tuples(turn_texts, st.booleans()), min_size=1, max_size=8),
       config=st.sampled_from(ENV_CONFIGS), seed=st.integers(0, 3))
def test_garbage_text_never_crashes(texts: list[tuple[str, bool]], config: EnvConfig,
                                    seed: int) -> None:
    _check_pipeline([(CHAT.encode(t), eos) for t, eos in texts], config, seed)


@FUZZ
@given(turns=st.lists(st.lists(calls(), min_size=1, max_size=3).map("".join), min_size=1,
                      max_size=6))
def test_odd_tool_calls_never_crash(turns: list[str]) -> None:
    """Only calls, with room for all of them, so every call reaches the parser and the tools."""
    _check_pipeline([(CHAT.encode(t), True) for t in turns], ENV_CONFIGS[1], 0)


@FUZZ
@given(turns=st.lists(st.tuples(st.lists(st.integers(0, len(CHAT.tokenizer) - 1), max_size=80),
                                st.booleans()), min_size=1, max_size=6),
       config=st.sampled_from(ENV_CONFIGS))
def test_random_token_ids_never_crash(turns: list[tuple[list[int], bool]],
                                      config: EnvConfig) -> None:
    _check_pipeline(turns, config, 0)


@FUZZ
@given(text=st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=200)
       | turn_texts.map(lambda t: t + "\ud800<answer>\udfff</answer>"))
def test_parser_takes_any_string(text: str) -> None:
    """Surrogates cannot come out of a tokenizer, but a parser is also called on plain text."""
    turn = HermesParser().parse(text)
    assert turn.answer is None or isinstance(turn.answer, str)
    assert len(turn.calls) <= 8


@pytest.mark.parametrize("text", [
    "<tool_call>" + json.dumps({"name": "calculator",
                                "arguments": {"expression": "(" * 5000 + "1" + ")" * 5000}})
    + "</tool_call>",
    "<tool_call>" + "[" * 100_000 + "</tool_call>",
    "<tool_call>" + json.dumps({"name": "calculator", "arguments": "[" * 100_000}) + "</tool_call>",
    "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": "\ud800"}})
    + "</tool_call>",
    "<tool_call>" + json.dumps({"name": "calc\udfff", "arguments": {}}) + "</tool_call>",
    "<tool_call>" + json.dumps({"name": "calculator", "arguments": "{\"x\": \"\\ud800\"}"})
    + "</tool_call>",
    format_call("calculator", {"expression": "3+4"}) * 200 + format_answer("35"),
    "<answer>" * 1000 + "35" + "</answer>" * 1000,
])
def test_known_nasty_turns(text: str) -> None:
    """Hand-picked worst cases, with a budget large enough that nothing is cut."""
    big = EnvConfig(max_turns=4, max_tokens=1 << 22, max_turn_tokens=1 << 21)
    _check_pipeline([(CHAT.encode(text), True), (CHAT.encode(format_answer("35")), True)],
                    big, 0)
