"""The tool-call parser, the chat framing and the multi-turn environment, with the real tiny
tokenizer and the real calculator."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from sentinel.env.chat import ChatFormat
from sentinel.env.environment import (
    EnvConfig,
    Episode,
    FaultConfig,
    replay,
)
from sentinel.env.parser import (
    MAX_CALLS_PER_TURN,
    HermesParser,
    format_answer,
    format_call,
)
from sentinel.env.tools import tool_schema
from sentinel.tasks.arith import ArithFamily
from sentinel.types import Task

CALL_7 = format_call("calculator", {"expression": "3+4"})

# -- parser ------------------------------------------------------------------------------------


def test_parse_hermes_call(parser: HermesParser) -> None:
    turn = parser.parse(f"Let me compute.\n{CALL_7}")
    assert turn.format_error is None and turn.answer is None and not turn.hallucinated
    assert len(turn.calls) == 1
    call = turn.calls[0]
    assert (call.name, call.arguments, call.error) == ("calculator", {"expression": "3+4"}, None)


def test_parse_arguments_as_json_string(parser: HermesParser) -> None:
    body = json.dumps({"name": "calculator", "arguments": json.dumps({"expression": "1+2"})})
    (call,) = parser.parse(f"<tool_call>{body}</tool_call>").calls
    assert call.error is None
    assert call.arguments == {"expression": "1+2"}


def test_parse_missing_arguments_is_empty_dict(parser: HermesParser) -> None:
    (call,) = parser.parse('<tool_call>{"name": "calculator"}</tool_call>').calls
    assert (call.name, call.arguments, call.error) == ("calculator", {}, None)


@pytest.mark.parametrize(
    ("body", "name", "fragment"),
    [
        ('{"name": calculator}', None, "invalid JSON"),
        ("", None, "invalid JSON"),
        ("[1, 2]", None, "must be a JSON object"),
        ('"calculator"', None, "must be a JSON object"),
        ('{"arguments": {"expression": "1"}}', None, "no string 'name'"),
        ('{"name": 3, "arguments": {}}', None, "no string 'name'"),
        ('{"name": "", "arguments": {}}', None, "no string 'name'"),
        ('{"name": "calculator", "arguments": "not json"}', "calculator", "not a JSON object"),
        ('{"name": "calculator", "arguments": [1]}', "calculator", "not a JSON object"),
        ('{"name": "calculator", "arguments": null}', "calculator", "not a JSON object"),
    ],
)
def test_parse_bad_calls(parser: HermesParser, body: str, name: str | None, fragment: str) -> None:
    turn = parser.parse(f"<tool_call>{body}</tool_call>")
    assert turn.format_error is None
    (call,) = turn.calls
    assert call.name == name
    assert call.arguments is None
    assert call.error is not None and fragment in call.error
    assert call.raw == body.strip()


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "calculator"}',
        '{"name": "calculator"}</tool_call>',
        f"{CALL_7}<tool_call>",
        f"<tool_call>{CALL_7}",
    ],
)
def test_parse_unbalanced_tags(parser: HermesParser, text: str) -> None:
    assert parser.parse(text).format_error == "unbalanced <tool_call> tags"


def test_parse_answer(parser: HermesParser) -> None:
    turn = parser.parse("The result is <answer> 42 </answer>")
    assert turn.answer == "42" and turn.calls == [] and turn.format_error is None
    assert parser.parse("<answer>1</answer> no, <answer>2</answer>").answer == "2"
    assert parser.parse("just text").answer is None
    unclosed = parser.parse("<answer>42")
    assert unclosed.answer is None and unclosed.format_error == "unclosed <answer> tag"


def test_parse_hallucinated_observation(parser: HermesParser) -> None:
    assert parser.parse(f"{CALL_7}<tool_response>7</tool_response>").hallucinated
    assert parser.parse("</tool_response>").hallucinated
    assert not parser.parse(CALL_7).hallucinated


def test_parse_caps_calls_per_turn(parser: HermesParser) -> None:
    turn = parser.parse(CALL_7 * (MAX_CALLS_PER_TURN + 3))
    assert len(turn.calls) == MAX_CALLS_PER_TURN
    assert turn.format_error is None


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("calculator", {"expression": "12*(3+4)"}),
        ("lookup", {"entity": 'Ada "the" Count', "attribute": "born"}),
        ("python", {"code": "print('é\\n')"}),
        ("calculator", {}),
    ],
)
def test_format_call_round_trips(parser: HermesParser, name: str, arguments: dict) -> None:
    text = format_call(name, arguments)
    (call,) = parser.parse(text).calls
    assert (call.name, call.arguments, call.error) == (name, arguments, None)
    assert parser.parse(format_answer("17")).answer == "17"


# -- environment -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def task(arith: ArithFamily) -> Task:
    return arith.make_task({"expr": "(3+4)*5"})


def _episode(task: Task, arith: ArithFamily, chat: ChatFormat, seed: int = 0,
             **config: Any) -> Episode:
    return Episode(task, arith.tool_map(), chat, HermesParser(), EnvConfig(**config),
                   random.Random(seed))


def _schemas(arith: ArithFamily) -> list[dict]:
    return [tool_schema(t) for t in arith.tools()]


def _policy_runs(token_ids: list[int], mask: list[int]) -> list[list[int]]:
    """Maximal runs of mask-1 tokens."""
    runs: list[list[int]] = []
    prev = 0
    for tok, m in zip(token_ids, mask, strict=True):
        if m and not prev:
            runs.append([])
        if m:
            runs[-1].append(tok)
        prev = m
    return runs


def test_replay_reference_solution(task: Task, arith: ArithFamily, chat: ChatFormat) -> None:
    solution = arith.solve(task.spec, arith.tool_map())
    turns = solution.assistant_turns()
    traj = replay(task, turns, arith.tool_map(), chat, HermesParser(), EnvConfig())

    assert traj.finish_reason == "answer"
    assert traj.answer == "35" and arith.verify(task, traj.answer)
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)
    assert set(traj.loss_mask) == {0, 1}

    # the prompt is exactly the rendered prompt, all mask 0
    prompt = chat.prompt_ids(task.prompt, _schemas(arith))
    assert traj.prompt_len == len(prompt)
    assert traj.token_ids[: traj.prompt_len] == prompt
    assert traj.loss_mask[: traj.prompt_len] == [0] * len(prompt)

    # mask 1 is exactly the assistant turns, each followed by eos
    runs = _policy_runs(traj.token_ids, traj.loss_mask)
    assert runs == [chat.assistant_ids(t) for t in turns]
    assert [chat.decode(r) for r in runs] == [t + chat.eos_token for t in turns]
    assert traj.n_policy_tokens == sum(len(chat.assistant_ids(t)) for t in turns)
    assert traj.token_ids[-1] == chat.eos_token_id and traj.loss_mask[-1] == 1

    # everything with mask 0 after the prompt is observation framing
    obs_text = chat.decode([t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True)
                            if not m][traj.prompt_len:])
    assert "<tool_response>7</tool_response>" in obs_text
    assert "<tool_response>35</tool_response>" in obs_text
    assert "<tool_call>" not in obs_text

    # the whole token sequence is the chat template's rendering of the conversation
    full = chat.render(traj.messages, _schemas(arith), add_generation_prompt=False)
    assert chat.decode(traj.token_ids) == full

    assert [s.kind for s in traj.steps] == ["tool_call", "tool_call", "answer"]
    assert [s.observation for s in traj.steps[:2]] == ["7", "35"]
    assert [m["role"] for m in traj.messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "assistant"]


def test_replay_ignores_faults(task: Task, arith: ArithFamily, chat: ChatFormat) -> None:
    turns = arith.solve(task.spec, arith.tool_map()).assistant_turns()
    faulty = EnvConfig(faults=FaultConfig(rate=1.0), max_turns=1, max_tokens=16)
    traj = replay(task, turns, arith.tool_map(), chat, HermesParser(), faulty)
    assert traj.finish_reason == "answer" and traj.answer == "35"
    assert all(s.error is None for s in traj.steps)


def test_add_policy_turn_keeps_ids_verbatim(task: Task, arith: ArithFamily,
                                            chat: ChatFormat) -> None:
    canonical = chat.encode(CALL_7)
    calc_id = chat.tokenizer.convert_tokens_to_ids("calculator")
    assert calc_id in canonical  # "calculator" is one structural token...
    spelled = [chat.tokenizer.convert_tokens_to_ids(c) for c in "calculator"]
    i = canonical.index(calc_id)
    ids = [*canonical[:i], *spelled, *canonical[i + 1:], chat.eos_token_id]  # ...spelled out here
    assert ids[:-1] != canonical and chat.decode(ids[:-1]) == CALL_7

    ep = _episode(task, arith, chat)
    start = len(ep.token_ids)
    logprobs = [-0.5 - k / 100 for k in range(len(ids))]
    ep.add_policy_turn(ids, logprobs)
    assert ep.token_ids[start:start + len(ids)] == ids
    assert ep.logprobs[start:start + len(ids)] == logprobs
    assert ep.loss_mask[start:start + len(ids)] == [1] * len(ids)
    assert set(ep.loss_mask[start + len(ids):]) == {0}
    assert set(ep.logprobs[start + len(ids):]) == {0.0}
    assert ep.steps[0].kind == "tool_call" and ep.steps[0].observation == "7"
    assert not ep.done
    assert ep.messages[-2] == {"role": "assistant", "content": CALL_7}
    assert ep.messages[-1] == {"role": "tool", "content": "7"}


def _turn(ep: Episode, text: str, eos: bool = True) -> None:
    ids = ep.chat.encode(text) + ([ep.chat.eos_token_id] if eos else [])
    ep.add_policy_turn(ids, [0.0] * len(ids))


def test_malformed_call_gets_error_and_episode_continues(task: Task, arith: ArithFamily,
                                                         chat: ChatFormat) -> None:
    ep = _episode(task, arith, chat)
    _turn(ep, '<tool_call>{"name": calculator}</tool_call>')
    (step,) = ep.steps
    assert step.kind == "malformed" and step.error_kind == "parse"
    assert step.observation is not None and step.observation.startswith("Error: invalid JSON")
    assert not ep.done
    assert ep.messages[-1] == {"role": "tool", "content": step.observation}
    assert chat.decode(ep.token_ids).endswith(
        f"<tool_response>{step.observation}</tool_response><|im_start|>assistant\n")
    _turn(ep, CALL_7)
    assert ep.steps[1].kind == "tool_call" and ep.steps[1].observation == "7"
    assert ep.steps[1].index == 1
    _turn(ep, "<answer>35</answer>")
    assert ep.done and ep.finish_reason == "answer" and ep.answer == "35"


def test_unbalanced_tags_are_malformed(task: Task, arith: ArithFamily, chat: ChatFormat) -> None:
    ep = _episode(task, arith, chat)
    _turn(ep, '<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}')
    (step,) = ep.steps
    assert step.kind == "malformed" and step.error_kind == "parse"
    assert step.observation == "Error: unbalanced <tool_call> tags"
    assert not ep.done


def test_unknown_tool(task: Task, arith: ArithFamily, chat: ChatFormat) -> None:
    ep = _episode(task, arith, chat)
    _turn(ep, format_call("python", {"code": "1+1"}))
    (step,) = ep.steps
    assert step.kind == "tool_call" and step.tool == "python"
    assert step.error_kind == "unknown_tool"
    assert step.observation == "Error: unknown tool 'python'; available: calculator"
    assert not ep.done


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"expr": "3+4"}, "missing argument(s) expression"),
        ({"expression": "3+4", "x": 1}, "unknown argument(s) x"),
        ({"expression": 7}, "must be string"),
        ({"expression": "1/0"}, "division by zero"),
        ({"expression": "2**3"}, "unexpected token"),
    ],
)
def test_bad_arguments(task: Task, arith: ArithFamily, chat: ChatFormat, arguments: dict,
                       fragment: str) -> None:
    ep = _episode(task, arith, chat)
    _turn(ep, format_call("calculator", arguments))
    (step,) = ep.steps
    assert step.error_kind == "bad_arguments"
    assert step.error is not None and fragment in step.error
    assert step.observation == f"Error: {step.error}"
    assert not ep.done


def test_plain_text_stops(task: Task, arith: ArithFamily, chat: ChatFormat) -> None:
    ep = _episode(task, arith, chat)
    n = len(ep.token_ids)
    _turn(ep, "I think it is 35.")
    assert ep.done and ep.finish_reason == "stop" and ep.answer is None
    assert [s.kind for s in ep.steps] == ["text"]
    assert len(ep.token_ids) == n + len(chat.encode("I think it is 35.")) + 1  # no observation
    assert ep.turn_budget() == 0
    with pytest.raises(RuntimeError, match="already finished"):
        _turn(ep, "more")


def test_text_without_eos_is_cut_by_tokens(task: Task, arith: ArithFamily,
                                           chat: ChatFormat) -> None:
    ep = _episode(task, arith, chat)
    _turn(ep, "I think it is", eos=False)
    assert ep.done and ep.finish_reason == "max_tokens"


def test_unclosed_answer_is_malformed(task: Task, arith: ArithFamily, chat: ChatFormat) -> None:
    ep = _episode(task, arith, chat)
    _turn(ep, "<answer>35")
    assert ep.steps[0].kind == "malformed"
    assert ep.steps[0].observation == "Error: unclosed <answer> tag"
    assert not ep.done and ep.answer is None


def test_hallucinated_observation_is_flagged(task: Task, arith: ArithFamily,
                                             chat: ChatFormat) -> None:
    ep = _episode(task, arith, chat)
    _turn(ep, f"{CALL_7}<tool_response>8</tool_response>")
    assert ep.steps[0].hallucinated and ep.steps[0].observation == "7"


def test_max_turns(task: Task, arith: ArithFamily, chat: ChatFormat) -> None:
    ep = _episode(task, arith, chat, max_turns=2)
    _turn(ep, CALL_7)
    assert not ep.done
    _turn(ep, CALL_7)
    assert ep.done and ep.finish_reason == "max_turns" and ep.turns == 2
    assert ep.turn_budget() == 0


def test_token_budget(task: Task, arith: ArithFamily, chat: ChatFormat) -> None:
    prompt_len = len(chat.prompt_ids(task.prompt, _schemas(arith)))
    used = len(chat.assistant_ids(CALL_7)) + len(
        chat.encode(chat.observation_text(["7"], turn_ended_with_eos=True)))
    assert used == 16  # 10 call ids + eos, 5 of observation framing
    ep = _episode(task, arith, chat, max_tokens=prompt_len + used + 4, max_turn_tokens=64)
    assert ep.turn_budget() == used + 4
    _turn(ep, CALL_7)
    assert not ep.done and ep.turn_budget() == 4  # four tokens are still a turn
    ep = _episode(task, arith, chat, max_tokens=prompt_len + used + 3, max_turn_tokens=64)
    _turn(ep, CALL_7)
    assert ep.done and ep.finish_reason == "max_tokens" and ep.turn_budget() == 0
    ep = _episode(task, arith, chat, max_tokens=prompt_len + 300, max_turn_tokens=20)
    assert ep.turn_budget() == 20


def test_several_calls_in_one_turn(task: Task, arith: ArithFamily, chat: ChatFormat) -> None:
    ep = _episode(task, arith, chat)
    _turn(ep, CALL_7 + format_call("calculator", {"expression": "7*5"}))
    assert [s.observation for s in ep.steps] == ["7", "35"]
    assert [s.index for s in ep.steps] == [0, 1]
    assert [m["role"] for m in ep.messages[-3:]] == ["assistant", "tool", "tool"]
    full = chat.render(ep.messages, _schemas(arith), add_generation_prompt=True)
    assert chat.decode(ep.token_ids) == full


@pytest.mark.parametrize("seed", [0, 1])
def test_fault_injection_always(task: Task, arith: ArithFamily, chat: ChatFormat,
                                seed: int) -> None:
    ep = _episode(task, arith, chat, seed=seed, max_turns=20, max_tokens=4096,
                  faults=FaultConfig(rate=1.0))
    for _ in range(20):
        _turn(ep, CALL_7)
    assert ep.finish_reason == "max_turns" and len(ep.steps) == 20
    kinds = [s.error_kind for s in ep.steps]
    assert set(kinds) == {"tool_error", "timeout"}
    for s in ep.steps:
        assert s.observation in {"Error: calculator timed out; try again",
                                 "Error: calculator is temporarily unavailable; try again"}
        assert (s.error_kind == "timeout") == ("timed out" in s.observation)


def test_fault_injection_never_and_scoped(task: Task, arith: ArithFamily,
                                          chat: ChatFormat) -> None:
    for faults in (FaultConfig(rate=0.0), FaultConfig(rate=1.0, tools=["python"])):
        ep = _episode(task, arith, chat, max_turns=10, max_tokens=4096, faults=faults)
        for _ in range(10):
            _turn(ep, CALL_7)
        assert [s.error_kind for s in ep.steps] == [None] * 10
        assert [s.observation for s in ep.steps] == ["7"] * 10


def test_fault_timeout_share(task: Task, arith: ArithFamily, chat: ChatFormat) -> None:
    ep = _episode(task, arith, chat, max_turns=10, max_tokens=4096,
                  faults=FaultConfig(rate=1.0, timeout_share=1.0))
    for _ in range(10):
        _turn(ep, CALL_7)
    assert [s.error_kind for s in ep.steps] == ["timeout"] * 10


@pytest.mark.parametrize("observations", [["7"], ["7", "Error: division by zero"]])
@pytest.mark.parametrize("with_eos", [True, False])
def test_observation_text_matches_chat_template(chat: ChatFormat, arith: ArithFamily,
                                                observations: list[str],
                                                with_eos: bool) -> None:
    tools = _schemas(arith)
    prompt = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Compute 3+4"}]
    assistant = CALL_7
    full = [*prompt, {"role": "assistant", "content": assistant},
            *({"role": "tool", "content": o} for o in observations)]
    expected = chat.tokenizer.apply_chat_template(full, tools=tools, add_generation_prompt=True,
                                                  tokenize=False)
    start = chat.tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True,
                                               tokenize=False)
    got = (start + assistant + (chat.eos_token if with_eos else "")
           + chat.observation_text(observations, turn_ended_with_eos=with_eos))
    assert got == expected


def test_chat_format_requires_eos(tokenizer: Any) -> None:
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.eos_token = None
    with pytest.raises(ValueError, match="no eos token"):
        ChatFormat(tok)
