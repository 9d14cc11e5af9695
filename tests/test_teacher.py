"""The `teacher` generator with real tiny models: the untrained tiny policy (garbage out, every
completion accounted for as a candidate or an `unparseable` rejection) and a tiny model SFT-trained
for a few dozen steps on JSON spec lines (accepted teacher tasks are possible). Also the parser on
hand-written garbage, the template override and `model: policy`."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from generators import (
    GenerationContext,
    GeneratorLoadError,
    TeacherGenerator,
    load_generator,
    parse_specs,
    run_generators,
)
from sentinel.analyzer import cluster_failures
from sentinel.policy import TinyPolicyConfig, build_tiny_policy, load_policy
from sentinel.spec_writer import bind_spec_writers
from sentinel.tasks import load_family
from sentinel.types import Failure, Task

ARITH = load_family("arith")


def nothing_known(ids: Iterable[str]) -> set[str]:
    return set()


def failures_and_tasks() -> tuple[list[Failure], dict[str, Task]]:
    tasks = [ARITH.make_task({"expr": e}) for e in ("(3+4)*5", "(2+9)*4", "6-2", "12-7")]
    failures = [
        Failure(f"traj-{i}", t.task_id, 3, mode, 1, f"answered wrong on {t.spec['expr']}",
                t.skills, "arith")
        for i, (t, mode) in enumerate(zip(tasks, ["wrong_answer", "wrong_answer", "loop", "loop"],
                                          strict=True))
    ]
    return failures, {t.task_id: t for t in tasks}


def context(policy: Any = None, with_clusters: bool = True) -> GenerationContext:
    failures, tasks = failures_and_tasks()
    clusters = cluster_failures(failures, 3, 32, tasks=tasks) if with_clusters else []
    return GenerationContext(round=4, failures=failures, tasks=tasks, families={"arith": ARITH},
                             rng=random.Random(0), budget=64, clusters=clusters, policy=policy)


def test_parse_specs_survives_garbage():
    text = "\n".join([
        '{"family": "arith", "spec": {"expr": "2+3"}}',
        'noise before {"family": "arith", "spec": {"expr": "4*5"}, "answer": "20"} after',
        '[{"family": "arith", "spec": {"expr": "6-1"}}, {"family": "arith"}]',
        '{"family": "arith", "spec": {"expr": "7',
        "plain words with no braces",
        '{"name": "calculator"}',
        "}{][",
    ])
    specs, problems = parse_specs(text)
    assert [s["spec"]["expr"] for s in specs] == ["2+3", "4*5", "6-1"]
    assert specs[1]["answer"] == "20"
    assert problems == ['{"family": "arith", "spec": {"expr": "7', '{"name": "calculator"}',
                        "}{]["]
    assert parse_specs("zzz qqq") == ([], ["zzz qqq"])
    assert parse_specs("") == ([], [""])


def test_teacher_config_is_checked():
    with pytest.raises(GeneratorLoadError, match="model"):
        load_generator({"type": "teacher"})
    with pytest.raises(GeneratorLoadError, match="samples"):
        load_generator({"type": "teacher", "model": "policy", "samples": 0})


def test_untrained_tiny_policy_end_to_end(tiny_dir: Path):
    """Garbage in, garbage out, but every completion is accounted for and nothing crashes."""
    teacher = load_generator({"type": "teacher", "model": str(tiny_dir), "samples": 3,
                              "max_new_tokens": 32, "clusters": 2})
    assert isinstance(teacher, TeacherGenerator)
    tasks, rejections, stats = run_generators([teacher], context(), known_task_ids=nothing_known)
    assert stats["teacher"]["errors"] == 0, rejections
    # 2 clusters x 3 completions, each yields at least one candidate or one unparseable record
    assert stats["teacher"]["proposed"] >= 6
    assert stats["teacher"]["accepted"] + stats["teacher"]["rejected"] == (
        stats["teacher"]["proposed"])
    assert len(tasks) == stats["teacher"]["accepted"]
    for r in rejections:
        assert r.generator == "teacher" and r.reason and r.detail
    for t in tasks:  # whatever was accepted passed validation and aims at a cluster
        assert t.origin == "generated" and t.target_cluster_id is not None


def test_policy_model_and_template_override(tiny_policy, tmp_path: Path):
    template = tmp_path / "mine.j2"
    template.write_text("{{ cluster.mode }} {{ family }}\n{% for l in examples %}{{ l }}\n"
                        "{% endfor %}")
    teacher = load_generator({"type": "teacher", "model": "policy", "template": str(template),
                              "samples": 2, "max_new_tokens": 16, "clusters": 1})
    prompt = teacher.render(cluster={"mode": "loop"}, family="arith", examples=["x", "y"])
    assert prompt == "loop arith\nx\ny\n"
    _, rejections, stats = run_generators([teacher], context(policy=tiny_policy),
                                          known_task_ids=nothing_known)
    assert stats["teacher"]["errors"] == 0 and stats["teacher"]["proposed"] >= 2
    # Without a policy in the context the generator fails, and the runner records it.
    _, rejections, stats = run_generators([teacher], context(policy=None),
                                          known_task_ids=nothing_known)
    assert stats["teacher"]["errors"] == 1
    assert "ctx.policy" in rejections[-1].detail


def test_sampling_is_reproducible(tiny_dir: Path):
    spec = {"type": "teacher", "model": str(tiny_dir), "samples": 2, "max_new_tokens": 24,
            "clusters": 1}
    runs = []
    for _ in range(2):
        gen = load_generator(spec)
        runs.append([repr(c) for c in gen.generate(context(with_clusters=False))])
    assert runs[0] == runs[1] and runs[0]


def test_tiny_teacher_samples_from_the_spec_writer_it_is_given(tiny_policy):
    """`model: tiny` loads nothing itself: unbound, it fails with what to call; bound (here to the
    untrained tiny policy), it samples from that model. `bind_spec_writers` skips other models."""
    teacher = load_generator({"type": "teacher", "model": "tiny", "samples": 2,
                              "max_new_tokens": 16, "clusters": 1})
    assert not teacher.bound
    with pytest.raises(RuntimeError, match="bind_spec_writers"):
        next(iter(teacher.generate(context())))
    teacher.bind(*tiny_policy)
    bind_spec_writers([teacher])  # already bound: nothing is trained
    assert teacher._loaded[0] is tiny_policy[0]
    _, _, stats = run_generators([teacher], context(), known_task_ids=nothing_known)
    assert stats["teacher"]["errors"] == 0 and stats["teacher"]["proposed"] >= 2
    other = load_generator({"type": "teacher", "model": "policy"})
    bind_spec_writers([other, load_generator({"type": "mutate"})])
    assert not other.bound


SPEC_LINES = [f'{{"family": "arith", "spec": {{"expr": "{e}"}}}}' for e in ("2+3*4", "7*8-5",
                                                                             "9*9+1")]


@pytest.mark.slow
def test_sft_trained_teacher_yields_accepted_tasks(tmp_path: Path):
    """A tiny model SFT-trained for 60 steps on three JSON spec lines writes specs that pass
    validation (about 9 s of CPU on one thread)."""
    import torch

    from trainers.sft import SFTConfig, SFTTrainer

    model_dir = build_tiny_policy(tmp_path / "teacher", TinyPolicyConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
        max_position_embeddings=512))
    model, tokenizer = load_policy(model_dir)
    rng = random.Random(0)
    examples = []
    for _ in range(32):
        ids = tokenizer.encode("\n".join(rng.choices(SPEC_LINES, k=3)) + "\n",
                               add_special_tokens=False)
        examples.append((ids, [1] * len(ids)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only spin
    try:
        torch.manual_seed(0)
        SFTTrainer(model, SFTConfig(steps=60, batch_size=8, lr=1e-2, warmup_steps=5),
                   pad_token_id=tokenizer.pad_token_id).train(examples)
        model.eval()
        template = tmp_path / "lines.j2"  # the few-shot lines alone: what this model knows
        template.write_text("{% for line in examples %}{{ line }}\n{% endfor %}")
        teacher = load_generator({"type": "teacher", "model": "policy", "template": str(template),
                                  "samples": 4, "max_new_tokens": 60, "temperature": 0.3,
                                  "clusters": 2})
        tasks, rejections, stats = run_generators(
            [teacher], context(policy=(model, tokenizer)), known_task_ids=nothing_known)
    finally:
        torch.set_num_threads(threads)
    assert stats["teacher"]["errors"] == 0
    assert tasks, f"no valid teacher task; rejections: {[r.spec for r in rejections[:5]]}"
    assert all(t.generator == "teacher" and t.family == "arith" for t in tasks)
    failures, _ = failures_and_tasks()
    assert {t.target_cluster_id for t in tasks} <= {f.cluster_id for f in failures}
    assert {r.reason for r in rejections} <= {"unparseable", "duplicate", "schema"}


@pytest.mark.slow
def test_embedded_tiny_teacher_yields_accepted_tasks():
    """`model: tiny` with the embedded spec writer `sentinel.spec_writer` trains and binds (about
    a minute of CPU): its specs pass validation, aimed at the cluster they were prompted with."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only spin
    try:
        teacher = load_generator({"type": "teacher", "model": "tiny", "samples": 4,
                                  "clusters": 4, "shots": 2, "tiny_steps": 80,
                                  "temperature": 0.7})
        bind_spec_writers([teacher])
        tasks, rejections, stats = run_generators([teacher], context(),
                                                  known_task_ids=nothing_known)
    finally:
        torch.set_num_threads(threads)
    assert stats["teacher"]["errors"] == 0 and stats["teacher"]["proposed"] > 0
    assert tasks, f"no valid teacher task; rejections: {[r.reason for r in rejections]}"
    failures, _ = failures_and_tasks()
    assert all(t.generator == "teacher" and t.family == "arith" for t in tasks)
    assert {t.target_cluster_id for t in tasks} <= {f.cluster_id for f in failures}
    assert {r.reason for r in rejections} <= {"unparseable", "duplicate", "schema"}
