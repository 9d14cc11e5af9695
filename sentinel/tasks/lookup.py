"""`lookup`: multi-hop questions over a generated fact table, solved with `lookup` (and
`calculator` for `compute` questions).

The world is a small table of people, companies and cities, generated from `spec["seed"]` alone
(so any stored task regenerates the same table). Entity attributes:

| type | attribute | value |
|---|---|---|
| person | `city`, `job`, `age` | a city, a company, a number |
| company | `ceo`, `city`, `staff` | a person, a city, a number |
| city | `mayor`, `pop` | a person, a number |

A chain is a start entity and a path of attributes, each one looked up on the previous value:
`["Acme", "ceo", "city", "pop"]` asks "pop of city of ceo of Acme" and the reference solution
calls `lookup(Acme, ceo)` → `lookup(Ana, city)` → `lookup(Lyon, pop)`. A spec:

    {"seed": 17, "chains": [["Acme", "ceo", "city", "pop"]], "op": null, "fault": false}

`op` (`+` or `-`) makes a `compute` question over two chains that end in numbers: the reference
looks both up, then calls the calculator once. `fault: true` makes the first tool call of every
episode of the task fail transiently (`fail_first_call`), so the reference solution retries once:
that is the `recover:tool_error` skill, trainable through SFT and taggable; the environment's
random faults (`env.faults`) stay untagged. Distractors: the name pools hold near-twins (Ana/Ann,
Orb/Orbo), so a sloppily copied name lands on a real but wrong entity instead of an error.

Skills: `hops:k` (the longest chain), `attr:<name>` per attribute asked, `compute`,
`recover:tool_error`. Names are short on purpose: the tiny char-level policy pays per character.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from sentinel.env.tools import BadArguments, Calculator, Tool, ToolFailure, check_arguments
from sentinel.tasks.base import (
    MAX_INSTRUCTION_CHARS,
    FamilyConfig,
    ReferenceCall,
    ReferenceSolution,
    SpecError,
    TaskFamily,
    fail_first_call,
)
from sentinel.types import Step, Task

PEOPLE = ("Ana", "Ann", "Bo", "Bob", "Cy", "Dee", "Eli", "Eve", "Gus", "Ian", "Ivy", "Jo", "Joe",
          "Kai", "Lea", "Leo", "Max", "Mia", "Ned", "Ola", "Pia", "Ray", "Roy", "Sam", "Sue",
          "Tim", "Tom", "Uma", "Val", "Zoe")
COMPANIES = ("Acme", "Apex", "Bolt", "Core", "Dyna", "Flux", "Hexa", "Jolt", "Kite", "Lume",
             "Nova", "Orb", "Orbo", "Pike", "Rune", "Sage", "Vex", "Volt", "Zed", "Zest")
CITIES = ("Agra", "Baku", "Bern", "Bonn", "Doha", "Graz", "Kobe", "Lima", "Linz", "Lyon", "Metz",
          "Nice", "Oslo", "Pune", "Riga", "Rome")
# attribute -> (type it belongs to, type of its value; "num" for numbers)
ATTRIBUTES: dict[str, tuple[str, str]] = {
    "city": ("person", "city"), "job": ("person", "company"), "age": ("person", "num"),
    "ceo": ("company", "person"), "staff": ("company", "num"),
    "mayor": ("city", "person"), "pop": ("city", "num"),
}
# `city` belongs to people and companies alike
SHARED = {"city": ("person", "company")}
NUMBER_RANGES = {"age": (18, 80), "staff": (5, 500), "pop": (10, 999)}
NATURAL = {"city": "the city", "job": "the employer", "age": "the age", "ceo": "the CEO",
           "staff": "the staff count", "mayor": "the mayor", "pop": "the population"}
MAX_HOPS = 4
MAX_TRIES = 200


class LookupConfig(FamilyConfig):
    min_hops: int = Field(1, ge=1, le=MAX_HOPS, description="fewest lookups in a chain")
    max_hops: int = Field(2, ge=1, le=MAX_HOPS, description="most lookups in a chain")
    compute_share: float = Field(0.25, ge=0, le=1, description="share of compute questions")
    fault_share: float = Field(0.2, ge=0, le=1, description="share of tasks whose first call fails")
    people: int = Field(12, ge=2, le=len(PEOPLE), description="people in a world")
    companies: int = Field(8, ge=2, le=len(COMPANIES), description="companies in a world")
    cities: int = Field(6, ge=2, le=len(CITIES), description="cities in a world")
    style: Literal["terse", "natural"] = Field("natural", description="question wording")
    instruction: str = Field(
        "Answer with the lookup tool (one fact per call) and the calculator. If a tool fails, "
        "call it again. End with <answer>...</answer>.",
        max_length=MAX_INSTRUCTION_CHARS,
        description="system message shown before each task",
    )

    @model_validator(mode="after")
    def _check(self) -> LookupConfig:
        if self.min_hops > self.max_hops:
            raise ValueError(f"min_hops ({self.min_hops}) must not exceed max_hops "
                             f"({self.max_hops})")
        return self


World = dict[str, dict[str, str]]  # entity -> attribute -> value


def _type_of(entity: str) -> str:
    return "person" if entity in PEOPLE else "company" if entity in COMPANIES else "city"


@lru_cache(maxsize=4096)
def _world(seed: int, n_people: int, n_companies: int, n_cities: int) -> World:
    rng = random.Random(seed)
    people = rng.sample(PEOPLE, n_people)
    companies = rng.sample(COMPANIES, n_companies)
    cities = rng.sample(CITIES, n_cities)
    world: World = {}
    for p in people:
        world[p] = {"city": rng.choice(cities), "job": rng.choice(companies),
                    "age": str(rng.randint(*NUMBER_RANGES["age"]))}
    for c in companies:
        world[c] = {"ceo": rng.choice(people), "city": rng.choice(cities),
                    "staff": str(rng.randint(*NUMBER_RANGES["staff"]))}
    for c in cities:
        world[c] = {"mayor": rng.choice(people), "pop": str(rng.randint(*NUMBER_RANGES["pop"]))}
    return world


def _attributes_of(kind: str) -> list[str]:
    return [a for a, (owner, _) in ATTRIBUTES.items() if owner == kind or kind in SHARED.get(a, ())]


def _value_type(attribute: str) -> str:
    return ATTRIBUTES[attribute][1]


class LookupTool:
    """`lookup(entity, attribute)` over one world. An unknown entity or attribute is the caller's
    mistake (`BadArguments`, naming what exists)."""

    name = "lookup"
    description = "Look up one attribute of a person, company or city."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "entity": {"type": "string", "description": "a person, company or city, e.g. Acme"},
            "attribute": {"type": "string",
                          "description": "person: city, job, age; company: ceo, city, staff; "
                                         "city: mayor, pop"},
        },
        "required": ["entity", "attribute"],
    }

    def __init__(self, world: World) -> None:
        self.world = world

    def __call__(self, **arguments: Any) -> str:
        check_arguments(self, arguments)
        entity, attribute = arguments["entity"].strip(), arguments["attribute"].strip()
        if entity not in self.world:
            raise BadArguments(f"unknown entity {entity!r}")
        facts = self.world[entity]
        if attribute not in facts:
            raise BadArguments(f"{entity} has no {attribute!r}; it has {', '.join(facts)}")
        return facts[attribute]


class LookupFamily(TaskFamily):
    name = "lookup"
    config_model = LookupConfig
    config: LookupConfig

    def world(self, seed: int) -> World:
        return _world(seed, self.config.people, self.config.companies, self.config.cities)

    def tools(self) -> list[Tool]:
        """Tools over world 0; episodes use `tool_map(spec)`, which binds the spec's world."""
        return [LookupTool(self.world(0)), Calculator()]

    def tool_map(self, spec: dict[str, Any] | None = None) -> dict[str, Tool]:
        if spec is None:
            return super().tool_map()
        tools: dict[str, Tool] = {"lookup": LookupTool(self.world(spec["seed"])),
                                  "calculator": Calculator()}
        return fail_first_call(tools) if spec.get("fault") else tools

    # -- validation ----------------------------------------------------------------------------
    def _resolve(self, world: World, chain: list[str]) -> list[str]:
        """The values along `chain`; raises SpecError where it breaks."""
        values, current = [], chain[0]
        for attribute in chain[1:]:
            facts = world.get(current)
            if facts is None or attribute not in facts:
                raise SpecError(f"{current!r} has no attribute {attribute!r} in this world")
            current = facts[attribute]
            values.append(current)
        return values

    def validate_spec(self, spec: Any) -> dict[str, Any]:
        shape = 'lookup spec must be {"seed": int, "chains": [[entity, attr, ...], ...], ' \
                '"op": null|"+"|"-", "fault": bool}'
        if not isinstance(spec, dict) or set(spec) != {"seed", "chains", "op", "fault"}:
            raise SpecError(shape)
        seed, chains, op, fault = spec["seed"], spec["chains"], spec["op"], spec["fault"]
        if (not isinstance(seed, int) or isinstance(seed, bool) or not isinstance(fault, bool)
                or not isinstance(chains, list) or op not in (None, "+", "-")):
            raise SpecError(shape)
        if len(chains) != (1 if op is None else 2):
            raise SpecError("a lookup question has one chain, a compute question (op) two")
        world = self.world(seed)
        for chain in chains:
            if (not isinstance(chain, list) or not 2 <= len(chain) <= MAX_HOPS + 1
                    or not all(isinstance(x, str) for x in chain)):
                raise SpecError(f"a chain is [entity, attribute, ...] with 1 to {MAX_HOPS} "
                                f"attributes, got {chain!r}")
            if chain[0] not in world:
                raise SpecError(f"entity {chain[0]!r} is not in world {seed}")
            values = self._resolve(world, chain)
            if op is not None and not values[-1].isdigit():
                raise SpecError(f"compute chains must end in a number; {chain!r} does not")
        return {"seed": seed, "chains": [list(c) for c in chains], "op": op, "fault": fault}

    # -- sampling ------------------------------------------------------------------------------
    def _random_chain(self, rng: random.Random, world: World, hops: int,
                      numeric: bool) -> list[str] | None:
        chain = [rng.choice(sorted(world))]
        kind = _type_of(chain[0])
        for i in range(hops):
            last = i == hops - 1
            if last and numeric:
                options = [a for a in _attributes_of(kind) if _value_type(a) == "num"]
            else:  # inner hops lead to entities; a free last hop may be anything
                options = [a for a in _attributes_of(kind) if last or _value_type(a) != "num"]
            if not options:
                return None
            attribute = rng.choice(options)
            chain.append(attribute)
            kind = _value_type(attribute)
        return chain

    def _sample_chain(self, rng: random.Random, world: World, hops: int,
                      numeric: bool) -> list[str]:
        for _ in range(MAX_TRIES):
            chain = self._random_chain(rng, world, hops, numeric)
            if chain is not None:
                return chain
        raise SpecError(f"could not sample a {hops}-hop chain")

    def sample_spec(self, rng: random.Random) -> dict[str, Any]:
        cfg = self.config
        seed = rng.randrange(1 << 30)
        world = self.world(seed)
        compute = rng.random() < cfg.compute_share
        n = 2 if compute else 1
        chains = [self._sample_chain(rng, world, rng.randint(cfg.min_hops, cfg.max_hops),
                                     compute) for _ in range(n)]
        return self.validate_spec({"seed": seed, "chains": chains,
                                   "op": rng.choice("+-") if compute else None,
                                   "fault": rng.random() < cfg.fault_share})

    # -- rendering and tags --------------------------------------------------------------------
    def _phrase(self, chain: list[str]) -> str:
        words = [a if self.config.style == "terse" else NATURAL[a] for a in reversed(chain[1:])]
        return " of ".join([*words, chain[0]])

    def render(self, spec: dict[str, Any]) -> list[dict[str, str]]:
        parts = [self._phrase(c) for c in spec["chains"]]
        if spec["op"] is None:
            body = parts[0]
        else:
            word = {"+": "plus", "-": "minus"}[spec["op"]]
            body = f"{parts[0]} {spec['op'] if self.config.style == 'terse' else word} {parts[1]}"
        question = f"{body}?" if self.config.style == "terse" else f"What is {body}?"
        messages = [{"role": "user", "content": question}]
        if self.config.instruction:
            messages.insert(0, {"role": "system", "content": self.config.instruction})
        return messages

    def skills(self, spec: dict[str, Any]) -> list[str]:
        tags = {f"hops:{max(len(c) - 1 for c in spec['chains'])}"}
        tags |= {f"attr:{a}" for c in spec["chains"] for a in c[1:]}
        if spec["op"] is not None:
            tags.add("compute")
        if spec["fault"]:
            tags.add("recover:tool_error")
        return sorted(tags)

    def difficulty(self, spec: dict[str, Any]) -> float:
        lookups = sum(len(c) - 1 for c in spec["chains"])
        return float(lookups + (spec["op"] is not None) + 0.5 * spec["fault"])

    # -- solving and checking ------------------------------------------------------------------
    def _call(self, solution: ReferenceSolution, tools: dict[str, Tool], name: str,
              arguments: dict[str, Any]) -> str:
        """Call a tool like the reference agent does: retry once after a transient failure."""
        for _ in range(2):
            try:
                observation = tools[name](**arguments)
            except ToolFailure as exc:
                solution.calls.append(ReferenceCall(name, dict(arguments), f"Error: {exc}"))
                continue
            except BadArguments as exc:
                raise SpecError(f"{name}({arguments}) failed: {exc}") from exc
            solution.calls.append(ReferenceCall(name, dict(arguments), observation))
            return observation
        raise SpecError(f"{name} failed twice in a row")

    def solve(self, spec: dict[str, Any], tools: dict[str, Tool]) -> ReferenceSolution:
        solution = ReferenceSolution()
        results = []
        for chain in spec["chains"]:
            current = chain[0]
            for attribute in chain[1:]:
                current = self._call(solution, tools, "lookup",
                                     {"entity": current, "attribute": attribute})
            results.append(current)
        if spec["op"] is not None:
            expression = f"{results[0]}{spec['op']}{results[1]}"
            results = [self._call(solution, tools, "calculator", {"expression": expression})]
        solution.answer = results[-1]
        return solution

    def verify(self, task: Task, answer: str | None) -> bool:
        return answer is not None and answer.strip().lower() == task.answer.strip().lower()

    def locate_error(self, task: Task, steps: list[Step]) -> int | None:
        """First step that is not progress: a call that is not one of the reference's calls
        (a wrong entity, e.g. a distractor twin, a wrong attribute, a wrong expression), a call
        with an error of the policy's making, or a wrong final answer. Transient tool failures
        are not the policy's error and are skipped."""
        reference = self.solve(task.spec, self.tool_map(task.spec))
        expected = {(c.tool, tuple(sorted(c.arguments.items()))) for c in reference.calls}
        for step in steps:
            if step.kind == "answer":
                return None if self.verify(task, step.answer) else step.index
            if step.kind != "tool_call":
                return step.index
            if step.error_kind in ("tool_error", "timeout"):
                continue
            args = step.arguments if isinstance(step.arguments, dict) else {}
            key = (step.tool, tuple(sorted((k, str(v)) for k, v in args.items())))
            if step.error is not None or key not in expected:
                return step.index
        return steps[-1].index if steps else None

    # -- edits ---------------------------------------------------------------------------------
    def perturb(self, spec: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        """A new world (seed) with the same attribute paths, op and fault flag; each chain starts
        at an entity of the same type."""
        for _ in range(MAX_TRIES):
            seed = rng.randrange(1 << 30)
            world = self.world(seed)
            chains = []
            for chain in spec["chains"]:
                kind = _type_of(chain[0])
                chains.append([rng.choice(sorted(e for e in world if _type_of(e) == kind)),
                               *chain[1:]])
            candidate = {**spec, "seed": seed, "chains": chains}
            try:
                candidate = self.validate_spec(candidate)
            except SpecError:
                continue
            if candidate != spec:
                return candidate
        raise SpecError(f"no valid perturbation of {spec!r}")

    def decompose(self, spec: dict[str, Any], step: int) -> dict[str, Any] | None:
        """The question whose answer is the reference's observation at `step`: a prefix of the
        chain being walked (the fault flag is kept). None for the final step and out of range."""
        prefixes = [c[:k] for c in spec["chains"] for k in range(2, len(c) + 1)]
        if spec["op"] is not None:
            prefixes.append(None)  # the calculator step: the whole question
        if spec["fault"]:
            prefixes.insert(0, prefixes[0])  # the failed first call and its retry
        if not 0 <= step < len(prefixes) or prefixes[step] is None:
            return None
        sub = {**spec, "chains": [prefixes[step]], "op": None}
        return None if sub == spec else self.validate_spec(sub)

    def escalate(self, spec: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
        """One more hop: a new start entity whose attribute leads to the old start (chains are
        tried in random order); None when every chain has `MAX_HOPS` hops or no entity leads
        to a start."""
        world = self.world(spec["seed"])
        order = list(range(len(spec["chains"])))
        rng.shuffle(order)
        for i in order:
            chain = spec["chains"][i]
            if len(chain) - 1 >= MAX_HOPS:
                continue
            sources = [(e, a) for e, facts in sorted(world.items()) for a, v in facts.items()
                       if v == chain[0] and _value_type(a) != "num"]
            if not sources:
                continue
            entity, attribute = rng.choice(sources)
            chains = [list(c) for c in spec["chains"]]
            chains[i] = [entity, attribute, *chain[1:]]
            return self.validate_spec({**spec, "chains": chains})
        return None
