"""Parsing an assistant turn into tool calls, an answer, or neither.

The default parser reads the Hermes/Qwen form that real chat models emit:

    <tool_call>{"name": "calculator", "arguments": {"expression": "3*4"}}</tool_call>

and a final answer as `<answer>...</answer>`. Parsers are pluggable: anything with
`parse(text) -> ParsedTurn` works (see `PARSERS` and `parser_class`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from sentinel.plugins import resolve

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
MAX_CALLS_PER_TURN = 8

_CALL_RE = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.S)
_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.S)
# The Hermes tags' one home: the analyzer and the report import these instead of spelling the tags.
RESPONSE_RE = re.compile(re.escape(RESPONSE_OPEN) + r"(.*?)" + re.escape(RESPONSE_CLOSE), re.S)
# A whole call or answer block as one group, so `BLOCK_RE.split(text)` keeps the blocks.
BLOCK_RE = re.compile(f"({re.escape(TOOL_CALL_OPEN)}.*?{re.escape(TOOL_CALL_CLOSE)}"
                      f"|{re.escape(ANSWER_OPEN)}.*?{re.escape(ANSWER_CLOSE)})", re.S)


@dataclass
class ParsedCall:
    name: str | None
    arguments: dict[str, Any] | None
    error: str | None = None  # set when the call could not be parsed
    raw: str = ""


@dataclass
class ParsedTurn:
    calls: list[ParsedCall] = field(default_factory=list)
    answer: str | None = None
    hallucinated: bool = False
    format_error: str | None = None  # turn-level problem: unclosed tag, stray text tags


class ToolCallParser(Protocol):
    def parse(self, text: str) -> ParsedTurn: ...


def _encodable(obj: Any) -> bool:
    """False when JSON escapes such as \\ud800 decoded to lone surrogates: no UTF-8 store (DuckDB,
    Arrow) accepts them, so such a call must not reach a `Step`."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        return False
    return True


def _parse_call(body: str) -> ParsedCall:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:
        return ParsedCall(None, None, f"invalid JSON in tool call: {exc.__class__.__name__}", body)
    if not _encodable(obj):
        return ParsedCall(None, None, "invalid JSON in tool call: unpaired surrogate escape", body)
    if not isinstance(obj, dict):
        return ParsedCall(None, None, "tool call must be a JSON object", body)
    name, args = obj.get("name"), obj.get("arguments", {})
    if not isinstance(name, str) or not name:
        return ParsedCall(None, None, "tool call has no string 'name'", body)
    if isinstance(args, str):  # some models emit arguments as a JSON string
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            return ParsedCall(name, None, "'arguments' is not a JSON object", body)
        if not _encodable(args):
            return ParsedCall(name, None, "'arguments' has an unpaired surrogate escape", body)
    if not isinstance(args, dict):
        return ParsedCall(name, None, "'arguments' is not a JSON object", body)
    return ParsedCall(name, args, None, body)


class HermesParser:
    """Hermes/Qwen `<tool_call>` JSON blocks plus `<answer>` tags."""

    def parse(self, text: str) -> ParsedTurn:
        turn = ParsedTurn(hallucinated=RESPONSE_OPEN in text or RESPONSE_CLOSE in text)
        bodies = _CALL_RE.findall(text)
        opens, closes = text.count(TOOL_CALL_OPEN), text.count(TOOL_CALL_CLOSE)
        if opens != closes or opens != len(bodies):
            turn.format_error = "unbalanced <tool_call> tags"
        turn.calls = [_parse_call(b.strip()) for b in bodies[:MAX_CALLS_PER_TURN]]
        answers = _ANSWER_RE.findall(text)
        if answers:
            turn.answer = answers[-1].strip()
        elif ANSWER_OPEN in text:
            turn.format_error = turn.format_error or "unclosed <answer> tag"
        return turn


PARSERS: dict[str, type] = {"hermes": HermesParser}
ENTRY_POINT_GROUP = "sentinel.parsers"


def parser_class(name: str) -> type:
    """The parser class `name` stands for (a `PARSERS` name, an entry point of `sentinel.parsers`,
    or `module:Class`; a class with `parse(text) -> ParsedTurn`), by `sentinel.plugins.resolve`."""
    return resolve("tool-call parser", name, PARSERS, ENTRY_POINT_GROUP, required=("parse",))


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """The exact text of a Hermes call, as reference solutions write it."""
    return f"{TOOL_CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{TOOL_CALL_CLOSE}"


def format_answer(answer: str) -> str:
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"
