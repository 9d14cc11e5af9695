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
_PROBE_TOOL = {"type": "function", "function": {
    "name": "x_probe_tool_x", "description": "", "parameters": {"type": "object",
                                                                "properties": {}}}}

# Hermes / Qwen2.5's tools block, for chat templates that do not render `tools` themselves.
TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def tools_block(tools: list[dict]) -> str:
    """The system text that lists `tools` (their JSON schemas, one per line) and the call
    syntax, as Hermes and Qwen2.5's chat templates write it."""
    import json

    return TOOLS_BLOCK.format(tools="\n".join(json.dumps(t) for t in tools))


def with_tools_block(messages: list[dict[str, str]], tools: list[dict]) -> list[dict[str, str]]:
    """`messages` with the tools block at the end of the system message (one is added first
    when there is none)."""
    block = tools_block(tools)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{block}" if first["content"] else block
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


class ChatFormat:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token
        if eos is None:
            raise ValueError("the tokenizer has no eos token; cannot delimit assistant turns")
        self.eos_token: str = eos
        self.eos_token_id: int = tokenizer.convert_tokens_to_ids(eos)
        self.renders_tools = self._template_renders_tools()
        self._obs_template = self._observation_template()

    def _template_renders_tools(self) -> bool:
        """Whether the chat template shows the model its `tools` (SmolLM2's and many small
        models' templates drop them): a probe tool's name appears in the rendering."""
        probe = [{"role": "user", "content": _PROBE_USER}]
        rendered = self.tokenizer.apply_chat_template(
            probe, tools=[_PROBE_TOOL], add_generation_prompt=True, tokenize=False)
        return _PROBE_TOOL["function"]["name"] in rendered

    def render(self, messages: list[dict[str, str]], tools: list[dict] | None = None, *,
               add_generation_prompt: bool) -> str:
        """The chat template's text. Where the template does not render `tools`, they are
        listed in the system message instead (`tools_block`), so the model is told its tools
        whatever its template does."""
        if tools and not self.renders_tools:
            messages, tools = with_tools_block(messages, tools), None
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
