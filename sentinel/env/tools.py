"""Tools the policy can call.

A tool is an object with a `name`, a `description`, a JSON-schema `parameters` dict (the form chat
templates expect) and `__call__(**arguments) -> str`. It signals problems with two exceptions so
the environment, the reward and the analyzer can tell them apart:

- `BadArguments`: the call itself is wrong (missing/extra argument, wrong type, malformed
  expression). The policy's fault.
- `ToolFailure`: the call was fine but the tool failed (a service error, a timeout, an injected
  fault). Retrying may work.

Built-in tools: `Calculator` and `Python` (model-written code in the sandbox of
`sentinel.env.sandbox`; its refusals and limits are `ToolFailure`s with a short reason such as
"blocked: network access", and code that raises is `BadArguments`, the policy's fault).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from sentinel.env.calculator import CalcError, calculate
from sentinel.env.sandbox import CodeRejected, SandboxLimits, check_code, run_python


class BadArguments(ValueError):
    """The arguments do not fit the tool's schema or cannot be interpreted."""


class ToolFailure(RuntimeError):
    """The tool could not answer this time (service error, timeout)."""

    def __init__(self, message: str, *, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


class NoSuchTool(LookupError):
    """Raised by a tool object to say that, at this point of the episode, it does not exist under
    the name it was called by (a tool renamed mid-episode: the old name, or the new one before it
    is announced). The environment reports it as an `unknown_tool` error with this message."""


class Tool(Protocol):
    name: str
    description: str
    parameters: dict[str, Any]

    def __call__(self, **arguments: Any) -> str: ...


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI/Hermes function schema that chat templates render."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def check_arguments(tool: Tool, arguments: dict[str, Any]) -> None:
    """Validate arguments against the tool's (flat) JSON schema: required keys present, no unknown
    keys, primitive types right. Raises `BadArguments` naming the problem."""
    props: dict[str, Any] = tool.parameters.get("properties", {})
    missing = [k for k in tool.parameters.get("required", []) if k not in arguments]
    if missing:
        raise BadArguments(f"missing argument(s) {', '.join(missing)} for {tool.name}")
    unknown = [k for k in arguments if k not in props]
    if unknown:
        raise BadArguments(f"unknown argument(s) {', '.join(unknown)} for {tool.name}")
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool}
    for key, value in arguments.items():
        expected = types.get(props[key].get("type", ""))
        if expected is not None and not isinstance(value, expected):
            raise BadArguments(f"argument {key!r} of {tool.name} must be {props[key]['type']}")


class Calculator:
    name = "calculator"
    description = "Evaluate an integer arithmetic expression with + - * / and parentheses."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 12*(3+4)"}},
        "required": ["expression"],
    }

    def __call__(self, **arguments: Any) -> str:
        check_arguments(self, arguments)
        try:
            return calculate(arguments["expression"])
        except CalcError as exc:
            raise BadArguments(str(exc)) from exc


class Python:
    """Runs a program in the sandbox and returns what it printed (stdout, then stderr if any),
    cut to its last `max_result_chars` characters. The program raising, or exiting non-zero, is
    `BadArguments` (`line N: Type: message`); a timeout, a limit, a blocked operation or a crash
    is `ToolFailure` with the sandbox's reason."""

    name = "python"
    description = (
        "Run a short Python 3 program (standard library only; no network, no processes, files "
        "only in its working directory) and return what it prints."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "a program; print the result"}},
        "required": ["code"],
    }

    def __init__(self, limits: SandboxLimits | None = None,
                 max_result_chars: int = 2000) -> None:
        self.limits = limits or SandboxLimits()
        self.max_result_chars = max_result_chars

    def __call__(self, **arguments: Any) -> str:
        check_arguments(self, arguments)
        try:
            code = check_code(arguments["code"], self.limits)
        except CodeRejected as exc:
            raise BadArguments(str(exc)) from exc
        result = run_python(code, self.limits)
        if result.status == "error":
            raise BadArguments(result.reason)
        if result.status != "ok":
            raise ToolFailure(result.reason, timeout=result.status == "timeout")
        text = result.stdout.rstrip("\n")
        if result.stderr.strip():
            text = f"{text}\n{result.stderr.rstrip()}" if text else result.stderr.rstrip()
        if len(text) > self.max_result_chars:
            text = "..." + text[-(self.max_result_chars - 3):]
        return text
