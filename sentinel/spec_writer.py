"""The embedded spec writer: the small model a `teacher` generator configured with `model: tiny`
samples from, built and trained here and handed to the generator (`TeacherGenerator.bind`).

Why here and not in `generators/`: building it means building a policy (`sentinel.policy`) and
training it (`trainers.sft`), and generators see only the types in `sentinel.tasks` /
`sentinel.types` (the import contract in tests/test_layers.py). The loop, one layer up, calls
`bind_spec_writers` once on the generators it loaded; a generator built by hand with `model: tiny`
needs the same call (or `bind` with any `(model, tokenizer)`) before its first round.

The model: a 2-layer character-level Llama (hidden 128, the policy's tokenizer) trained with SFT
to continue the teacher's own prompts. Each training prompt is rendered through the teacher
exactly as at run time (`TeacherGenerator.render`, `spec_lines`), for a synthetic cluster around a
sampled task (its skills, a failure mode, a summary in the fallback format) with few-shot lines
from the task and `perturb` variants; the target is three more variants, one JSON line each. So it
learns the spec format and to write tasks like the exemplars, with the same skills: what a real
teacher model is asked for, at the scale of the CPU quickstart (no hub download). Deterministic
for a given `tiny_seed`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from generators.teacher import TeacherGenerator
from sentinel.tasks import SpecError, load_family

FAILURE_MODES = ("wrong_answer", "premature_answer", "format_error", "bad_arguments")
N_PROMPTS = 512


def train_spec_writer(teacher: TeacherGenerator) -> tuple[Any, Any]:
    """A `(model, tokenizer)` trained to continue `teacher`'s prompts, from its `tiny_families`,
    `tiny_steps` and `tiny_seed`; about a minute on 2 CPU cores at the default 100 steps."""
    import copy
    import random
    import tempfile

    import torch

    from sentinel.policy import TinyPolicyConfig, build_tiny_policy, load_policy
    from trainers.sft import SFTConfig, SFTTrainer

    cfg = teacher.config
    rng = random.Random(cfg.tiny_seed)
    families = {name: load_family(name) for name in cfg.tiny_families}
    with tempfile.TemporaryDirectory(prefix="sentinel-teacher-") as tmp:
        model, tokenizer = load_policy(build_tiny_policy(tmp, TinyPolicyConfig(
            hidden_size=128, intermediate_size=384, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=1024, seed=cfg.tiny_seed)))
        model = copy.deepcopy(model)  # owns its weights once the directory is gone
    examples = []
    for _ in range(N_PROMPTS):
        name = rng.choice(cfg.tiny_families)
        fam = families[name]
        task = fam.sample_task(rng, origin="seed")
        mode, n = rng.choice(FAILURE_MODES), rng.randint(1, 40)
        skills = sorted(task.skills)
        cluster = {"family": name, "skills": skills, "mode": mode, "n_failures": n,
                   "summary": f"{name} | {', '.join(skills) or '-'} | {mode}: {n} failures"}
        prompt = teacher.render(cluster=cluster, family=name,
                                examples=teacher.spec_lines(fam, name, [task], rng))
        targets = []
        for _ in range(3):
            try:
                targets.append(json.dumps({"family": name, "spec": fam.perturb(task.spec, rng)}))
            except SpecError:
                continue
        if not targets:
            continue
        p_ids = tokenizer.encode(prompt, add_special_tokens=False)
        t_ids = tokenizer.encode("\n".join(targets) + "\n", add_special_tokens=False)
        p_ids = p_ids[-(model.config.max_position_embeddings - len(t_ids) - 1):]
        examples.append((p_ids + t_ids + [tokenizer.eos_token_id],
                         [0] * len(p_ids) + [1] * (len(t_ids) + 1)))
    with torch.random.fork_rng():
        torch.manual_seed(cfg.tiny_seed)
        SFTTrainer(model, SFTConfig(steps=cfg.tiny_steps, batch_size=16, lr=3e-3,
                                    warmup_steps=10, max_seq_len=1024, seed=cfg.tiny_seed),
                   pad_token_id=tokenizer.pad_token_id).train(examples)
    model.eval()
    return model, tokenizer


def bind_spec_writers(generators: Iterable[object]) -> None:
    """Train and bind a spec writer to every `teacher` in `generators` configured with
    `model: tiny` that has none yet; leaves every other generator alone."""
    for generator in generators:
        if (isinstance(generator, TeacherGenerator) and generator.config.model == "tiny"
                and not generator.bound):
            generator.bind(*train_spec_writer(generator))
