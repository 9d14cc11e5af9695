"""Build `failure_corpus.jsonl`: hand-written failed arith episodes with human labels.

Each case is written as the assistant turns a policy might produce (`C:3+4` is a well-formed
calculator call, `A:35` an answer, anything else verbatim text), the faults the environment
injects (per call to a known tool: None, "timeout" or "tool_error") and the label a person gives
after reading the transcript: the mode that *caused* the failure, the first erroneous step, and
a note saying why. The turns are replayed through the real environment (`Episode`, the Hermes
parser, the real calculator, fault injection driven by a scripted random source), so the stored
steps are exactly what a rollout would have stored. The labels were written before running the
analyzer on them; where the analyzer disagreed, the analyzer was fixed (sentinel/analyzer.py).

Run `python -m tests.data.build_corpus` from the repository root to rewrite the file;
tests/test_analyzer_corpus.py checks that it is still what the environment produces.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig, Episode, FaultConfig
from sentinel.env.parser import HermesParser, format_call
from sentinel.policy import build_tokenizer
from sentinel.tasks import load_family

CORPUS = Path(__file__).with_name("failure_corpus.jsonl")
CUT = "<cut>"  # a turn ending in CUT was cut by the token limit (no end-of-turn token)
OUT_OF_TOKENS = "<out-of-tokens>"  # a last "turn" saying the episode's token budget ran out


class ScriptedFaults(random.Random):
    """A random source that injects exactly the scripted faults: per call to a known tool, one
    draw decides the fault (0.1 < rate) and, for a fault, one more its kind (timeout or not)."""

    def __init__(self, faults: list[str | None]) -> None:
        super().__init__(0)
        self.draws: list[float] = []
        for fault in faults:
            self.draws += [0.9] if fault is None else [0.1, 0.1 if fault == "timeout" else 0.9]

    def random(self) -> float:
        return self.draws.pop(0) if self.draws else 0.9


def turn_text(turn: str) -> str:
    if turn.startswith("C:"):
        return format_call("calculator", {"expression": turn[2:]})
    if turn.startswith("A:"):
        return f"<answer>{turn[2:]}</answer>"
    return turn


def replay_case(case: dict[str, Any], chat: ChatFormat) -> dict[str, Any]:
    """Run a case's turns through the real environment; returns the trajectory fields."""
    family = load_family("arith")
    task = family.make_task(case["task"]["spec"])
    turns = [t for t in case["turns"] if t != OUT_OF_TOKENS]
    faults = case.get("faults", [])
    config = EnvConfig(
        # the turn limit ends the episode right after the last turn, unless the budget does
        max_turns=len(turns) + (OUT_OF_TOKENS in case["turns"] or not turns),
        max_tokens=4096,
        max_turn_tokens=256,
        faults=FaultConfig(rate=0.5 if faults else 0.0, timeout_share=0.5),
    )
    episode = Episode(task, family.tool_map(), chat, HermesParser(), config, ScriptedFaults(faults))
    for turn in turns:
        cut = turn.endswith(CUT)
        text = turn_text(turn.removesuffix(CUT))
        ids = chat.encode(text) if cut else chat.assistant_ids(text)
        episode.add_policy_turn(ids, [0.0] * len(ids))
    if not episode.done:  # the episode's token budget ran out: what `run_episodes` does
        episode._finish("max_tokens")
    return {
        "finish_reason": episode.finish_reason,
        "answer": episode.answer,
        "success": family.verify(task, episode.answer),
        "steps": [asdict(s) for s in episode.steps],
    }


# (id, expression, turns, faults, mode, first_error_step, why a person labels it so)
CASES: list[tuple[str, str, list[str], list[str | None], str, int | None, str]] = [
    # -- format_error ----------------------------------------------------------------------------
    ("fmt-unclosed-call", "(3+4)*5", [
        "C:3+4",
        '<tool_call>{"name": "calculator", "arguments": {"expression": "7*5"}}',
        '<tool_call>{"name": "calculator" "arguments": {"expression": "7*5"}}</tool_call>',
    ], [], "format_error", 1, "after a good first call it never again wrote a parseable call"),
    ("fmt-prose-answer", "12-5+3", ["C:12-5", "C:7+3", "The answer is 10."], [],
     "format_error", 2, "it had 10 but wrote it as prose, not <answer>"),
    ("fmt-rambling-cut", "6*7", [
        "Let me think about this carefully. First I need to multiply six by seven which" + CUT,
    ], [], "format_error", 0, "rambled in prose until the turn's token limit, no call"),
    ("fmt-unclosed-answer", "8+9*2", ["C:9*2", "C:8+18", "<answer>26"], [],
     "format_error", 2, "right value, but the answer tag is never closed"),
    ("fmt-bare-json", "20/4-3", [
        '{"name": "calculator", "arguments": {"expression": "20/4"}}',
    ], [], "format_error", 0, "a call without the <tool_call> tags is just text"),
    ("fmt-recovered-then-broken", "(2+3)*(4+1)", [
        "<tool_call>{'name': 'calculator', 'arguments': {'expression': '2+3'}}</tool_call>",
        "C:2+3", "C:4+1",
        '<tool_call>{"name": "calculator", "arguments": {"expression": "5*5"}}',
    ], [], "format_error", 3, "the first parse error was repaired; the last turn is broken"),
    ("fmt-trailing-brace", "3+4", [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}}</tool_call>',
    ], [], "format_error", 0, "invalid JSON (an extra brace) in every call"),
    ("fmt-bare-number", "15-6", ["C:15-6", "9"], [],
     "format_error", 1, "final turn is a bare number, not an answer"),
    ("fmt-misspelt-tag", "(3+4)*5", ["C:3+4", "C:7*5", "<answr>35</answr>"], [],
     "format_error", 2, "misspelt answer tag"),
    # -- unknown_tool ----------------------------------------------------------------------------
    ("unk-multiply-then-guess", "(3+4)*5", [
        "C:3+4",
        '<tool_call>{"name": "multiply", "arguments": {"a": 7, "b": 5}}</tool_call>',
        "A:34",
    ], [], "unknown_tool", 1, "asked for a multiply tool that does not exist, then guessed"),
    ("unk-capitalised-names", "9-4", [
        '<tool_call>{"name": "Calculator", "arguments": {"expression": "9-4"}}</tool_call>',
        '<tool_call>{"name": "calc", "arguments": {"expression": "9-4"}}</tool_call>',
        '<tool_call>{"name": "CALCULATOR", "arguments": {"expression": "9-4"}}</tool_call>',
    ], [], "unknown_tool", 0, "never found the tool's real name"),
    ("unk-python", "15/3+2", [
        '<tool_call>{"name": "python", "arguments": {"code": "print(15/3+2)"}}</tool_call>',
        "A:6",
    ], [], "unknown_tool", 0, "tried a python tool this task does not offer"),
    ("unk-gives-up", "11*13", [
        '<tool_call>{"name": "search", "arguments": {"query": "11*13"}}</tool_call>',
        "I cannot compute this without a search tool.",
    ], [], "unknown_tool", 0, "gave up in prose because its imagined tool was missing"),
    ("unk-subtract", "4*6-5", [
        "C:4*6",
        '<tool_call>{"name": "subtract", "arguments": {"a": 24, "b": 5}}</tool_call>',
        "A:20",
    ], [], "unknown_tool", 1, "did the first step, then invented a subtract tool"),
    ("unk-insists", "8+7", [
        '<tool_call>{"name": "add", "arguments": {"x": 8, "y": 7}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"x": 8, "y": 7}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"x": 8, "y": 7}}</tool_call>',
    ], [], "unknown_tool", 0, "the root cause of the repetition is the nonexistent tool"),
    # -- bad_arguments ---------------------------------------------------------------------------
    ("bad-wrong-key", "(3+4)*5", [
        "C:3+4",
        '<tool_call>{"name": "calculator", "arguments": {"expr": "7*5"}}</tool_call>',
        "A:30",
    ], [], "bad_arguments", 1, "argument named expr instead of expression"),
    ("bad-words", "6*8", ["C:6 x 8", "C:6 times 8", "A:46"], [],
     "bad_arguments", 0, "wrote the operation in words; the calculator refused"),
    ("bad-int-gives-up", "18/3*2", [
        '<tool_call>{"name": "calculator", "arguments": {"expression": 18}}</tool_call>',
        "The calculator rejected my input.",
    ], [], "bad_arguments", 0, "passed a number instead of an expression string, gave up"),
    ("bad-missing-arg", "7+8+9", [
        "C:7+8",
        '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>',
        "A:25",
    ], [], "bad_arguments", 1, "second call had no expression, then a guess"),
    ("bad-extra-arg", "50-2*9", [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2*9", "precision": 2}}'
        "</tool_call>",
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2*9", "precision": 2}}'
        "</tool_call>",
        "A:30",
    ], [], "bad_arguments", 0, "an unsupported precision argument, repeated, then a guess"),
    ("bad-second-unrepaired", "3*4+1", ["C:3 x 4", "C:3*4", "C:12+", "A:12"], [],
     "bad_arguments", 2, "the first bad call was repaired, the incomplete 12+ was not"),
    # -- loop ------------------------------------------------------------------------------------
    ("loop-same-call", "(3+4)*5", ["C:3+4", "C:3+4", "C:3+4", "C:3+4"], [],
     "loop", 1, "stuck repeating the first step"),
    ("loop-alternating", "9+3-2", ["C:9+3", "C:12-2", "C:9+3", "C:12-2", "C:9+3", "C:12-2"], [],
     "loop", 2, "went round the same two calls instead of answering"),
    ("loop-spacing-variants", "5*6", ["C:5*6", "C:5 * 6", "C:5*6 ", "C:(5*6)"], [],
     "loop", 1, "the same call with different spacing is still the same call"),
    ("loop-then-intermediate", "8*3+1", ["C:8*3", "C:8*3", "C:8*3", "A:24"], [],
     "loop", 1, "repeated the first step, never moved on, answered what it had"),
    ("loop-after-retry", "4+4", ["C:4+4", "C:4+4", "C:4+4", "C:4+4"], ["timeout"],
     "loop", 2, "the retry after the timeout was right; the repeats after it are the loop"),
    ("loop-has-answer", "7*7+1", ["C:7*7", "C:49+1", "C:49+1", "C:49+1"], [],
     "loop", 2, "obtained 50 and kept recomputing it"),
    # -- tool_error_unrecovered ------------------------------------------------------------------
    ("tool-timeout-guess", "(3+4)*5", ["C:3+4", "C:7*5", "A:36"], [None, "timeout"],
     "tool_error_unrecovered", 1, "the multiplication timed out and it guessed"),
    ("tool-down", "11+12", ["C:11+12", "C:11+12", "C:11+12"],
     ["tool_error", "tool_error", "tool_error"],
     "tool_error_unrecovered", 0, "retried properly, the tool never came back"),
    ("tool-guessed-intermediate", "9*9-1", ["C:9*9", "C:80-1", "A:79"], ["timeout"],
     "tool_error_unrecovered", 0, "after the timeout it assumed 9*9=80 instead of retrying"),
    ("tool-gives-up", "6+7*2", ["C:7*2", "The calculator is unavailable, so I cannot finish."],
     ["tool_error"], "tool_error_unrecovered", 0, "gave up after one tool failure"),
    ("tool-second-op", "30/5+4", ["C:30/5", "C:30/5", "C:6+4", "A:11"],
     ["timeout", None, "tool_error"], "tool_error_unrecovered", 2,
     "recovered from the first timeout, not from the second failure"),
    ("tool-single-op", "100-37", ["C:100-37", "A:73"], ["timeout"],
     "tool_error_unrecovered", 0, "the only call timed out; the answer is a guess"),
    # -- hallucinated_observation ----------------------------------------------------------------
    ("hal-invented-product", "(3+4)*5", [
        "C:3+4",
        format_call("calculator", {"expression": "7*5"}) + "<tool_response>36</tool_response>",
        "A:36",
    ], [], "hallucinated_observation", 1, "wrote 36 as the tool's result and believed it"),
    ("hal-text-only", "14+28", ["<tool_response>42</tool_response>"], [],
     "hallucinated_observation", 0, "invented a tool response without calling anything"),
    ("hal-with-answer", "13*3", ["<tool_response>37</tool_response><answer>37</answer>"], [],
     "hallucinated_observation", 0, "invented the result and answered it"),
    ("hal-after-real-call", "5+6+7", [
        "C:5+6", "<tool_response>17</tool_response><answer>17</answer>",
    ], [], "hallucinated_observation", 1, "invented the second result"),
    ("hal-echo-then-invent", "(8-3)*4", [
        format_call("calculator", {"expression": "8-3"}) + "<tool_response>5</tool_response>",
        format_call("calculator", {"expression": "5*4"}) + "<tool_response>25</tool_response>",
        "A:25",
    ], [], "hallucinated_observation", 1,
     "the first echo matched the tool; the second invented 25 (the tool said 20)"),
    ("hal-unclosed", "3+4", [
        format_call("calculator", {"expression": "3+4"}) + "<tool_response>8",
        "A:8",
    ], [], "hallucinated_observation", 0, "started writing its own result, 8, and used it"),
    # -- premature_answer ------------------------------------------------------------------------
    ("pre-intermediate", "(3+4)*5", ["C:3+4", "A:7"], [],
     "premature_answer", 1, "answered the first intermediate"),
    ("pre-three-of-four", "2+3+4+5", ["C:2+3", "C:5+4", "A:9"], [],
     "premature_answer", 2, "stopped one operation short"),
    ("pre-no-calls", "17*23", ["A:400"], [],
     "premature_answer", 0, "guessed without using the calculator"),
    ("pre-repeat-is-not-progress", "6*(2+5)", ["C:2+5", "C:2+5", "A:7"], [],
     "premature_answer", 2, "two calls, but the same one: half the work, then an answer"),
    ("pre-after-recovery", "9+8*2", [
        '<tool_call>{"name": "mul", "arguments": {"a": 8, "b": 2}}</tool_call>',
        "C:8*2", "A:16",
    ], [], "premature_answer", 2, "repaired the tool name, then answered after one of two steps"),
    ("pre-mental-step", "12*4-8", ["C:12*4", "A:38"], [],
     "premature_answer", 1, "did the last step in its head, wrongly"),
    ("pre-mental-sub", "20-(3+4)", ["C:3+4", "A:12"], [],
     "premature_answer", 1, "skipped the subtraction call"),
    # -- no_answer -------------------------------------------------------------------------------
    ("none-out-of-turns", "(3+4)*5", ["C:3+4", "C:7*5"], [],
     "no_answer", 1, "did the work but the turn limit came before an answer"),
    ("none-fiddling", "6+6", ["C:6+6", "C:12+0", "C:12*1", "C:12-0"], [],
     "no_answer", 1, "had 12 after the first call and kept poking instead of answering"),
    ("none-token-budget", "3+4+5+6", ["C:3+4", "C:7+5", OUT_OF_TOKENS], [],
     "no_answer", 1, "the episode's token budget ran out mid-work"),
    ("none-empty", "2*9", [], [], "no_answer", None, "produced nothing at all"),
    ("none-after-retry", "10*10/4", ["C:10*10", "C:10*10", "C:100/4"], ["timeout"],
     "no_answer", 2, "recovered from the timeout, reached 25, ran out of turns"),
    ("none-after-format-slip", "(1+2)*3", [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}</tool_call>',
        "C:1+2", "C:3*3",
    ], [], "no_answer", 2, "the parse error was repaired; the turns ran out"),
    # -- wrong_answer ----------------------------------------------------------------------------
    ("wrong-transcription", "(3+4)*5", ["C:3+4", "C:7*5", "A:34"], [],
     "wrong_answer", 2, "computed 35, answered 34"),
    ("wrong-operation", "(3+4)*5", ["C:3+4", "C:7*6", "A:42"], [],
     "wrong_answer", 1, "multiplied by 6 instead of 5"),
    ("wrong-after-unknown-tool", "9-2*3", [
        '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>',
        "C:2*3", "C:9-6", "A:-3",
    ], [], "wrong_answer", 3, "repaired the tool name, did the work, flipped the sign"),
    ("wrong-after-retry", "16/4+5", ["C:16/4", "C:16/4", "C:4+6", "A:10"], ["timeout"],
     "wrong_answer", 2, "retried well, then added 6 instead of 5"),
    ("wrong-one-shot-miscopied", "25-7*3", ["C:25-7*3", "A:14"], [],
     "wrong_answer", 1, "got 4 from one call, answered 14"),
    ("wrong-precedence", "2+3*4", ["C:2+3", "C:5*4", "A:20"], [],
     "wrong_answer", 0, "added before multiplying"),
    ("wrong-after-echo", "(6+2)*3", [
        format_call("calculator", {"expression": "6+2"}) + "<tool_response>8</tool_response>",
        "C:8*3", "A:23",
    ], [], "wrong_answer", 2, "its echoed result was the true one; the answer is miscopied"),
    ("wrong-after-parse-slip", "7*8-6", [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "7*8"}</tool_call>',
        "C:7*8", "C:56-6", "A:5",
    ], [], "wrong_answer", 3, "repaired its JSON, computed 50, answered 5"),
    ("wrong-after-bad-args", "40/8*3", ["C:40 div 8", "C:40/8", "C:5*3", "A:18"], [],
     "wrong_answer", 3, "repaired its expression, computed 15, answered 18"),
    # A copy error whose result equals an intermediate value by chance is still the first error.
    ("wrong-copy-equals-intermediate", "18-(3+11)", ["C:3+11", "C:1*14", "A:14"], [],
     "wrong_answer", 1, "copied 18 as 1; 1*14 gives the intermediate 14 by chance"),
    ("wrong-miscopied-operand-same-result", "(5+7)-2", ["C:5+7", "C:2*6", "A:12"], [],
     "wrong_answer", 1, "took 6 from nowhere; 2*6 repeats 12 instead of subtracting"),
    ("wrong-grounded-then-miscopied-answer", "(4+5)*2", ["C:4+5", "C:9*2", "A:81"], [],
     "wrong_answer", 2, "both calls use numbers it had; the answer is miscopied"),
]


def build() -> list[dict[str, Any]]:
    chat = ChatFormat(build_tokenizer())
    rows = []
    for case_id, expr, turns, faults, mode, first, why in CASES:
        case = {"id": case_id, "task": {"family": "arith", "spec": {"expr": expr}},
                "turns": turns, "faults": faults}
        replayed = replay_case(case, chat)
        if replayed["success"]:
            raise ValueError(f"case {case_id} succeeded; the corpus holds failures only")
        rows.append({**case, **replayed, "mode": mode, "first_error_step": first, "why": why})
    return rows


if __name__ == "__main__":
    rows = build()
    CORPUS.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} cases to {CORPUS}")
