"""The curriculum bench's plumbing on a tiny budget (one seed, one round, a 2-layer policy): the
shared cold start, one run per arm with the arm's sampling, the figures and the outputs. It checks
that the parts connect, not which arm wins."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from typer.testing import CliRunner

from sentinel.bench import (
    BenchConfig,
    BenchError,
    RunResult,
    area_under,
    arm_config,
    bootstrap_ci,
    config_diff,
    kept_config,
    load_bench_config,
    markdown_table,
    ratio_line,
    rollouts_to_target,
    summarize,
)
from sentinel.config import ConfigError, load_config

TINY = {
    "seed": 0,
    "rounds": 1,
    "policy": {"model": "tiny", "tiny": {"hidden_size": 32, "intermediate_size": 64,
                                         "num_hidden_layers": 2, "num_attention_heads": 4}},
    "families": [{"type": "arith", "min_operands": 2, "max_operands": 2, "max_value": 9,
                  "instruction": ""}],
    "env": {"max_turns": 3, "max_tokens": 96, "max_turn_tokens": 24},
    "rollout": {"temperature": 1.0},
    "sft": {"steps": 3, "batch_size": 8, "num_examples": 16},
    "grpo": {"micro_batch_size": 16},
    "batch": {"steps_per_round": 1, "tasks_per_step": 3, "group_size": 2},
    "eval": {"num_tasks": 6, "samples": 1, "greedy": False, "families": [
        {"type": "arith", "weight": 2, "min_operands": 2, "max_operands": 2, "max_value": 9,
         "instruction": ""},
        {"type": "arith", "weight": 1, "min_operands": 3, "max_operands": 3, "max_value": 30,
         "instruction": ""}]},
    "generation": {"max_candidates": 4, "probe_samples": 1, "probe_band": [0.0, 1.0]},
    "generators": [{"type": "mutate", "per_failure": 1}],
    "bench": {"target": 0.01, "hardest_skills": 2, "min_skill_tasks": 1, "parallel": 2},
}


def test_arms_differ_only_in_what_they_train_on(tmp_path):
    cfg = BenchConfig.model_validate(TINY)
    runs = {arm: arm_config(cfg, arm, 7, tmp_path / "p") for arm in ("failure", "uniform",
                                                                      "filter")}
    for data in runs.values():
        loaded = load_config(data=data)  # each is a valid loop config
        assert loaded.seed == 7 and not loaded.sft.enabled
        assert loaded.policy.model == str((tmp_path / "p").resolve())
    # The dumped entries hold every default of their typed models, so a run's config is whole.
    assert runs["failure"]["generators"] == [{**TINY["generators"][0], "max_candidates": 32}]
    assert runs["uniform"]["generators"] == runs["filter"]["generators"] == []
    assert runs["uniform"]["curriculum"]["drop_zero_variance"] is False
    assert runs["filter"]["curriculum"]["drop_zero_variance"] is True
    assert runs["filter"]["curriculum"]["zero_variance_on"] == "success"  # DAPO: accuracy 0 or 1
    assert runs["failure"]["curriculum"]["zero_variance_on"] == "reward"
    for arm in ("uniform", "filter"):
        assert runs[arm]["curriculum"]["mined_fraction"] == 0.0
    strip = ("generators", "curriculum", "seed")
    same = [{k: v for k, v in d.items() if k not in strip} for d in runs.values()]
    assert same[0] == same[1] == same[2]


def test_bad_bench_config_names_the_key(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump({**TINY, "bench": {"arms": ["failure", "greedy"]}}))
    with pytest.raises(ConfigError, match=r"bench\.arms\.1"):
        load_bench_config(path)


def test_config_diff_names_the_keys_that_differ():
    base = {"seed": 0, "sft": {"steps": 600, "lr": 1e-3},
            "policy": {"model": "/a/cold-start/policy"}}
    assert config_diff(base, base) == []
    # The shared start moved with OUT: the same start.
    assert config_diff(base, {**base, "policy": {"model": "/b/cold-start/policy"}}) == []
    assert config_diff(base, {**base, "policy": {"model": "tiny"}}) == ["policy.model"]
    assert config_diff(base, {**base, "seed": 1, "sft": {"steps": 600}}) == ["seed", "sft.lr"]
    assert config_diff(base, {**base, "seed": 1, "sft": {"steps": 6}}, ignore=("sft",)) == ["seed"]
    # families are a list: compared item by item, a key added later as null is no difference
    fam = {"families": [{"type": "arith", "fault_share": 0.1}, {"type": "lookup"}]}
    assert config_diff(fam, {"families": [{"type": "arith", "fault_share": 0.1,
                                           "fault_weights": None}, {"type": "lookup"}]}) == []
    assert config_diff(fam, {"families": [{"type": "arith", "fault_share": 0.2},
                                          {"type": "lookup"}]}) == ["families.0.fault_share"]
    assert config_diff(fam, {"families": [{"type": "arith", "fault_share": 0.1}]}) == ["families"]


def test_a_run_kept_from_before_a_knob_was_removed_is_reused_only_if_it_was_off(tmp_path):
    """A kept run's `bench-config.yaml` written before a knob was removed holds it; at its off
    value it is the run the bench would make now, turned on it differs (and names the key)."""
    new = load_bench_config(None).run_config()
    path = tmp_path / "bench-config.yaml"
    for repair, diff in (({"epochs": 0, "lr": 1e-4}, []), ({"epochs": 4}, ["repair"])):
        path.write_text(yaml.safe_dump({**new, "repair": repair}))
        assert config_diff(kept_config(path), new) == diff


def test_figures():
    assert rollouts_to_target([0, 10, 20], [0.1, 0.3, 0.5], 0.4) == pytest.approx(15.0)
    runs = [RunResult("failure", 0, [0, 10, 20], [0.1, 0.3, 0.5], {"a": 0.5}),
            RunResult("failure", 1, [0, 10, 20], [0.1, 0.5, 0.6], {"a": 0.7}),
            RunResult("uniform", 0, [0, 10, 20], [0.1, 0.2, 0.3], {"a": 0.1}),
            RunResult("uniform", 1, [0, 10, 20], [0.1, 0.2, 0.45], {"a": 0.3})]
    s = summarize(runs, 0.4, ["a"])
    assert s["arms"]["failure"]["rollouts_to_target"] == pytest.approx([15.0, 7.5])
    # uniform: 0.3 never reaches 0.4; 0.2 -> 0.45 crosses it at 10 + 10 * 0.2 / 0.25 = 18.
    assert s["arms"]["uniform"]["rollouts_to_target"] == [None, pytest.approx(18.0)]
    assert s["arms"]["failure"]["skills"]["a"][0] == pytest.approx(0.6)
    # The unreached seed counts with its budget (20): (20 + 18) / 2 = 19 against 11.25, and the
    # ratio is a lower bound.
    # Paired bootstrap over the two seeds: a resample is (seed 0, seed 0) 20/15 = 1.33, (seed 1,
    # seed 1) 18/7.5 = 2.40, or mixed 38/22.5 = 1.69; the CI runs from the first to the second.
    assert ratio_line(s) == "rollouts-to-target ratio: uniform/failure >1.69 [1.33, 2.40]"
    assert "(1/2)" in markdown_table(s)
    # Neither arm reaching the target gives no ratio, not a ratio of budgets.
    none = summarize(runs, 0.9, ["a"])
    assert ratio_line(none) == "rollouts-to-target ratio: uniform/failure n/a"


@pytest.mark.slow
def test_bench_smoke(tmp_path):
    from sentinel.cli import app

    cfg = tmp_path / "bench.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", "curriculum", "--config", str(cfg), "--seeds", "1",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("rollouts-to-target ratio: ")
    summary = json.loads((out / "results.json").read_text())
    assert set(summary["arms"]) == {"failure", "uniform", "filter"}
    for arm, a in summary["arms"].items():
        (curve,) = a["curves"]
        assert len(curve["rollouts"]) == 2 and curve["rollouts"][0] == 0
        train = curve["rollouts"][1]
        # 1 step x 3 tasks x 2 samples of training; the failure arm adds its probe rollouts.
        assert train == 6 if arm != "failure" else train >= 6
        # Every run starts from the one cold start: the same policy, the same held-out tasks.
        assert (out / f"{arm}-s0" / "bench-config.yaml").exists()
    assert len(summary["hardest_skills"]) == 2
    png = (out / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert "rollouts-to-target ratio" in (out / "results.md").read_text()
    # Runs already in OUT are reused: a second call starts nothing and gives the same figures.
    again = CliRunner().invoke(app, ["bench", "curriculum", "--config", str(cfg), "--seeds", "1",
                                     "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert json.loads((out / "results.json").read_text())["arms"] == summary["arms"]
    # ... and the cold start is made with parallel x threads torch threads, recorded.
    assert summary["cold_start_threads"] == 2
    # A re-invocation with another cold start must not reuse the runs made with the old one.
    changed = {**TINY, "sft": {**TINY["sft"], "steps": 4}}
    cfg.write_text(yaml.safe_dump(changed))
    stale = CliRunner().invoke(app, ["bench", "curriculum", "--config", str(cfg), "--seeds", "1",
                                     "--out", str(out)])
    assert stale.exit_code != 0
    assert "sft.steps" in stale.output and "cold-start" in stale.output, stale.output
    # A bench that changes only how the arms train reuses a kept cold start, not remaking it.
    kept = tmp_path / "kept"
    shutil.copytree(out / "cold-start", kept / "cold-start")
    arms_only = {**TINY, "grpo": {**TINY["grpo"], "lr": 1e-5}, "bench": {**TINY["bench"],
                                                                        "arms": ["uniform"]}}
    cfg.write_text(yaml.safe_dump(arms_only))
    reused = CliRunner().invoke(app, ["bench", "curriculum", "--config", str(cfg), "--seeds",
                                      "1", "--out", str(kept)])
    assert reused.exit_code == 0, reused.output
    assert (kept / "cold-start" / "bench-threads").read_text().split() == ["2"]


def test_held_out_entries_sample_with_their_own_config(tmp_path):
    """A held-out entry of a training family with a harder config (the bench's tail) samples
    with that config, not the training one."""
    from sentinel.loop import Loop

    cfg = load_config(data={**{k: v for k, v in TINY.items() if k != "bench"},
                            "eval": {"num_tasks": 12, "samples": 1, "greedy": False, "families": [
                                {"type": "arith", "min_operands": 5, "max_operands": 5,
                                 "instruction": ""}]}})
    loop = Loop(cfg, tmp_path / "run")
    assert len(loop.eval_tasks) == 12
    assert all("steps:4" in t.skills for t in loop.eval_tasks)
    # Training draws keep the training config (two operands, one step).
    train = [loop.mixture.sample(loop.rng) for _ in range(12)]
    assert all("steps:1" in t.skills for t in train)


def test_area_and_bootstrap():
    # Trapezoids: (0.2 + 0.4) / 2 * 100 + 0.4 * 100 = 70 over 200 rollouts.
    assert area_under([0, 100, 200], [0.2, 0.4, 0.4]) == pytest.approx(0.35)
    assert bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)
    lo, hi = bootstrap_ci([0.0, 1.0] * 5)
    assert 0.1 < lo < 0.5 < hi < 0.9


def test_recovery_metric_drives_target_and_area():
    """With `metric: recovery` the target is read off the recovery curve, not held-out success."""
    runs = [RunResult("failure", 0, [0, 10, 20], [0.5, 0.5, 0.5], recovery=[0.1, 0.3, 0.5],
                      clean=[0.6, 0.6, 0.6]),
            RunResult("uniform", 0, [0, 10, 20], [0.5, 0.5, 0.5], recovery=[0.1, 0.1, 0.2],
                      clean=[0.6, 0.6, 0.5])]
    s = summarize(runs, 0.4, [], metric="recovery")
    assert s["arms"]["failure"]["rollouts_to_target"] == [pytest.approx(15.0)]
    assert s["arms"]["uniform"]["rollouts_to_target"] == [None]
    # (0.1 + 0.3) / 2 * 10 + (0.3 + 0.5) / 2 * 10 = 6 over 20 rollouts.
    assert s["arms"]["failure"]["area_mean"] == pytest.approx(0.3)
    assert s["arms"]["uniform"]["final_clean_mean"] == pytest.approx(0.5)
    assert ratio_line(s) == "rollouts-to-target ratio: uniform/failure >1.33 [1.33, 1.33]"
    # On held-out success (flat at 0.5) the same runs reach 0.4 at once, both.
    assert summarize(runs, 0.4, [])["arms"]["uniform"]["rollouts_to_target"] == [0.0]


def test_exposure_arm_carries_the_given_fault_share(tmp_path):
    data = {**TINY, "families": [{**TINY["families"][0], "fault_share": 0.1,
                                  "fault_types": ["timeout", "renamed"]}]}
    cfg = BenchConfig.model_validate(data)
    exposure = arm_config(cfg, "exposure", 3, tmp_path / "p", exposure_share=0.37)
    uniform = arm_config(cfg, "uniform", 3, tmp_path / "p")
    assert exposure["families"][0]["fault_share"] == 0.37
    assert uniform["families"][0]["fault_share"] == 0.1  # uniform keeps the realistic share
    assert exposure["generators"] == [] and exposure["curriculum"] == uniform["curriculum"]
    load_config(data=exposure)
    with pytest.raises(BenchError, match="fault share"):
        arm_config(cfg, "exposure", 3, tmp_path / "p")
    no_types = BenchConfig.model_validate(TINY)
    with pytest.raises(BenchError, match="fault_types"):
        arm_config(no_types, "exposure", 3, tmp_path / "p", exposure_share=0.2)


def test_failure_fault_share_sets_the_failure_arms_base_only(tmp_path):
    """`bench.failure_fault_share` gives the failure arm's base distribution that fault share;
    the other arms (and the cold start, `run_config`) keep the families' own."""
    data = {**TINY, "families": [{**TINY["families"][0], "fault_share": 0.1,
                                  "fault_types": ["timeout", "renamed"]}],
            "bench": {"failure_fault_share": 0.45}}
    cfg = BenchConfig.model_validate(data)
    failure = arm_config(cfg, "failure", 3, tmp_path / "p")
    assert failure["families"][0]["fault_share"] == 0.45
    assert failure["generators"] == cfg.run_config()["generators"]  # still the mining arm
    assert arm_config(cfg, "uniform", 3, tmp_path / "p")["families"][0]["fault_share"] == 0.1
    assert cfg.run_config()["families"][0]["fault_share"] == 0.1
    load_config(data=failure)
    unset = BenchConfig.model_validate({**data, "bench": {}})
    assert arm_config(unset, "failure", 3, tmp_path / "p")["families"][0]["fault_share"] == 0.1
    no_types = BenchConfig.model_validate({**TINY, "bench": {"failure_fault_share": 0.3}})
    with pytest.raises(BenchError, match="fault_types"):
        arm_config(no_types, "failure", 3, tmp_path / "p")


def test_shipped_bench_configs_load(tmp_path):
    """The benches' configs are valid as written (their target, budget and metric are fixed in
    them before any run), and the recovery bench holds 40 held-out tasks per fault type."""
    from pathlib import Path

    from sentinel.loop import Loop

    root = Path(__file__).resolve().parents[1] / "configs"
    assert load_bench_config(root / "bench_arith.yaml").bench.metric == "success"
    recovery = load_bench_config(root / "bench_recovery.yaml")
    assert recovery.bench.metric == "recovery" and "exposure" in recovery.bench.arms
    tasks = Loop(load_config(data=recovery.run_config()), tmp_path / "run")
    counts: dict[str, int] = {}
    for task in tasks.eval_tasks:
        kind = next((s for s in task.skills if s.startswith("recover:")), "clean")
        counts[kind] = counts.get(kind, 0) + 1
    assert len(counts) == 6 and set(counts.values()) == {40}


def test_exposure_runs_start_when_their_failure_run_ends():
    """The scheduler: `exposure-sN` starts as soon as `failure-sN` is done (ahead of the other
    arms' pending runs), never before it; every run runs once; the first error is raised."""
    import threading

    from sentinel.bench import next_job, run_jobs

    jobs = [(arm, s) for s in range(3) for arm in ("failure", "uniform", "exposure")]
    assert next_job(jobs, set()) == ("failure", 0)
    assert next_job(jobs, {("failure", 0)}) == ("exposure", 0)
    assert next_job([("exposure", 1)], {("failure", 0)}) is None
    assert next_job([("exposure", 1)], set(), needs_share=False) == ("exposure", 1)

    order, lock = [], threading.Lock()

    def fn(job):
        with lock:
            assert job[0] != "exposure" or ("failure", job[1]) in done_now
            order.append(job)
        with lock:
            done_now.add(job)
        return float(job[1])

    done_now: set = set()
    out = run_jobs(jobs, 1, fn)
    assert sorted(out) == sorted(jobs) and out[("uniform", 2)] == 2.0
    # one at a time: failure-s0, then its exposure run before uniform-s0
    assert order[:3] == [("failure", 0), ("exposure", 0), ("uniform", 0)]
    done_now.clear()
    assert sorted(run_jobs(jobs, 2, fn)) == sorted(jobs)

    def boom(job):
        if job == ("uniform", 1):
            raise BenchError("run uniform-s1 failed")
        return 0.0

    with pytest.raises(BenchError, match="uniform-s1"):
        run_jobs(jobs, 2, boom)
