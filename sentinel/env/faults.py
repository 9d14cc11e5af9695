"""Fault schedules carried by a task: which call of a tool fails, and how.

The environment's random faults (`env.faults`) hit any call of any task with some probability, so
the samples of one group meet different faults and nothing in the task says which. A *fault
schedule* is part of the task's spec instead, `[{"type": T, "call": k}]`: the k-th call (0-based,
counting every invocation of the tool in the episode, whatever name it is called by) meets fault
T. Every sample of a group meets the same fault at the same point, the held-out set can hold it,
a generator can move it to another call or another task, and the reference solution shows its
remedy (so SFT can teach it). A task carrying fault T has the skill tag `recover:T`.

The fault types, each a realistic failure of a tool-serving API with its own remedy (what the
policy sees, the remedy and what fails: the table in docs/families.md, "Fault schedules"):
`timeout` (retry the call), `rate_limit` (`wait(seconds=2)`, then retry; retrying at once is
refused again), `notation` (re-issue the user's `x` as `*`), `renamed` (call `calc`: the old name
stays gone), `truncated` (the result comes back cut in half; call again), and three more
notations: `colon` (`12:4`, re-issue as `/`), `plus` (`3 plus 4`, as `+`), `minus` (`9 minus 2`,
as `-`).

The notation types (`NOTATIONS`) are faults of the task's text, not of the tool: the family renders
the operation in the user's notation and the calculator refuses it, as it refuses any `x`, saying
what to write instead (`sentinel.env.calculator.USER_NOTATION`). The others are made here by
wrapping the episode's tool (`apply_schedule`), with per-episode state, so `tool_map(spec)` of a
family returns fresh wrapped tools for every episode.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from sentinel.env.tools import BadArguments, NoSuchTool, Tool, ToolFailure, check_arguments

FAULT_TYPES: tuple[str, ...] = ("timeout", "rate_limit", "notation", "renamed", "truncated",
                                "colon", "plus", "minus")
TOOL_FAULTS = ("timeout", "rate_limit", "renamed", "truncated")  # made by wrapping the tool
# The faults of the task's text: the operation the user writes in a notation the calculator
# refuses (with a hint), as (operator, how the user writes it).
NOTATIONS: dict[str, tuple[str, str]] = {
    "notation": ("*", "x"), "colon": ("/", ":"), "plus": ("+", " plus "), "minus": ("-", " minus "),
}
RETRY_AFTER_S = 2
TRUNCATED = "...[truncated]"
RENAMED_SUFFIX = " (renamed)"
MAX_WAIT_S = 60


def recover_skill(fault_type: str) -> str:
    """The skill tag of a task carrying `fault_type`."""
    return f"recover:{fault_type}"


def check_schedule(schedule: Any, n_calls: int) -> list[dict[str, Any]]:
    """The canonical form of a fault schedule for a task whose reference makes `n_calls` calls:
    a list of `{"type", "call"}` with known types and distinct calls in `[0, n_calls)`, sorted by
    call. Raises `ValueError` saying what is wrong."""
    if not isinstance(schedule, list):
        raise ValueError('faults must be a list of {"type": ..., "call": k}')
    out = []
    for fault in schedule:
        if not isinstance(fault, dict) or set(fault) != {"type", "call"}:
            raise ValueError(f'a fault is {{"type": ..., "call": k}}, got {fault!r}')
        kind, call = fault["type"], fault["call"]
        if kind not in FAULT_TYPES:
            raise ValueError(f"unknown fault type {kind!r}; known: {', '.join(FAULT_TYPES)}")
        if not isinstance(call, int) or isinstance(call, bool) or not 0 <= call < n_calls:
            raise ValueError(f"fault call must be an integer in [0, {n_calls}), got {call!r}")
        out.append({"type": kind, "call": call})
    calls = [f["call"] for f in out]
    if len(set(calls)) != len(calls):
        raise ValueError(f"at most one fault per call, got calls {calls}")
    if sum(f["type"] == "renamed" for f in out) > 1:
        raise ValueError("a tool can be renamed once per episode")
    return sorted(out, key=lambda f: f["call"])


def truncate(result: str) -> str:
    """What a `truncated` call shows: the first half of the result, then the marker."""
    return result[: len(result) // 2] + TRUNCATED


class Wait:
    """`wait(seconds)`: lets a rate limit pass (no real sleep: the episode's clock is the call
    count). Waiting at least the `retry after` time clears the limit of the episode's tools."""

    name = "wait"
    description = "Wait before retrying a rate-limited tool."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"seconds": {"type": "integer", "description": "how long to wait"}},
        "required": ["seconds"],
    }

    def __init__(self, state: _EpisodeFaults | None = None) -> None:
        self.state = state

    def __call__(self, **arguments: Any) -> str:
        check_arguments(self, arguments)
        seconds = arguments["seconds"]
        if not 0 < seconds <= MAX_WAIT_S:
            raise BadArguments(f"seconds must be between 1 and {MAX_WAIT_S}")
        if self.state is not None and seconds >= RETRY_AFTER_S:
            self.state.limited = False
        return f"waited {seconds} s"


class _EpisodeFaults:
    """One episode's schedule and state: how many calls were made, whether a rate limit holds,
    whether the tool has been renamed."""

    def __init__(self, schedule: list[dict[str, Any]], tool: Tool, new_name: str,
                 echo: bool = False) -> None:
        self.faults = {f["call"]: f["type"] for f in schedule if f["type"] in TOOL_FAULTS}
        self.tool, self.new_name, self.echo = tool, new_name, echo
        self.calls = 0
        self.limited = False
        self.renamed = False

    def call(self, called_as: str, arguments: dict[str, Any]) -> str:
        name = self.tool.name
        # with `echo`, a fault names the call it met (` on {"expression": "3*4"}`), as a server's
        # error that quotes the request does
        quoted = json.dumps(arguments, ensure_ascii=False) if self.echo else ""
        on = f" on {quoted}" if quoted else ""
        if called_as == self.new_name and not self.renamed:
            raise NoSuchTool(f"unknown tool {called_as!r}; available: {name}")
        if called_as == name and self.renamed:
            raise NoSuchTool(f"unknown tool {name!r}{RENAMED_SUFFIX}{on}; available: "
                             f"{self.new_name}")
        k, self.calls = self.calls, self.calls + 1
        fault = self.faults.get(k)
        if fault == "renamed":
            self.renamed = True
            raise NoSuchTool(f"unknown tool {name!r}{RENAMED_SUFFIX}{on}; available: "
                             f"{self.new_name}")
        if fault == "rate_limit":
            self.limited = True
        if self.limited:
            raise ToolFailure(f"{name} rate limit exceeded{on}; retry after {RETRY_AFTER_S} s")
        if fault == "timeout":
            raise ToolFailure(f"{name} timed out after 10 s{on}; try again", timeout=True)
        result = self.tool(**arguments)
        if fault != "truncated":
            return result
        return f"{quoted} = {truncate(result)}" if quoted else truncate(result)


class _ScheduledTool:
    """The episode's tool under one of its names: the original, listed until the rename, or the
    name it is renamed to, hidden from the prompt's tool list and listed (in an unknown-tool
    error) only once the rename has happened."""

    def __init__(self, state: _EpisodeFaults, name: str) -> None:
        self.state, self.name = state, name
        self.description, self.parameters = state.tool.description, state.tool.parameters

    @property
    def hidden(self) -> bool:
        return self.state.renamed != (self.name == self.state.new_name)

    def __call__(self, **arguments: Any) -> str:
        return self.state.call(self.name, arguments)


def apply_schedule(tools: dict[str, Tool], target: str, schedule: list[dict[str, Any]], *,
                   new_name: str = "calc", with_wait: bool = False,
                   echo: bool = False) -> dict[str, Tool]:
    """`tools` with `target` wrapped to meet `schedule` (its tool faults; `notation` is the
    family's), plus the hidden `new_name` alias when the schedule renames it, plus `wait` when
    `with_wait` or the schedule has a rate limit; with `echo`, each tool fault's message quotes
    the arguments of the call it met. Fresh state: call once per episode."""
    state = _EpisodeFaults(schedule, tools[target], new_name, echo)
    out = dict(tools)
    out[target] = _ScheduledTool(state, target)
    if any(f["type"] == "renamed" for f in schedule):
        out[new_name] = _ScheduledTool(state, new_name)
    if with_wait or any(f["type"] == "rate_limit" for f in schedule):
        out["wait"] = Wait(state)
    return out
