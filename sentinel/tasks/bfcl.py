"""`bfcl`: the multi-turn categories of the Berkeley Function Calling Leaderboard (BFCL v4), from
the `bfcl-eval` package (extra `bfcl`).

A spec names one entry of BFCL's data, `{"id": "multi_turn_base_12"}`. The entry gives the
involved API classes (GorillaFileSystem, MathAPI, MessageAPI, TwitterAPI, TicketAPI, TradingBot,
TravelAPI, VehicleControlAPI), their initial state, and the user turns; BFCL's possible-answer
file gives the ground-truth calls of each turn.

- Tools: every function of the involved classes' BFCL function docs (schemas converted to
  OpenAI/JSON-schema types the way BFCL's own handlers do), bound to one fresh instance per class
  per `tool_map(spec)` call, initialised from the entry (`_load_scenario`). A call's observation
  is the method's result as BFCL's executor stringifies it; arguments that do not bind, or a
  method that raises, are the policy's error (`BadArguments`).
- Turns: the first user turn is the prompt, the rest come from `follow_up_turns(spec)`; the
  environment appends the next one when the assistant closes a turn (an answer, or a text turn).
- Reference solution: the ground-truth calls, one per assistant turn, each user turn closed with
  `<answer>done</answer>`. Positional ground-truth arguments are named from the method signature.
- Success (`verify_trajectory`) is BFCL's multi-turn check: the calls the episode executed are
  re-executed, turn by turn, on fresh instances beside the ground-truth calls, and after every
  turn with ground truth (a) the turn must have made a call, (b) every public attribute of every
  instance must equal the ground truth's (`state_checker`), and (c) each ground-truth result of
  the turn must be among the results of all calls so far (`response_checker`); both checkers are
  bfcl-eval's own functions. Calls that never ran in the episode (unknown tool, injected fault,
  parse error) are not re-executed; the API classes are deterministic (seeded), so the replay is
  the episode's own state. `verify(task, answer)` cannot judge an episode from its answer and
  raises.

Categories: `multi_turn_base`, `multi_turn_miss_param`, `multi_turn_long_context` (the others
change the function list mid-conversation). Edits: `perturb` picks another entry of the same
category and API classes; `escalate` one with more ground-truth calls; no `decompose`.

Skills: `api:<Class>` per involved class, `turns:k`, `category:<base|miss_param|long_context>`.
Difficulty: the number of ground-truth calls.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import random
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from sentinel.env.tools import BadArguments, Tool
from sentinel.tasks.base import (
    MAX_INSTRUCTION_CHARS,
    FamilyConfig,
    ReferenceCall,
    ReferenceSolution,
    SpecError,
    TaskFamily,
)
from sentinel.types import Step, Task, Trajectory

CATEGORIES = ("multi_turn_base", "multi_turn_miss_param", "multi_turn_long_context")
CLOSING = "done"
NOT_EXECUTED = ("unknown_tool", "tool_error", "timeout", "parse")


def _bfcl_root() -> Path:
    try:
        import bfcl_eval
    except ImportError as exc:
        raise ImportError("the bfcl family needs the bfcl-eval package; see docs/families.md"
                          ) from exc
    return Path(bfcl_eval.__file__).parent


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@lru_cache(maxsize=8)
def load_category(category: str) -> dict[str, dict[str, Any]]:
    """id -> entry (with its `ground_truth` added) for one BFCL v4 multi-turn category."""
    if category not in CATEGORIES:
        raise SpecError(f"unsupported BFCL category {category!r}; supported: "
                        f"{', '.join(CATEGORIES)}")
    data = _bfcl_root() / "data"
    answers = {a["id"]: a["ground_truth"]
               for a in _read_jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    return {e["id"]: {**e, "ground_truth": answers[e["id"]]}
            for e in _read_jsonl(data / f"BFCL_v4_{category}.json")}


def _category(entry_id: str) -> str:
    return entry_id.rsplit("_", 1)[0]


def entry_for(spec: dict[str, Any]) -> dict[str, Any]:
    return load_category(_category(spec["id"]))[spec["id"]]


@lru_cache(maxsize=16)
def _func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    path = _bfcl_root() / "data" / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[
        class_name]
    return tuple(_read_jsonl(path))


def _json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """A BFCL parameter schema with Gorilla types mapped to JSON-schema types (BFCL's mapping;
    unknown types become strings, as BFCL's handlers do)."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    out = {k: v for k, v in node.items() if k not in ("type", "properties", "items")}
    out["type"] = GORILLA_TO_OPENAPI.get(node.get("type", "string"), "string")
    if "properties" in node:
        out["properties"] = {k: _json_schema(v) for k, v in node["properties"].items()}
    if "items" in node:
        out["items"] = _json_schema(node["items"])
    return out


def _stringify(result: Any) -> str:
    """A method's result as BFCL's executor records it."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def instances_for(entry: dict[str, Any]) -> dict[str, Any]:
    """Fresh instances of the entry's API classes in their initial state, as BFCL builds them."""
    from bfcl_eval.constants.executable_backend_config import (
        CLASS_FILE_PATH_MAPPING,
        STATELESS_CLASSES,
    )

    long_context = "long_context" in _category(entry["id"])
    instances = {}
    for class_name in entry["involved_classes"]:
        cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
        instance = cls()
        if class_name not in STATELESS_CLASSES:
            config = copy.deepcopy(entry["initial_config"].get(class_name, {}))
            instance._load_scenario(config, long_context=long_context)
        instances[class_name] = instance
    return instances


def _methods(entry: dict[str, Any], instances: dict[str, Any]) -> dict[str, tuple[Any, dict]]:
    """function name -> (bound method, BFCL function doc); a later class wins a name clash, as
    in BFCL's executor."""
    methods = {}
    for class_name in entry["involved_classes"]:
        for doc in _func_docs(class_name):
            methods[doc["name"]] = (getattr(instances[class_name], doc["name"]), doc)
    return methods


def execute(method: Any, arguments: dict[str, Any]) -> tuple[str, str | None]:
    """(result, error): the result string BFCL records for the call, and the error message when
    the arguments do not bind or the method raised (then the result is BFCL's error string)."""
    # a copy, as BFCL's eval of a call string makes fresh objects: the APIs keep and later
    # mutate argument lists (a tweet's `mentions`), which must not reach the caller's record
    arguments = copy.deepcopy(arguments)
    try:
        inspect.signature(method).bind(**arguments)
    except TypeError as exc:
        return f"Error during execution: {exc}", str(exc)
    try:
        return _stringify(method(**arguments)), None
    except Exception as exc:  # the API's own failure; BFCL records it the same way
        return f"Error during execution: {exc}", f"{type(exc).__name__}: {exc}"


class BFCLTool:
    """One BFCL function, bound to the episode's instance of its class."""

    def __init__(self, method: Any, doc: dict[str, Any]) -> None:
        self.method = method
        self.name: str = doc["name"]
        self.description: str = doc["description"]
        self.parameters: dict[str, Any] = _json_schema(doc["parameters"])

    def __call__(self, **arguments: Any) -> str:
        result, error = execute(self.method, arguments)
        if error is not None:
            raise BadArguments(f"{self.name}: {error}")
        return result


def parse_ground_truth(call: str, methods: dict[str, tuple[Any, dict]]) -> tuple[str, dict]:
    """`"mv(source='a', destination='b')"` -> ("mv", {...}); positional arguments are named from
    the method's signature."""
    node = ast.parse(call.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise SpecError(f"ground-truth call {call!r} is not a plain function call")
    name = node.func.id
    if name not in methods:
        raise SpecError(f"ground-truth call {call!r} names no function of the entry")
    params = list(inspect.signature(methods[name][0]).parameters)
    arguments = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    arguments |= {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    return name, arguments


def _turns_of(steps: list[Step], n_turns: int) -> list[list[Step]]:
    """`steps` split into user turns: a closing step (an answer or a text turn) ends one."""
    turns: list[list[Step]] = [[]]
    for step in steps:
        if step.kind in ("answer", "text"):
            turns.append([])
        else:
            turns[-1].append(step)
    return (turns + [[] for _ in range(n_turns)])[:n_turns]


def _executed(step: Step) -> bool:
    return (step.kind == "tool_call" and step.error_kind not in NOT_EXECUTED
            and isinstance(step.tool, str) and isinstance(step.arguments, dict))


class BFCLConfig(FamilyConfig):
    categories: list[str] = Field(default_factory=lambda: ["multi_turn_base"],
                                  description="BFCL v4 multi-turn categories to sample")
    instruction: str = Field(
        "You can call the functions listed. Do what the user asks with function calls, one call "
        "per message; when the request is done, reply <answer>done</answer>.",
        max_length=MAX_INSTRUCTION_CHARS,
        description="system message shown before each task",
    )

    @field_validator("categories")
    @classmethod
    def _categories(cls, v: list[str]) -> list[str]:
        if not v or any(c not in CATEGORIES for c in v):
            raise ValueError(f"categories must be a non-empty subset of {', '.join(CATEGORIES)}")
        return v


class BFCLFamily(TaskFamily):
    name = "bfcl"
    config_model = BFCLConfig
    config: BFCLConfig

    # -- tools and turns -----------------------------------------------------------------------
    def tools(self) -> list[Tool]:
        raise TypeError("bfcl tools belong to one entry: use tool_map(task.spec)")

    def tool_map(self, spec: dict[str, Any] | None = None) -> dict[str, Tool]:
        if spec is None:
            self.tools()
        entry = entry_for(spec)
        methods = _methods(entry, instances_for(entry))
        return {name: BFCLTool(method, doc) for name, (method, doc) in methods.items()}

    def follow_up_turns(self, spec: dict[str, Any]) -> list[list[dict[str, str]]]:
        return [list(turn) for turn in entry_for(spec)["question"][1:]]

    # -- specs ---------------------------------------------------------------------------------
    def validate_spec(self, spec: Any) -> dict[str, Any]:
        if not isinstance(spec, dict) or set(spec) != {"id"} or not isinstance(spec["id"], str):
            raise SpecError('bfcl spec must be {"id": "<BFCL entry id>"}')
        if spec["id"] not in load_category(_category(spec["id"])):
            raise SpecError(f"no BFCL entry {spec['id']!r}")
        return {"id": spec["id"]}

    def _ids(self) -> list[str]:
        return [i for c in self.config.categories for i in load_category(c)]

    def sample_spec(self, rng: random.Random) -> dict[str, Any]:
        return {"id": rng.choice(self._ids())}

    def render(self, spec: dict[str, Any]) -> list[dict[str, str]]:
        messages = [dict(m) for m in entry_for(spec)["question"][0]]
        if self.config.instruction:
            messages.insert(0, {"role": "system", "content": self.config.instruction})
        return messages

    def skills(self, spec: dict[str, Any]) -> list[str]:
        entry = entry_for(spec)
        category = _category(spec["id"]).removeprefix("multi_turn_")
        return sorted({*(f"api:{c}" for c in entry["involved_classes"]),
                       f"turns:{len(entry['question'])}", f"category:{category}"})

    def difficulty(self, spec: dict[str, Any]) -> float:
        return float(sum(len(t) for t in entry_for(spec)["ground_truth"]))

    # -- solving and checking ------------------------------------------------------------------
    def solve(self, spec: dict[str, Any], tools: dict[str, Tool]) -> ReferenceSolution:
        entry = entry_for(spec)
        methods = {name: (tool.method, {}) for name, tool in tools.items()
                   if isinstance(tool, BFCLTool)}
        solution = ReferenceSolution(answer=CLOSING, turn_sizes=[])
        for turn in entry["ground_truth"]:
            for call in turn:
                name, arguments = parse_ground_truth(call, methods)
                try:
                    observation = tools[name](**arguments)
                except BadArguments as exc:  # BFCL's ground truth may call into an error
                    observation = f"Error: {exc}"
                solution.calls.append(ReferenceCall(name, arguments, observation))
            solution.turn_sizes.append(len(turn))
        return solution

    def verify(self, task: Task, answer: str | None) -> bool:
        raise TypeError("a bfcl episode is judged by its calls, not its answer: "
                        "use verify_trajectory(task, trajectory) or check(spec, steps)")

    def verify_trajectory(self, task: Task, trajectory: Trajectory) -> bool:
        return self.check(task.spec, trajectory.steps)["valid"]

    def check(self, spec: dict[str, Any], steps: list[Step]) -> dict[str, Any]:
        """BFCL's multi-turn verdict on the calls in `steps` (see the module docstring):
        `{"valid": bool, "turn": failing user turn or None, "error_type": ..., ...}`."""
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
            response_checker,
            state_checker,
        )

        entry = entry_for(spec)
        model, truth = instances_for(entry), instances_for(entry)
        model_methods, truth_methods = _methods(entry, model), _methods(entry, truth)
        all_results: list[str] = []
        ground_truth = entry["ground_truth"]
        for t, (turn_steps, gt_calls) in enumerate(
                zip(_turns_of(steps, len(ground_truth)), ground_truth, strict=True)):
            calls = [s for s in turn_steps if _executed(s) and s.tool in model_methods]
            for step in calls:
                all_results.append(execute(model_methods[step.tool][0], step.arguments)[0])
            gt_results = []
            for call in gt_calls:
                name, arguments = parse_ground_truth(call, truth_methods)
                gt_results.append(execute(truth_methods[name][0], arguments)[0])
            if not gt_calls:
                continue
            if not calls:
                return {"valid": False, "turn": t,
                        "error_type": "multi_turn:empty_turn_model_response",
                        "error_message": f"no executed call in user turn {t}"}
            for result in (state_checker(model, truth),
                           response_checker(all_results, gt_results, t)):
                if not result["valid"]:
                    return {**result, "turn": t}
        return {"valid": True, "turn": None}

    def locate_error(self, task: Task, steps: list[Step]) -> int | None:
        """In the first user turn that fails BFCL's check: the first call that is not one of that
        turn's ground-truth calls, else the turn's last step."""
        verdict = self.check(task.spec, steps)
        if verdict["valid"]:
            return None
        entry = entry_for(task.spec)
        methods = _methods(entry, instances_for(entry))
        turn = verdict["turn"]
        expected = [parse_ground_truth(c, methods) for c in entry["ground_truth"][turn]]
        turn_steps = _turns_of(steps, len(entry["ground_truth"]))[turn]
        for step in turn_steps:
            if step.kind != "tool_call" or (step.tool, step.arguments) not in expected:
                return step.index
        return turn_steps[-1].index if turn_steps else (steps[-1].index if steps else None)

    # -- edits ---------------------------------------------------------------------------------
    def _siblings(self, spec: dict[str, Any]) -> list[str]:
        entry = entry_for(spec)
        classes = sorted(entry["involved_classes"])
        return [i for i, e in load_category(_category(spec["id"])).items()
                if sorted(e["involved_classes"]) == classes and i != spec["id"]]

    def perturb(self, spec: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        siblings = self._siblings(spec)
        if not siblings:
            raise SpecError(f"no other {_category(spec['id'])} entry uses the same API classes")
        return {"id": rng.choice(siblings)}

    def escalate(self, spec: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
        here = self.difficulty(spec)
        harder = [(self.difficulty({"id": i}), i) for i in self._siblings(spec)]
        harder = [(d, i) for d, i in harder if d > here]
        if not harder:
            return None
        least = min(d for d, _ in harder)
        return {"id": rng.choice(sorted(i for d, i in harder if d == least))}
