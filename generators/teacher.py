"""`teacher`: a language model writes new task specs aimed at the round's failure clusters.

Per round, the `clusters` biggest failure clusters (`ctx.clusters`, rows of the `clusters` table;
when the loop gives none, they are rebuilt from `ctx.failures` by `cluster_id` with a one-line
summary) each get one prompt, rendered from a jinja2 template (`templates/teacher.j2`, or the
config's `template:` path) with:

- `cluster`: the cluster row (`summary`, `skills`, `mode`, `n_failures`, `share`, `trend`, ...);
- `family`: the cluster's family name;
- `examples`: few-shot lines `{"family": ..., "spec": {...}}` built from the cluster's *real*
  failed tasks (then `family.perturb` variants of them, up to `shots` lines), so even a model that
  was never told the spec format sees it, and the prompt ends where the next line would start.

The model (`model:` a local Hugging Face causal-LM directory or hub id, loaded once; `policy`:
the loop's current policy, `ctx.policy = (model, tokenizer)`; or `tiny`: the embedded spec writer,
which `sentinel.spec_writer` builds, trains and hands over with `bind(model, tokenizer)`, since a
generator neither builds policies nor trains) samples `samples` completions per prompt. Each
completion is parsed (`parse_specs`) for JSON task specs, one object per line or a JSON list;
every `{"family": str, "spec": ...}` object becomes a `Candidate` (with `answer` when it gives a
string one) aimed at the cluster: parent = the cluster's first failed task, failure
ids = the cluster's failures. What cannot be read (a line with JSON-like text but no valid spec
object, or a completion with nothing at all) is yielded as `Unparseable` and stored as a
rejection `unparseable`: garbage never crashes the round and is never silently dropped. Parsed
specs then pass validation like any candidate (schema, re-solved with the tools, dedup, probe).

Sampling is seeded from `ctx.rng` inside `torch.random.fork_rng`, so a run is reproducible and
the teacher does not disturb the training's global random state. The prompt is cut from the
left to fit the model's context (`max_position_embeddings - max_new_tokens`).

Simplifications: one prompt per cluster (no cross-cluster prompts), plain completion by default
(`chat: true` wraps the prompt as a user turn with the tokenizer's chat template, for instruct
models), no constrained decoding.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from generators.base import (
    BaseGenerator,
    GenerationContext,
    GeneratorConfig,
    Unparseable,
)
from sentinel.tasks import SpecError
from sentinel.types import Candidate, Failure, Task

DEFAULT_TEMPLATE = Path(__file__).parent / "templates" / "teacher.j2"
# The embedded teacher's prompt: the cluster's family, skills and mode, then the few-shot lines
# (a 2-layer model reads every character; the prose of teacher.j2 would only cost it time).
TINY_TEMPLATE = Path(__file__).parent / "templates" / "teacher_tiny.j2"
MAX_PROBLEM_CHARS = 300


class TeacherConfig(GeneratorConfig):
    type: str = Field("teacher", description="the generator: teacher")
    model: str = Field(
        description="'policy' (the loop's current policy), 'tiny' (the embedded spec writer, "
        "built and bound by sentinel.spec_writer) or a local HF causal-LM path / hub id"
    )
    tiny_families: list[str] = Field(
        default_factory=lambda: ["arith"], description="model 'tiny': families it learns to write"
    )
    tiny_steps: int = Field(100, ge=1, description="model 'tiny': SFT steps")
    tiny_seed: int = Field(0, description="model 'tiny': seed of its weights and training data")
    template: str | None = Field(None, description="jinja2 prompt template (default teacher.j2)")
    clusters: int = Field(4, ge=1, description="clusters prompted per round, biggest first")
    samples: int = Field(4, ge=1, description="completions sampled per cluster prompt")
    shots: int = Field(4, ge=0, description="few-shot spec lines built from the cluster's tasks")
    max_new_tokens: int = Field(128, ge=1, description="tokens per completion")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    chat: bool = Field(False, description="wrap the prompt with the tokenizer's chat template")
    device: str = Field("cpu", description="where a `model:` path is loaded")
    backend: Literal["hf", "vllm"] = Field(
        "hf", description="how completions are sampled: hf (transformers' generate) or vllm (with "
        "`model: policy` the loop's own engine when the loop runs rollout.backend vllm, else an "
        "engine of the teacher's own; docs/vllm.md)")
    vllm: dict[str, Any] = Field(default_factory=dict, description="backend vllm, own engine: "
                                 "its options (the keys of rollout.vllm)")


def _spec_objects(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def parse_specs(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Task specs in `text`, and the fragments that could not be read.

    A spec is a JSON object with a string `family` and a `spec`; they may come one per line, as a
    JSON list, or embedded in other text on a line. A line that holds `{` or `[` but yields no
    spec is a problem; if the whole text yields neither a spec nor a problem line, the text
    itself is the problem ("no JSON task spec").

    >>> parse_specs('{"family": "arith", "spec": {"expr": "2+3"}}\\nblah {oops')
    ([{'family': 'arith', 'spec': {'expr': '2+3'}}], ['blah {oops'])
    """
    decoder = json.JSONDecoder()
    specs: list[dict[str, Any]] = []
    problems: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        found, pos = [], 0
        while True:
            starts = [i for i in (line.find("{", pos), line.find("[", pos)) if i >= 0]
            if not starts:
                break
            start = min(starts)
            try:
                value, end = decoder.raw_decode(line, start)
            except json.JSONDecodeError:
                pos = start + 1
                continue
            found += [
                v for v in _spec_objects(value)
                if isinstance(v, dict) and isinstance(v.get("family"), str) and "spec" in v
            ]
            pos = end
        specs += found
        if not found and ("{" in line or "[" in line):
            problems.append(line)
    if not specs and not problems:
        problems.append(text.strip())
    return specs, problems


class TeacherGenerator(BaseGenerator):
    name = "teacher"
    config_model = TeacherConfig
    config: TeacherConfig

    def __init__(self, config: TeacherConfig | None = None) -> None:
        if config is None:
            raise ValueError("the teacher needs a config with `model:` (a path or 'policy')")
        super().__init__(config)
        self._loaded: tuple[Any, Any] | None = None
        self._template: Any = None

    def bind(self, model: Any, tokenizer: Any) -> None:
        """Sample from `model` with `tokenizer` from now on, instead of loading `config.model`.
        `model: tiny` needs it: the embedded spec writer is built and trained outside the
        generators (`sentinel.spec_writer.bind_spec_writers`, which the loop calls)."""
        self._loaded = (model, tokenizer)

    @property
    def bound(self) -> bool:
        """Whether a model is loaded or bound (`bind`) already."""
        return self._loaded is not None

    # -- inputs ---------------------------------------------------------------------------------
    def render(self, **variables: Any) -> str:
        """The prompt rendered from the template (`template:`, or `teacher_tiny.j2` for
        `model: tiny`, else `teacher.j2`) with `variables` (`cluster`, `family`, `examples`)."""
        if self._template is None:
            import jinja2

            path = (Path(self.config.template) if self.config.template
                    else TINY_TEMPLATE if self.config.model == "tiny" else DEFAULT_TEMPLATE)
            env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
            self._template = env.from_string(path.read_text())
        return self._template.render(**variables)

    def _model(self, ctx: GenerationContext) -> tuple[Any, Any]:
        if self.config.model == "policy":
            if ctx.policy is None:
                raise RuntimeError("teacher model 'policy' needs ctx.policy = (model, tokenizer)")
            return ctx.policy
        if self._loaded is None:
            if self.config.model == "tiny":
                raise RuntimeError(
                    "teacher model 'tiny' is the embedded spec writer, built outside the "
                    "generator: call sentinel.spec_writer.bind_spec_writers([teacher]) (the loop "
                    "does) or teacher.bind(model, tokenizer) before generating"
                )
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.config.model)
            model = AutoModelForCausalLM.from_pretrained(self.config.model)
            model.to(self.config.device)
            model.eval()
            self._loaded = (model, tokenizer)
        return self._loaded

    @staticmethod
    def _clusters(ctx: GenerationContext) -> list[dict[str, Any]]:
        if ctx.clusters:
            return sorted(ctx.clusters, key=lambda r: -int(r.get("n_failures", 0)))
        rows: dict[str, dict[str, Any]] = {}
        for f in ctx.failures:
            row = rows.setdefault(f.cluster_id, {
                "cluster_id": f.cluster_id, "family": f.family, "skills": sorted(f.skills),
                "mode": f.mode, "n_failures": 0,
            })
            row["n_failures"] += 1
        for row in rows.values():
            row["summary"] = (f"{row['family']} | {', '.join(row['skills']) or '-'} | "
                              f"{row['mode']}: {row['n_failures']} failures")
        return sorted(rows.values(), key=lambda r: (-r["n_failures"], r["cluster_id"]))

    def _examples(self, ctx: GenerationContext, family: str, tasks: list[Task]) -> list[str]:
        """Up to `shots` spec lines: the cluster's tasks, then perturbations of them."""
        return self.spec_lines(ctx.families[family], family, tasks, ctx.rng)

    def spec_lines(self, fam: Any, family: str, tasks: list[Task], rng: Any) -> list[str]:
        """Up to `shots` JSON lines `{"family": ..., "spec": ...}`: the specs of `tasks`, then
        `fam.perturb` variants of them drawn with `rng`."""
        specs = [t.spec for t in tasks][: self.config.shots]
        for task in tasks:
            if len(specs) >= self.config.shots:
                break
            try:
                variant = fam.perturb(task.spec, rng)
            except SpecError:
                continue
            if variant not in specs:
                specs.append(variant)
        return [json.dumps({"family": family, "spec": s}) for s in specs]

    # -- sampling -------------------------------------------------------------------------------
    def _engine(self, ctx: GenerationContext, model: Any, tokenizer: Any) -> Any:
        """backend vllm: the vLLM engine to sample with: the loop's own (`ctx.sampler`) when it
        is a vLLM engine over this very model, else one of the teacher's own, built once through
        `ctx.make_sampler`."""
        shared = ctx.sampler
        if (self.config.model == "policy" and getattr(shared, "name", None) == "vllm"
                and getattr(shared, "model", None) is model):
            return shared
        own = getattr(self, "_own_engine", None)
        if own is None or own.model is not model:
            if ctx.make_sampler is None:
                raise RuntimeError("teacher backend 'vllm' needs ctx.make_sampler (the loop "
                                   "provides it) or ctx.sampler, a vLLM engine over the policy")
            own = ctx.make_sampler("vllm", model, tokenizer, self.config.vllm)
            self._own_engine = own
        return own

    def _sample(self, ctx: GenerationContext, prompt: str) -> list[str]:
        import torch

        model, tokenizer = self._model(ctx)
        if self.config.chat:
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        context = getattr(model.config, "max_position_embeddings", None)
        if context:
            ids = ids[:, -max(1, context - self.config.max_new_tokens) :]
        if self.config.backend == "vllm":
            engine = self._engine(ctx, model, tokenizer)
            n = self.config.samples
            outs = engine.sample([ids[0].tolist()] * n, [self.config.max_new_tokens] * n,
                                 temperature=self.config.temperature, greedy=False,
                                 seed=ctx.rng.getrandbits(31))
            return tokenizer.batch_decode([out for out, _ in outs], skip_special_tokens=True)
        device = next(model.parameters()).device
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (
            tokenizer.eos_token_id)
        forked = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=forked), torch.no_grad():
            torch.manual_seed(ctx.rng.getrandbits(63))
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=torch.ones_like(ids).to(device),
                do_sample=True,
                temperature=self.config.temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=self.config.max_new_tokens,
                num_return_sequences=self.config.samples,
                pad_token_id=pad,
                eos_token_id=tokenizer.eos_token_id,
            )
        return tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)

    def generate(self, ctx: GenerationContext) -> Iterator[Candidate | Unparseable]:
        members: dict[str, list[Failure]] = defaultdict(list)
        for f in ctx.failures:
            members[f.cluster_id].append(f)
        for cluster in self._clusters(ctx)[: self.config.clusters]:
            family = str(cluster.get("family", ""))
            failures = members.get(str(cluster.get("cluster_id")), [])
            tasks = list({f.task_id: ctx.tasks[f.task_id] for f in failures
                          if f.task_id in ctx.tasks}.values())
            if family not in ctx.families:
                continue
            prompt = self.render(
                cluster=cluster, family=family, examples=self._examples(ctx, family, tasks)
            )
            parent = tasks[0].task_id if tasks else None
            failure_ids = [f.failure_id for f in failures]
            for text in self._sample(ctx, prompt):
                specs, problems = parse_specs(text)
                for obj in specs:
                    answer = obj.get("answer")
                    yield Candidate(
                        family=obj["family"],
                        spec=obj["spec"],
                        answer=answer if isinstance(answer, str) else None,
                        parent_task_id=parent,
                        failure_ids=list(failure_ids),
                    )
                for problem in problems:
                    yield Unparseable(
                        text=problem[:MAX_PROBLEM_CHARS],
                        error="no JSON task spec ({\"family\": ..., \"spec\": ...}) in the output",
                        parent_task_id=parent,
                    )
