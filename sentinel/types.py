"""Core records shared by every part of Sentinel.

These are plain dataclasses that serialise to JSON-friendly dicts (`to_row`), which is the only
form the store (`task_store`) ever sees: `task_store` imports nothing from `sentinel`, so the
conversion lives here, next to the types.

- `Task`: one problem. Its id is a hash of (family, canonical spec, and the revealed prefix when
  there is one) so duplicates collapse.
- `Step`: one tool call (or answer, or other output) of an assistant turn and what the environment
  did with it.
- `Trajectory`: a whole rollout, token-in/token-out: `token_ids` are exactly the ids the policy was
  conditioned on or produced, `loss_mask` is 1 only on policy-produced tokens, `logprobs` are the
  sampling log-probs (0.0 where the mask is 0).
- `Failure`: why a failed trajectory failed (a mode of the taxonomy) and where (first bad step).
- `Candidate` / `Rejection`: what a generator proposes, and the record of one the validation
  pipeline refused.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import InitVar, asdict, dataclass, field
from typing import Any, Literal

Origin = Literal["seed", "generated", "eval"]
Split = Literal["train", "eval", "probe"]

FAILURE_MODES: tuple[str, ...] = (
    "format_error",
    "unknown_tool",
    "bad_arguments",
    "tool_error_unrecovered",
    "hallucinated_observation",
    "premature_answer",
    "wrong_answer",
    "no_answer",
    "loop",
)


def canonical_json(obj: Any) -> str:
    """Deterministic JSON (sorted keys, no spaces) used for hashing and storage."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def task_id_for(family: str, spec: dict[str, Any], prefix: list[str] | None = None,
                hint: str = "") -> str:
    """Content address of a task: the same family, spec, prefix and hint always give the same id.

    A task with an empty prefix hashes exactly as before prefixes existed (family and spec only),
    so stored ids stay stable; a non-empty prefix is part of the key, so the same spec started
    from another revealed state is another task; so is a non-empty hint.
    """
    key = f"{family}\x00{canonical_json(spec)}"
    if prefix:
        key += f"\x00{canonical_json(list(prefix))}"
    if hint:
        key += f"\x00hint\x00{hint}"
    return f"{family}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def cluster_id_for(family: str, skills: list[str] | tuple[str, ...], mode: str) -> str:
    """Id of a failure cluster: failures of one family, skill set and mode share it."""
    key = canonical_json([family, sorted(skills), mode])
    return f"cl-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


@dataclass
class Task:
    """One problem. `prefix` (empty for most tasks) holds assistant turn texts that the
    environment replays right after the prompt, tools really called, before the policy continues
    (a revealed start state, as the `restart` generator mines them from failed rollouts): those
    turns are context, never trained on (loss mask 0), and count towards the episode's turn and
    token limits. `hint` (empty for most tasks) is the revealed start of the policy's first own
    turn after them (AdaBack's partial reveal: the beginning of the reference's next turn, as the
    `restart` generator's `reveal` makes it): appended as context (mask 0), and the policy's turn
    continues it; the turn is parsed as hint + what the policy wrote."""

    family: str
    spec: dict[str, Any]
    prompt: list[dict[str, str]]
    answer: str
    skills: list[str]
    difficulty: float = 0.0
    origin: Origin = "seed"
    created_round: int = 0
    parent_task_id: str | None = None
    failure_ids: list[str] = field(default_factory=list)
    generator: str | None = None
    target_cluster_id: str | None = None
    probe_pass_rate: float | None = None
    prefix: list[str] = field(default_factory=list)
    task_id: str = ""
    hint: str = ""

    def __post_init__(self) -> None:
        if not self.task_id:
            self.task_id = task_id_for(self.family, self.spec, self.prefix, self.hint)

    def to_row(self) -> dict[str, Any]:
        """The store's row: JSON text for `spec`, `prompt` and `prefix` (None when empty)."""
        row = asdict(self)
        row["spec"] = canonical_json(self.spec)
        row["prompt"] = json.dumps(self.prompt, ensure_ascii=False)
        row["prefix"] = json.dumps(self.prefix, ensure_ascii=False) if self.prefix else None
        row["hint"] = self.hint or None
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        data = dict(row)
        data["spec"] = json.loads(data["spec"]) if isinstance(data["spec"], str) else data["spec"]
        if isinstance(data["prompt"], str):
            data["prompt"] = json.loads(data["prompt"])
        data["skills"] = list(data.get("skills") or [])
        data["failure_ids"] = list(data.get("failure_ids") or [])
        prefix = data.get("prefix")
        data["prefix"] = list(json.loads(prefix) if isinstance(prefix, str) else prefix or [])
        data["hint"] = data.get("hint") or ""
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


StepKind = Literal["tool_call", "answer", "malformed", "text"]
ErrorKind = Literal["parse", "unknown_tool", "bad_arguments", "tool_error", "timeout"]


@dataclass
class Step:
    """One call (or answer, or other output) of an assistant turn. `kind` says what the parser
    found in `text`, the whole turn's text; a turn with several calls gives several steps, all
    with the same `turn` (the 0-based assistant turn of the episode).

    `error`/`error_kind` are set when the turn could not be executed as intended: the call did not
    parse (`parse`), named no known tool (`unknown_tool`), had invalid arguments (`bad_arguments`),
    or the tool itself failed (`tool_error`, `timeout`, e.g. an injected fault). `hallucinated` is
    True when the policy wrote an observation (`<tool_response>`) itself. `revealed` is True for
    the steps of a task's prefix (`Task.prefix`): replayed by the environment, not the policy's
    doing, so the reward never charges them and the analyzer never blames them.
    """

    index: int
    text: str
    kind: StepKind
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    observation: str | None = None
    error: str | None = None
    error_kind: ErrorKind | None = None
    hallucinated: bool = False
    answer: str | None = None
    turn: int = 0
    revealed: bool = False

    def to_row(self, traj_id: str) -> dict[str, Any]:
        row = asdict(self)
        row["arguments"] = None if self.arguments is None else canonical_json(self.arguments)
        row["step"] = row.pop("index")
        row["traj_id"] = traj_id
        return row


FinishReason = Literal["answer", "stop", "max_turns", "max_tokens"]


@dataclass
class Trajectory:
    task_id: str
    messages: list[dict[str, str]]
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    steps: list[Step]
    finish_reason: FinishReason
    answer: str | None = None
    prompt_len: int = 0
    reward: float = 0.0
    reward_terms: dict[str, float] = field(default_factory=dict)
    success: bool = False
    round: int = 0
    split: Split = "train"
    group_id: str = ""
    sample_idx: int = 0
    traj_id: str = field(default_factory=lambda: new_id("traj"))

    @property
    def n_policy_tokens(self) -> int:
        return int(sum(self.loss_mask))

    def to_row(self) -> dict[str, Any]:
        return {
            "traj_id": self.traj_id,
            "round": self.round,
            "split": self.split,
            "task_id": self.task_id,
            "group_id": self.group_id,
            "sample_idx": self.sample_idx,
            "messages": json.dumps(self.messages, ensure_ascii=False),
            "token_ids": list(self.token_ids),
            "loss_mask": list(self.loss_mask),
            "prompt_len": self.prompt_len,
            "n_tokens": len(self.token_ids),
            "n_policy_tokens": self.n_policy_tokens,
            "n_turns": len(self.steps),
            "finish_reason": self.finish_reason,
            "answer": self.answer,
            "reward": self.reward,
            "reward_terms": canonical_json(self.reward_terms),
            "success": self.success,
        }


@dataclass
class Failure:
    traj_id: str
    task_id: str
    round: int
    mode: str
    first_error_step: int | None
    evidence: str
    skills: list[str]
    family: str = ""
    cluster_id: str = ""
    failure_id: str = field(default_factory=lambda: new_id("fail"))

    def __post_init__(self) -> None:
        if not self.cluster_id:
            self.cluster_id = cluster_id_for(self.family, self.skills, self.mode)

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Candidate:
    """A task proposed by a generator, before validation.

    `answer` is the generator's claim; when given, the validation pipeline checks it against the
    family's reference solution and rejects the candidate when they differ. `prefix` is the
    task's revealed start state (`Task.prefix`, and `Task.hint`, the revealed start of the next
    turn); the pipeline replays it before accepting it.

    `generator=` (removed: the runner records which generator made each task) is still accepted,
    with a `DeprecationWarning`, and ignored; it goes in the next release.
    """

    family: str
    spec: dict[str, Any]
    answer: str | None = None
    parent_task_id: str | None = None
    failure_ids: list[str] = field(default_factory=list)
    prefix: list[str] = field(default_factory=list)
    hint: str = ""
    generator: InitVar[str | None] = None

    def __post_init__(self, generator: str | None) -> None:
        if generator is not None:
            import warnings

            warnings.warn("Candidate(generator=...) is deprecated and ignored: the runner records "
                          "which generator made each task (docs/generators.md)",
                          DeprecationWarning, stacklevel=3)


@dataclass
class Rejection:
    round: int
    generator: str
    family: str
    spec: str
    reason: str
    detail: str = ""
    parent_task_id: str | None = None
    rejection_id: str = field(default_factory=lambda: new_id("rej"))

    def to_row(self) -> dict[str, Any]:
        return asdict(self)
