"""Token-level chat formatting for multi-turn rollouts.

Rollouts are token-in/token-out: the ids the policy produced are kept as they are, and only the
text the environment adds (the prompt, tool observations, the next generation prompt) is
tokenised. What that text looks like is read off the model's own chat template by rendering a
conversation with and without the tool messages and taking the difference, so any HF chat model
(Qwen, Llama, the embedded tiny policy) gets exactly the framing it was trained with.
"""

from __future__ import annotations

from typing import Any

_PROBE_USER = "\x00user-probe\x00"
_PROBE_ASSISTANT = "\x00assistant-probe\x00"
_PROBE_OBS = "\x00observation-probe\x00"


class ChatFormat:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token
        if eos is None:
            raise ValueError("the tokenizer has no eos token; cannot delimit assistant turns")
        self.eos_token: str = eos
        self.eos_token_id: int = tokenizer.convert_tokens_to_ids(eos)
        self._obs_template = self._observation_template()

    def render(self, messages: list[dict[str, str]], tools: list[dict] | None = None, *,
               add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def prompt_ids(self, messages: list[dict[str, str]], tools: list[dict] | None) -> list[int]:
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def _observation_template(self) -> tuple[str, str, str]:
        """(before, between, after): the text around tool outputs after an assistant turn.

        `before` starts right after the assistant's content (so it begins with the end-of-turn
        marker), `between` separates consecutive tool outputs and `after` ends with the next
        generation prompt.
        """
        base = [{"role": "user", "content": _PROBE_USER},
                {"role": "assistant", "content": _PROBE_ASSISTANT}]
        one = self.render([*base, {"role": "tool", "content": _PROBE_OBS}],
                          add_generation_prompt=True)
        two = self.render([*base, {"role": "tool", "content": _PROBE_OBS},
                           {"role": "tool", "content": _PROBE_OBS}], add_generation_prompt=True)
        start = one.index(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT)
        before, _, after = one[start:].partition(_PROBE_OBS)
        first = two.index(_PROBE_OBS) + len(_PROBE_OBS)
        between = two[first:two.index(_PROBE_OBS, first)]
        return before, between, after

    def observation_text(self, observations: list[str], *, turn_ended_with_eos: bool) -> str:
        """The text that follows an assistant turn: its end marker (unless the policy already
        produced the eos token), the tool outputs, and the next generation prompt."""
        before, between, after = self._obs_template
        if turn_ended_with_eos and before.startswith(self.eos_token):
            before = before[len(self.eos_token):]
        return before + between.join(observations) + after

    def assistant_ids(self, text: str) -> list[int]:
        """Ids of a scripted assistant turn (reference solutions): the text then eos."""
        return [*self.encode(text), self.eos_token_id]
