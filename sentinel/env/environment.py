"""The multi-turn tool environment.

An `Episode` holds one rollout in progress. The rollout backend asks it for the ids to condition
on (`token_ids`) and a token budget for the next turn, samples a turn, and hands the sampled ids
back with `add_policy_turn`. The episode decodes them, parses tool calls, runs the tools (with
optional fault injection), and appends the observation ids with loss mask 0, until the policy
answers, stops without a call, or hits the turn or token limit. Every turn becomes `Step` records
that the reward and the analyzer read.

A turn that is neither a call nor an answer ends the episode (as a chat model's final message
would). A malformed call gets an error observation and the episode goes on, so recovering from
one's own mistakes stays learnable.

Several user turns (multi-turn tasks such as BFCL's): `follow_ups` holds the user messages that
come after the prompt, one list per user turn. An answer, or a text turn the policy ended with eos,
closes the current user turn; while follow-ups remain, the next one is appended (mask 0, framed by
the chat template) and the episode goes on. Only the last user turn's closing step ends it, so the
closing steps (`answer`/`text`) split `steps` into user turns. `turn_budget`, `max_turns` and
`max_tokens` count over the whole episode.

A revealed start state (`Task.prefix`, assistant turn texts): right after the prompt the episode
replays those turns as `replay` runs scripted turns (each turn's ids from `chat.assistant_ids`,
the tools really called, without the random `env.faults`, so every sample of a group starts from
the same state), with loss mask 0 and log-prob 0.0 on their tokens and `Step.revealed` set on
their steps. They count towards `max_turns` and `max_tokens` like any turn; `prompt_len` stays the
prompt's length, and the policy's first token comes after the prefix. A prefix that ends the
episode (an answer, a turn that is neither call nor answer, or a limit) leaves nothing for the
policy: `prefix_problem` says so, and validation rejects such a task.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sentinel.env.chat import ChatFormat
from sentinel.env.parser import ParsedCall, ToolCallParser
from sentinel.env.tools import BadArguments, NoSuchTool, Tool, ToolFailure, tool_schema
from sentinel.types import Step, Task, Trajectory

MAX_OBSERVATION_CHARS = 2000


class FaultConfig(BaseModel):
    """Tool fault injection: each call fails transiently with probability `rate`."""

    model_config = ConfigDict(extra="forbid")
    rate: float = Field(0.0, ge=0.0, le=1.0, description="probability a call fails")
    timeout_share: float = Field(0.5, ge=0.0, le=1.0, description="share of faults that time out")
    tools: list[str] | None = Field(None, description="tools subject to faults (None: all)")


class EnvConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_turns: int = Field(6, ge=1, description="assistant turns before the episode is cut")
    max_tokens: int = Field(512, ge=16, description="token budget of the whole episode")
    max_turn_tokens: int = Field(64, ge=4, description="new tokens per assistant turn")
    parser: str = Field("hermes", description="tool-call parser name")
    faults: FaultConfig = Field(default_factory=FaultConfig,
                                description="tool fault injection for every family's tools")


class Episode:
    def __init__(self, task: Task, tools: dict[str, Tool], chat: ChatFormat,
                 parser: ToolCallParser, config: EnvConfig, rng: random.Random,
                 follow_ups: list[list[dict[str, str]]] | None = None) -> None:
        self.task, self.tools, self.chat, self.parser = task, tools, chat, parser
        self.follow_ups = [list(turn) for turn in follow_ups or []]
        self.config, self.rng = config, rng
        # A tool marked `hidden` is callable but not listed (a fault schedule's renamed tool).
        schemas = [tool_schema(t) for t in tools.values() if not getattr(t, "hidden", False)]
        self.token_ids: list[int] = chat.prompt_ids(task.prompt, schemas)
        self.prompt_len = len(self.token_ids)
        self.loss_mask: list[int] = [0] * self.prompt_len
        self.logprobs: list[float] = [0.0] * self.prompt_len
        self.messages: list[dict[str, Any]] = [dict(m) for m in task.prompt]
        self.steps: list[Step] = []
        self.turns = 0
        self.done = False
        self.finish_reason = "max_turns"
        self.answer: str | None = None
        self.prefix_problem: str | None = None
        self._hint_ids: list[int] = []
        for i, text in enumerate(task.prefix):
            ids = chat.assistant_ids(text)
            self._add_turn(ids, [0.0] * len(ids), revealed=True)
            if self.done:
                self.prefix_problem = (
                    f"replaying prefix turn {i + 1} of {len(task.prefix)} ended the episode "
                    f"({self.finish_reason}); nothing is left for the policy")
                break
        # The revealed start of the policy's first turn (`Task.hint`): context (mask 0) that the
        # policy's turn continues; the turn is parsed with it.
        if task.hint and not self.done:
            self._hint_ids = chat.encode(task.hint)
            self.token_ids += self._hint_ids
            self.loss_mask += [0] * len(self._hint_ids)
            self.logprobs += [0.0] * len(self._hint_ids)
            if self.turn_budget() < 1:
                self.prefix_problem = "the hint leaves no token budget for the policy's turn"
                self._finish("max_tokens")

    def turn_budget(self) -> int:
        """How many tokens the next turn may have (0 when the episode is over)."""
        if self.done:
            return 0
        left = self.config.max_tokens - len(self.token_ids)
        return max(0, min(self.config.max_turn_tokens, left))

    def _finish(self, reason: str) -> None:
        self.done, self.finish_reason = True, reason

    def _run_call(self, call: ParsedCall, revealed: bool) -> Step:
        step = Step(index=len(self.steps), text="", kind="tool_call", tool=call.name,
                    arguments=call.arguments)
        if call.error is not None:
            step.kind, step.error, step.error_kind = "malformed", call.error, "parse"
        elif call.name not in self.tools:
            known = ", ".join(sorted(n for n, t in self.tools.items()
                                     if not getattr(t, "hidden", False)))
            step.error, step.error_kind = f"unknown tool {call.name!r}; available: {known}", \
                "unknown_tool"
        else:
            faults = self.config.faults
            injected = (not revealed and faults.rate > 0
                        and (faults.tools is None or call.name in faults.tools)
                        and self.rng.random() < faults.rate)
            try:
                if injected:
                    timeout = self.rng.random() < faults.timeout_share
                    raise ToolFailure(
                        f"{call.name} timed out; try again" if timeout
                        else f"{call.name} is temporarily unavailable; try again",
                        timeout=timeout)
                step.observation = self.tools[call.name](**(call.arguments or {}))
            except BadArguments as exc:
                step.error, step.error_kind = str(exc), "bad_arguments"
            except NoSuchTool as exc:
                step.error, step.error_kind = str(exc), "unknown_tool"
            except ToolFailure as exc:
                step.error = str(exc)
                step.error_kind = "timeout" if exc.timeout else "tool_error"
            except Exception as exc:  # a tool's own bug or its host's: this step's error, never
                # the rollout's (RecursionError, PermissionError, ... from what the call did)
                step.error = f"{call.name} failed: {type(exc).__name__}: {exc}"[:500]
                step.error_kind = "tool_error"
        if step.error is not None:
            step.observation = f"Error: {step.error}"
        step.observation = (step.observation or "")[:MAX_OBSERVATION_CHARS]
        return step

    def add_policy_turn(self, ids: list[int], logprobs: list[float]) -> None:
        """Append a sampled turn (its ids and sampling log-probs), then act on it."""
        self._add_turn(ids, logprobs, revealed=False)

    def _add_turn(self, ids: list[int], logprobs: list[float], *, revealed: bool) -> None:
        """Append an assistant turn and act on it; a `revealed` (prefix) turn is not trained on
        (mask 0, log-probs 0.0) and meets no random fault."""
        if self.done:
            raise RuntimeError("episode is already finished")
        ended_with_eos = bool(ids) and ids[-1] == self.chat.eos_token_id
        self.token_ids += ids
        self.loss_mask += [0 if revealed else 1] * len(ids)
        self.logprobs += [0.0] * len(ids) if revealed else list(logprobs)
        whole = ids
        if not revealed and self._hint_ids:  # the policy continued the revealed hint
            whole, self._hint_ids = self._hint_ids + ids, []
        text = self.chat.decode(whole[:-1] if ended_with_eos else whole)
        self.messages.append({"role": "assistant", "content": text})
        self.turns += 1
        turn = self.parser.parse(text)

        if turn.calls:
            new_steps = [self._run_call(c, revealed) for c in turn.calls]
        elif turn.answer is not None and turn.format_error is None:
            new_steps = [Step(index=len(self.steps), text=text, kind="answer", answer=turn.answer)]
        elif turn.format_error is not None:
            new_steps = [Step(index=len(self.steps), text=text, kind="malformed",
                              error=turn.format_error, error_kind="parse",
                              observation=f"Error: {turn.format_error}")]
        else:
            new_steps = [Step(index=len(self.steps), text=text, kind="text")]
        for i, step in enumerate(new_steps):
            step.index, step.text, step.hallucinated = len(self.steps) + i, text, turn.hallucinated
            step.turn, step.revealed = self.turns - 1, revealed
        self.steps += new_steps

        closes_turn = new_steps[0].kind == "answer" or (
            new_steps[0].kind == "text" and ended_with_eos)
        if new_steps[0].kind == "answer":
            self.answer = turn.answer
        if closes_turn and self.follow_ups:
            self._next_user_turn(self.follow_ups.pop(0), ended_with_eos)
            return
        if new_steps[0].kind == "answer":
            self._finish("answer")
            return
        if new_steps[0].kind == "text":
            self._finish("stop" if ended_with_eos else "max_tokens")
            return
        observations = [s.observation or "" for s in new_steps]
        self.messages += [{"role": "tool", "content": o} for o in observations]
        self._append_context(
            self.chat.observation_text(observations, turn_ended_with_eos=ended_with_eos))

    def _next_user_turn(self, messages: list[dict[str, str]], ended_with_eos: bool) -> None:
        self.messages += [dict(m) for m in messages]
        self._append_context(user_turn_text(self.chat, messages,
                                            turn_ended_with_eos=ended_with_eos))

    def _append_context(self, text: str) -> None:
        """Append environment text (mask 0), then end the episode if a limit is reached."""
        ids = self.chat.encode(text)
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        if self.turns >= self.config.max_turns:
            self._finish("max_turns")
        elif self.turn_budget() < 4:
            self._finish("max_tokens")

    def trajectory(self, **fields: Any) -> Trajectory:
        return Trajectory(
            task_id=self.task.task_id, messages=self.messages, token_ids=self.token_ids,
            loss_mask=self.loss_mask, logprobs=self.logprobs, steps=self.steps,
            finish_reason=self.finish_reason, answer=self.answer, prompt_len=self.prompt_len,
            **fields,
        )


_PROBE_USER = "\x00user-probe\x00"
_PROBE_ASSISTANT = "\x00assistant-probe\x00"


def user_turn_text(chat: ChatFormat, messages: list[dict[str, str]], *,
                   turn_ended_with_eos: bool) -> str:
    """The text that follows an assistant turn when the user speaks again: the assistant's end
    marker (unless the policy already produced eos), the chat template's rendering of `messages`
    and the next generation prompt. Read off the template by rendering a probe conversation."""
    base = [{"role": "user", "content": _PROBE_USER},
            {"role": "assistant", "content": _PROBE_ASSISTANT}]
    rendered = chat.render([*base, *messages], add_generation_prompt=True)
    text = rendered[rendered.index(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT):]
    if turn_ended_with_eos and text.startswith(chat.eos_token):
        text = text[len(chat.eos_token):]
    return text


def replay(task: Task, turns: list[str], tools: dict[str, Tool], chat: ChatFormat,
           parser: ToolCallParser, config: EnvConfig,
           follow_ups: list[list[dict[str, str]]] | None = None) -> Trajectory:
    """Run scripted assistant turns (a reference solution) through the environment, with no
    injected faults, producing the token trajectory a policy would have produced; used for SFT.
    `follow_ups` are the task's later user turns (`TaskFamily.follow_up_turns`). A task's prefix
    is replayed first (mask 0, see the module docstring), then `turns` (mask 1); neither limit
    cuts them. `tools` are left in the state the episode reached."""
    clean = config.model_copy(update={
        "faults": FaultConfig(), "max_tokens": 1 << 30,
        "max_turns": max(config.max_turns, len(task.prefix) + len(turns))})
    episode = Episode(task, tools, chat, parser, clean, random.Random(0), follow_ups)
    for text in turns:
        if episode.done:
            break
        ids = chat.assistant_ids(text)
        episode.add_policy_turn(ids, [0.0] * len(ids))
    return episode.trajectory()
