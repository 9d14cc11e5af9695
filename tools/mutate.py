"""Mutation testing, small and deterministic: does a test fail when a line it guards is broken?

Each entry of `MUTATIONS` names a file, an exact snippet of it (usually one line), what to put in
its place, and the tests that should notice (a fast subset: the whole suite is minutes). The
working tree is copied once to a temporary directory (`git ls-files`: tracked files and untracked
ones git does not ignore, as they are now), and each mutation is applied there in turn and
reverted, so the live checkout is never touched. pytest runs in the copy with the copy first on
`PYTHONPATH` (checked: `sentinel`, `task_store`, `generators` and `trainers` must import from the
copy, not from the editable install), without its cache.

Outcome per mutation: `killed` (a test failed or could not even be collected), `survived` (every
test passed: a hole in the suite, or an equivalent mutant; docs/testing.md says which), `timeout`
(counted as killed: the mutant made a test hang), `stale` (the snippet is not in the file exactly
once: the code moved, update the entry) or `error` (pytest could not run the named tests). A
baseline run of all the named tests on the unmutated copy comes first: if it fails, every mutant
would look killed, so the run stops.

    .venv/bin/python tools/mutate.py              # all of them; prints `survivors: N of M`
    .venv/bin/python tools/mutate.py --list
    .venv/bin/python tools/mutate.py --only loop-batch-is-all analyzer-
    .venv/bin/python tools/mutate.py --only loop-generated --tests tests/test_loop.py

Exit status: 0 when every mutation was applied and run, 1 when any was stale or errored or the
baseline failed (survivors alone do not fail the run: they are listed in docs/testing.md and
are meant to shrink).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sentinel", "task_store", "generators", "trainers")


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    before: str
    after: str
    tests: tuple[str, ...]


ANALYZER = ("tests/test_analyzer.py", "tests/test_analyzer_corpus.py")
CURRICULUM = ("tests/test_curriculum.py",)
REWARDS = ("tests/test_rewards.py",)
LOOP = ("tests/test_loop_fast.py",)
ROLLOUT_METRICS = (
    "tests/test_rollout.py::test_batch_metrics_and_pass_rates_on_hand_made_rollouts",)

RECOVERY_MIX = ("tests/test_faults.py::test_cold_start_recovery_types_weigh_the_demonstrations",)
INERT = ("tests/test_trainers.py::test_zero_advantage_rows_run_forward_only_and_change_nothing",)

MUTATIONS: list[Mutation] = [
    # -- the ones issue #16 lists -------------------------------------------------------------
    Mutation("loop-batch-is-all", "sentinel/loop.py",
             "batch = self.curriculum.observe(trajs)",
             "self.curriculum.observe(trajs); batch = trajs", LOOP),
    Mutation("curriculum-observe-keeps-all", "sentinel/curriculum.py",
             "return [t for t in trajectories if t.group_id in keep]",
             "return list(trajectories)", (*CURRICULUM, *LOOP)),
    Mutation("analyzer-loop-after-tool-error", "sentinel/analyzer.py",
             '    "loop": detect_loop,\n'
             '    "tool_error_unrecovered": detect_tool_error_unrecovered,\n',
             '    "tool_error_unrecovered": detect_tool_error_unrecovered,\n'
             '    "loop": detect_loop,\n', ANALYZER),
    Mutation("analyzer-bad-arguments-any-tool", "sentinel/analyzer.py",
             "return any(s.tool == step.tool for s in later)",
             "return bool(later)", ANALYZER),
    # -- analyzer -----------------------------------------------------------------------------
    Mutation("analyzer-tool-error-any-call", "sentinel/analyzer.py",
             "return any(_key(s) == _key(step) for s in later)",
             "return any(s.tool == step.tool for s in later)", ANALYZER),
    Mutation("analyzer-unknown-tool-never-recovered", "sentinel/analyzer.py",
             'if step.error_kind == "unknown_tool":\n        return bool(later)',
             'if step.error_kind == "unknown_tool":\n        return False', ANALYZER),
    Mutation("analyzer-parse-error-not-ill-formed", "sentinel/analyzer.py",
             'return step.kind in ("tool_call", "answer") and step.error_kind != "parse"',
             'return step.kind in ("tool_call", "answer")', ANALYZER),
    Mutation("analyzer-retries-count-as-loop", "sentinel/analyzer.py",
             "if not _is_call(step) or step.error_kind in TRANSIENT_ERRORS:",
             "if not _is_call(step):", ANALYZER),
    Mutation("analyzer-loop-ignores-reference", "sentinel/analyzer.py",
             "allowed = max(1, needed[key])", "allowed = 1", ANALYZER),
    Mutation("analyzer-loop-off-by-one", "sentinel/analyzer.py",
             "if seen[key] >= allowed + attempt.loop_repeats - 1:",
             "if seen[key] >= allowed + attempt.loop_repeats:", ANALYZER),
    Mutation("analyzer-premature-strict", "sentinel/analyzer.py",
             "if made >= needed or any(", "if made > needed or any(", ANALYZER),
    Mutation("analyzer-premature-first-error-at-answer", "sentinel/analyzer.py",
             "    return _located(attempt, _index(attempt.steps, pos), (",
             "    return (lambda _a, f, e: (f, e))(attempt, _index(attempt.steps, pos), (",
             ANALYZER),
    Mutation("analyzer-no-answer-first-error-at-result", "sentinel/analyzer.py",
             "return _index(steps, had + 1), (", "return _index(steps, had), (", ANALYZER),
    Mutation("analyzer-echo-incomplete-tags-ok", "sentinel/analyzer.py",
             "return not (real and invented and complete and all(",
             "return not (real and invented and all(", ANALYZER),
    Mutation("analyzer-giving-up-is-format-error", "sentinel/analyzer.py",
             "    if gave_up:\n        return None\n", "", ANALYZER),
    Mutation("analyzer-wrong-answer-ignores-locate-error", "sentinel/analyzer.py",
             "if isinstance(located, int) and located != first:",
             "if False:", ANALYZER),
    Mutation("analyzer-exemplars-not-distinct", "sentinel/analyzer.py",
             "chosen = list(first_of_task.values())[:k]", "chosen = []", ANALYZER),
    Mutation("analyzer-clusters-smallest-first", "sentinel/analyzer.py",
             'rows.sort(key=lambda r: (-r["n_failures"], r["cluster_id"]))',
             'rows.sort(key=lambda r: (r["n_failures"], r["cluster_id"]))', ANALYZER),
    # -- curriculum ---------------------------------------------------------------------------
    Mutation("fault-mines-recovered-failures", "generators/fault.py",
             'if met and not fault and step.kind == "tool_call" and step.tool != "wait":',
             "if False:", ("tests/test_fault_generator.py",)),
    Mutation("fault-fresh-perturbs-the-failed-task", "generators/fault.py",
             "                        if self.config.fresh:",
             "                        if False:", ("tests/test_fault_generator.py",)),
    Mutation("arith-fault-weights-ignored", "sentinel/tasks/arith.py",
             "fault_type = (rng.choice(self.config.fault_types) if weights is None else",
             "fault_type = (rng.choice(self.config.fault_types) if True else",
             ("tests/test_faults.py",)),
    Mutation("arith-notation-at-any-operation", "sentinel/tasks/arith.py",
             "if fault_type not in NOTATIONS or op.op == NOTATIONS[fault_type][0]]", "if True]",
             ("tests/test_faults.py",)),
    Mutation("calculator-notation-without-hint", "sentinel/env/calculator.py",
             'raise CalcError(f"unexpected {shown} at position {i}; write {OP_NAMES[op]} as {op}")',
             'raise CalcError(f"unexpected {shown} at position {i}")', ("tests/test_faults.py",)),
    Mutation("bench-config-diff-lists-whole", "sentinel/bench.py",
             "isinstance(new, list) and len(old) == len(new):",
             "isinstance(new, list) and len(old) == len(new) and False:", ("tests/test_bench.py",)),
    Mutation("bench-failure-fault-share-ignored", "sentinel/bench.py",
             'if arm == "failure" and config.bench.failure_fault_share is not None:',
             "if False:", ("tests/test_bench.py",)),
    Mutation("fault-fresh-gives-up-after-one-draw", "generators/fault.py",
             "range(FRESH_TRIES if self.config.fresh else 1)", "range(1)",
             ("tests/test_fault_generator.py",)),
    Mutation("fault-unmet-fault-counts-as-recovered", "generators/fault.py",
             "            return False\n", "            return not met\n",
             ("tests/test_fault_generator.py",)),
    Mutation("curriculum-untried-ignores-generator", "sentinel/curriculum.py",
             "for key in ((task.target_cluster_id, task.generator), task.target_cluster_id):",
             "for key in (task.target_cluster_id,):", CURRICULUM),
    Mutation("curriculum-balance-ignored", "sentinel/curriculum.py",
             "if self.balance_skills is None or k <= 0:", "if True:", CURRICULUM),
    Mutation("curriculum-balance-uncapped", "sentinel/curriculum.py",
             "open_ = [name for name in slots if slots[name] < len(strata[name])]",
             "open_ = list(slots)", CURRICULUM),
    Mutation("heldout-recovery-pooled-over-tasks", "sentinel/heldout.py",
             'out["recovery"] = _change([by_type[t] for t in sorted(by_type)], n, seed)',
             'out["recovery"] = _change([sum((by_type[t] for t in sorted(by_type)), [])], n, seed)',
             ("tests/test_heldout.py",)),
    Mutation("heldout-ci-not-resampled", "sentinel/heldout.py",
             "[rng.choices(g, k=len(g)) for g in strata]", "[list(g) for g in strata]",
             ("tests/test_heldout.py",)),
    Mutation("curriculum-gate-drop-flipped", "sentinel/curriculum.py",
             "if not self.drop:", "if self.drop:", CURRICULUM),
    Mutation("curriculum-gate-dropped-not-cumulative", "sentinel/curriculum.py",
             "self.dropped += len(flat)", "self.dropped = len(flat)", CURRICULUM),
    Mutation("curriculum-mastery-strict", "sentinel/curriculum.py",
             "and s.pass_rate >= self.mastery_threshold",
             "and s.pass_rate > self.mastery_threshold", CURRICULUM),
    Mutation("curriculum-mastery-min-samples-strict", "sentinel/curriculum.py",
             "s.attempts >= self.mastery_min_samples",
             "s.attempts > self.mastery_min_samples", CURRICULUM),
    Mutation("curriculum-mined-oldest-first", "sentinel/curriculum.py",
             "pool = [t for t in reversed(self.mined) if not self.mastered(t)]",
             "pool = [t for t in self.mined if not self.mastered(t)]", CURRICULUM),
    Mutation("curriculum-replay-includes-solved", "sentinel/curriculum.py",
             "s.successes < s.attempts", "s.successes <= s.attempts", CURRICULUM),
    Mutation("curriculum-mined-one-too-many", "sentinel/curriculum.py",
             "lambda pool, k: pool[:k])", "lambda pool, k: pool[:k + 1])", CURRICULUM),
    Mutation("curriculum-held-out-sampled", "sentinel/curriculum.py",
             "if task.task_id in seen or task.task_id in self.excluded_ids:",
             "if task.task_id in seen:", CURRICULUM),
    Mutation("curriculum-observe-counts-attempts-as-successes", "sentinel/curriculum.py",
             "s.successes += successes", "s.successes += attempts", CURRICULUM),
    Mutation("curriculum-replay-unshuffled", "sentinel/curriculum.py",
             "self.rng.shuffle(replay)", "replay.sort()", CURRICULUM),
    Mutation("curriculum-resume-forgets-dropped", "sentinel/curriculum.py",
             'self.gate.dropped = int(state.get("zero_variance_dropped", 0))',
             "self.gate.dropped = 0", CURRICULUM),
    Mutation("curriculum-success-signal-is-reward", "sentinel/curriculum.py",
             "return float(trajectory.success)", "return float(trajectory.reward)",
             CURRICULUM),
    # -- rewards ------------------------------------------------------------------------------
    Mutation("rewards-bad-arguments-sound", "sentinel/rewards.py",
             'POLICY_CALL_ERRORS = ("unknown_tool", "bad_arguments", "parse")',
             'POLICY_CALL_ERRORS = ("unknown_tool", "parse")', REWARDS),
    Mutation("rewards-hallucination-well-formed", "sentinel/rewards.py",
             '        and step.error_kind != "parse"\n        and step.hallucinated is not True\n',
             '        and step.error_kind != "parse"\n', REWARDS),
    Mutation("rewards-no-call-no-answer-process-1", "sentinel/rewards.py",
             'return 1.0 if any(s.kind == "answer" for s in steps) else 0.0', "return 1.0",
             REWARDS),
    Mutation("rewards-process-weighted-by-format", "sentinel/rewards.py",
             '+ config.w_process * terms["process"]', '+ config.w_format * terms["process"]',
             (*REWARDS, *LOOP)),
    Mutation("rewards-empty-format-1", "sentinel/rewards.py",
             "    if not steps:\n        return 0.0\n", "    if not steps:\n        return 1.0\n",
             REWARDS),
    # -- the loop's phases --------------------------------------------------------------------
    Mutation("loop-analyzes-held-out-rollouts", "sentinel/loop.py",
             "record.train(), record.tasks, record.round)",
             "record.trajectories, record.tasks, record.round)", LOOP),
    Mutation("analyzer-share-over-failures", "sentinel/analyzer.py",
             "clusters = cluster_failures(failures, round, len(trajectories),",
             "clusters = cluster_failures(failures, round, len(failures),", (*ANALYZER, *LOOP)),
    Mutation("loop-train-rollouts-not-stored", "sentinel/loop.py",
             "step_metrics.append(metrics)\n            record.trajectories += trajs",
             "step_metrics.append(metrics)", LOOP),
    Mutation("loop-generated-tasks-not-mined", "sentinel/loop.py",
             "self.curriculum.add_mined(self._generate(record, rollouts, (model, tokenizer)))",
             "self._generate(record, rollouts, (model, tokenizer))",
             # The one slow test here (~1 min): the fast run has no generators.
             ("tests/test_loop.py::test_generated_tasks_of_round_r_are_trained_on_in_round_r_plus_1",)),
    Mutation("loop-cold-start-on-held-out", "sentinel/loop.py",
             "            if task.task_id in self.curriculum.excluded_ids:\n"
             "                continue\n", "", LOOP),
    Mutation("rollout-success-rate-zero", "sentinel/rollout/__init__.py",
             '"success": sum(t.success for t in trajectories) / n,', '"success": 0.0,',
             (*ROLLOUT_METRICS, *LOOP)),
    Mutation("cli-imports-torch", "sentinel/cli.py",
             "from __future__ import annotations\n",
             "from __future__ import annotations\n\nimport torch  # noqa: F401\n",
             ("tests/test_cli_fast.py",)),
    Mutation("record-evals-successes-are-samples", "sentinel/record.py",
             '"successes": ok[task.task_id],', '"successes": k[task.task_id],', LOOP),
    Mutation("record-train-reward-over-all-rollouts", "sentinel/record.py",
             '"train_reward": mean([t.reward for t in train]),',
             '"train_reward": mean([t.reward for t in self.trajectories]),', LOOP),
    Mutation("rollout-mean-reward-off-by-one", "sentinel/rollout/__init__.py",
             '"reward": sum(rewards) / n,', '"reward": sum(rewards) / (n + 1),',
             (*ROLLOUT_METRICS, *LOOP)),
    # arith's first error: a call using an ungrounded number is a copy error (issue #20 §5)
    Mutation("arith-first-error-ignores-ungrounded-operands", "sentinel/tasks/arith.py",
             "if result not in expected or not used <= grounded:", "if result not in expected:",
             ("tests/test_analyzer_corpus.py",)),
    # the one budget clamp: the generator is handed its clamped budget
    Mutation("generators-budget-not-handed-down", "generators/run.py",
             "ctx = dataclasses.replace(ctx, budget=limit)", "ctx = ctx",
             ("tests/test_generators.py::test_the_generator_sees_its_clamped_budget_as_ctx_budget",)),
    # exclusive phase timings: the probe is not counted inside generation too
    Mutation("record-timings-inclusive", "sentinel/record.py",
             "self.timings[phase] += elapsed - self._inner.pop()",
             "self.timings[phase] += elapsed + 0 * self._inner.pop()",
             ("tests/test_run_dir.py::test_phase_timings_are_exclusive",)),
    # -- issue #17: fault schedules, learnability, revealed prefixes ------------------------------
    Mutation("faults-call-count-not-advanced", "sentinel/env/faults.py",
             "k, self.calls = self.calls, self.calls + 1", "k = self.calls",
             ("tests/test_faults.py",)),
    Mutation("faults-short-wait-clears-rate-limit", "sentinel/env/faults.py",
             "if self.state is not None and seconds >= RETRY_AFTER_S:",
             "if self.state is not None:", ("tests/test_faults.py",)),
    Mutation("faults-old-name-works-after-rename", "sentinel/env/faults.py",
             "if called_as == name and self.renamed:", "if False:", ("tests/test_faults.py",)),
    Mutation("curriculum-learnability-is-p", "sentinel/curriculum.py",
             "learn = {t: p * (1 - p) for t in pool for p in [self._estimate(t, clusters)]}",
             "learn = {t: p for t in pool for p in [self._estimate(t, clusters)]}", CURRICULUM),
    Mutation("env-prefix-trained-on", "sentinel/env/environment.py",
             "self.loss_mask += [0 if revealed else 1] * len(ids)",
             "self.loss_mask += [1] * len(ids)", ("tests/test_restart.py",)),
    # Issue #18: the rollout correction and the KV-cache keyword of the shared-prefix pass.
    Mutation("grpo-recompute-ignored", "trainers/grpo.py",
             "                old, is_weight = self._correction[tuple(idx)]",
             "                _, is_weight = self._correction[tuple(idx)]",
             ("tests/test_grpo_recipe.py",)),
    Mutation("grpo-tis-uncapped", "trainers/grpo.py",
             "w = torch.clamp(torch.exp(gap), max=cfg.rollout_is_cap)",
             "w = torch.exp(gap)", ("tests/test_grpo_recipe.py",)),
    # trainer.backend trl (issue #19): observation tokens and gate-dropped groups must not train.
    Mutation("trl-env-mask-ignored", "trainers/trl_backend.py",
             'out["env_mask"].append([int(m) * keep for m in t.loss_mask[cut:]])',
             'out["env_mask"].append([keep for m in t.loss_mask[cut:]])',
             ("tests/test_trl_backend.py",)),
    Mutation("trl-gate-ignored", "trainers/trl_backend.py",
             "keep = int(t.traj_id in admitted)", "keep = 1", ("tests/test_trl_backend.py",)),
    # Partial reveals (Task.hint, restart's `reveal`): the policy's turn parsed with the hint,
    # the hint halved when solved, the hint part of the task id.
    Mutation("env-hint-not-parsed", "sentinel/env/environment.py",
             "whole, self._hint_ids = self._hint_ids + ids, []", "whole, self._hint_ids = ids, []",
             ("tests/test_hint.py",)),
    Mutation("restart-hint-not-halved", "generators/restart.py",
             "half = hint[: len(hint) // 2]", "half = hint", ("tests/test_hint.py",)),
    Mutation("types-hint-not-in-id", "sentinel/types.py",
             'key += f"\\x00hint\\x00{hint}"', "pass", ("tests/test_hint.py",)),
    # Killed only where transformers < 5.25 (`cache=` swallowed): `.venv-lower/bin/python
    # tools/mutate.py --only common-cache`; in .venv (5.25) it is an equivalent mutant.
    # -- removed knobs (issue #41): dropped at their off values, refused at any other.
    Mutation("config-removed-key-on-dropped", "sentinel/config.py",
             "if off is ANY or node[last] == off:", "if True:",
             ("tests/test_config.py", "tests/test_bad_configs.py")),
    Mutation("config-removed-key-off-refused", "sentinel/config.py",
             "if off is ANY or node[last] == off:", "if off is ANY:",
             ("tests/test_config.py", "tests/test_bad_configs.py")),
    Mutation("fault-echo-ignored", "sentinel/tasks/arith.py",
             'with_wait="wait" in tools, echo=self.config.fault_echo)',
             'with_wait="wait" in tools, echo=False)', ("tests/test_faults.py",)),
    Mutation("fault-echo-always", "sentinel/env/faults.py",
             'quoted = json.dumps(arguments, ensure_ascii=False) if self.echo else ""',
             'quoted = json.dumps(arguments, ensure_ascii=False)', ("tests/test_faults.py",)),
    # -- the bench's scheduler: an exposure run waits for its seed's failure run, and only it.
    Mutation("bench-exposure-does-not-wait", "sentinel/bench.py",
             'if job[0] == "exposure" and (not needs_share or ("failure", job[1]) in done):',
             'if job[0] == "exposure":',
             ("tests/test_bench.py::test_exposure_runs_start_when_their_failure_run_ends",)),
    Mutation("bench-exposure-barrier", "sentinel/bench.py",
             'if job[0] == "exposure" and (not needs_share or ("failure", job[1]) in done):',
             'if job[0] == "exposure" and all(j[0] == "exposure" for j in pending):',
             ("tests/test_bench.py::test_exposure_runs_start_when_their_failure_run_ends",)),
    # -- the bench never reuses a run made with another config (a stale cold start).
    Mutation("bench-reuses-stale-run", "sentinel/bench.py",
             "        if diff:\n", "        if False:\n",
             ("tests/test_bench.py::test_bench_smoke",)),
    Mutation("bench-cold-start-compares-all", "sentinel/bench.py",
             "b.threads * b.parallel, ignore=COLD_START_UNUSED)", "b.threads * b.parallel)",
             ("tests/test_bench.py::test_bench_smoke",)),
    Mutation("bench-config-diff-blind", "sentinel/bench.py",
             "    return [] if old == new else [path or \"(root)\"]",
             "    return []",
             ("tests/test_bench.py::test_config_diff_names_the_keys_that_differ",)),
    # -- zero-advantage rows forward only (trainers/grpo.py): taken, exact, and only there.
    Mutation("grpo-inert-never-skipped", "trainers/grpo.py",
             "return self.skip_inert and self.config.beta == 0", "return False", INERT),
    Mutation("grpo-inert-every-chunk", "trainers/grpo.py",
             "if skips and not bool(c.adv.any()):", "if skips:", INERT),
    Mutation("grpo-inert-moment-groups-all-skipped", "trainers/grpo.py",
             "if self._skips_inert() and not any(advantages[i] for i in members):",
             "if self._skips_inert():", INERT),
    Mutation("grpo-inert-entropy-lost", "trainers/grpo.py",
             'sums["entropy"] += float(ent[c.mask].sum().item())\n                sums["inert"]',
             'sums["inert"]', INERT),
    # -- the cold start's mix of recovery demonstrations (sft.recovery_types).
    Mutation("sft-recovery-types-ignored", "sentinel/loop.py",
             "types = [t for t in types if weights.get(t, 0.0) > 0]", "pass", RECOVERY_MIX),
    Mutation("sft-recovery-types-uniform", "sentinel/loop.py",
             "else rng.choices(types, [weights[t] for t in types])[0])",
             "else rng.choice(types))", RECOVERY_MIX),
    Mutation("common-cache-keyword-fixed", "trainers/common.py",
             'return "cache" if "cache" in params else "past_key_values"',
             'return "cache"', ("tests/test_trainers.py",)),
    # -- the run survives what a tool, a plugin or a template does (#42, #43) ------------------
    Mutation("env-tool-exception-escapes", "sentinel/env/environment.py",
             'step.error = f"{call.name} failed: {type(exc).__name__}: {exc}"[:500]',
             "raise", ("tests/test_sandbox.py::test_any_exception_of_a_tool_is_that_steps_error",)),
    Mutation("sandbox-moved-dir-not-opened-up", "sentinel/env/sandbox.py",
             "os.chmod(entry, 0o700, dir_fd=fd)", "pass",
             # as root the rename needs no permission: the `nobody` case shows it
             ("tests/test_sandbox.py::test_remove_tree_and_the_stale_sweep",
              "tests/test_sandbox.py::test_any_working_directory_is_removed"
              "[a full directory made mode 0-nobody]")),
    Mutation("validate-unstorable-text-accepted", "generators/validate.py",
             "if (problem := _text_problem(candidate)) is not None:", "if False:",
             ("tests/test_generators.py::"
              "test_text_that_cannot_be_stored_is_a_schema_rejection_that_commits",)),
    Mutation("static-shared-prefix-unseen", "sentinel/rollout/static.py",
             ".tril(diagonal=lcp)", ".tril(diagonal=0)", ("tests/test_static_engine.py",)),
    Mutation("chat-tools-block-never-added", "sentinel/env/chat.py",
             "if tools and not self.renders_tools:", "if False:",
             ("tests/test_pretrained.py::test_tools_block_where_the_template_drops_tools",)),
    Mutation("pretrained-any-record-reused", "sentinel/pretrained.py",
             'if json.loads(record.read_text()).get("sha256") == checksum:', "if True:",
             ("tests/test_pretrained.py::test_a_record_that_does_not_match_is_never_used",)),
    Mutation("progress-no-heartbeat", "sentinel/progress.py",
             "while not stop.wait(LOG_EVERY_S):", "while False:", ("tests/test_progress.py",)),
]


def copy_tree(dest: Path) -> None:
    """Copy the working tree as it is now (tracked and unignored untracked files) to `dest`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():  # a tracked file deleted in the working tree is skipped
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def environment(tree: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    return env


def check_imports(tree: Path) -> None:
    """The copy, not the editable install, must be what the tests import."""
    script = ("import sys, importlib; "
              "print(*[importlib.import_module(p).__file__ for p in sys.argv[1:]])")
    out = subprocess.run([sys.executable, "-c", script, *PACKAGES], cwd=tree,
                         env=environment(tree), check=True, capture_output=True,
                         text=True).stdout.split()
    strays = [f for f in out if not Path(f).resolve().is_relative_to(tree.resolve())]
    if strays:
        sys.exit(f"mutate: the copy is not what Python imports: {strays}")


def pytest(tree: Path, tests: tuple[str, ...], timeout: float) -> tuple[int | None, str]:
    """(pytest's exit status or None on timeout, the tail of its output)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m",
           "not gpu", "--no-header", *tests]
    try:
        proc = subprocess.run(cmd, cwd=tree, env=environment(tree), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, ""
    return proc.returncode, (proc.stdout + proc.stderr)[-2000:]


def first_failure(output: str) -> str:
    """The first `FAILED`/`ERROR` line of pytest's summary: which test caught the mutant."""
    lines = [ln for ln in output.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    return lines[0].split(" - ")[0] if lines else ""


def apply(tree: Path, m: Mutation) -> str | None:
    """Apply `m` in `tree`; returns the original text to restore, None when stale."""
    path = tree / m.path
    if not path.is_file():
        return None
    text = path.read_text()
    if text.count(m.before) != 1:
        return None
    path.write_text(text.replace(m.before, m.after))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=[],
                        help="run the mutations whose name starts with one of these")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per pytest run")
    parser.add_argument("--tests", nargs="+", default=None,
                        help="run these tests for every chosen mutation instead of its own "
                             "(e.g. a slow test, to see whether it kills a survivor)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the unmutated run of the named tests")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name.startswith(tuple(args.only))]
    if args.tests:
        chosen = [dataclasses.replace(m, tests=tuple(args.tests)) for m in chosen]
    if args.list:
        for m in chosen:
            print(f"{m.name:48} {m.path:29} {' '.join(m.tests)}")
        return 0
    if not chosen:
        print("mutate: no mutation matches", args.only, file=sys.stderr)
        return 1
    # A killed run (SIGTERM, e.g. from `timeout`) still removes its copy of the tree.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="sentinel-mutate-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        check_imports(tree)
        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            status, tail = pytest(tree, tests, args.timeout * 3)
            if status != 0:
                print(f"mutate: the unmutated tests do not pass (status {status}):\n{tail}")
                return 1
            print(f"baseline: {len(tests)} test files pass unmutated")
        outcomes: dict[str, list[str]] = {}
        for m in chosen:
            start = time.perf_counter()
            original = apply(tree, m)
            if original is None:
                outcome, detail = "stale", f"snippet not found exactly once in {m.path}"
            else:
                try:
                    status, tail = pytest(tree, m.tests, args.timeout)
                finally:
                    (tree / m.path).write_text(original)
                if status is None:
                    outcome, detail = "timeout", ""
                elif status in (1, 2):  # tests failed / collection failed
                    outcome, detail = "killed", first_failure(tail)
                elif status == 0:
                    outcome, detail = "survived", ""
                else:
                    outcome, detail = "error", f"pytest status {status}: {tail[-400:]}"
            outcomes.setdefault(outcome, []).append(m.name)
            print(f"{outcome:9} {m.name:48} {time.perf_counter() - start:6.1f} s  {detail}",
                  flush=True)
    survivors = outcomes.get("survived", [])
    ran = sum(len(v) for k, v in outcomes.items() if k in ("killed", "survived", "timeout"))
    for outcome in ("stale", "error"):
        if outcomes.get(outcome):
            print(f"{outcome}: {', '.join(outcomes[outcome])}")
    if survivors:
        print(f"survived: {', '.join(survivors)}")
    print(f"survivors: {len(survivors)} of {ran}")
    return 1 if outcomes.get("stale") or outcomes.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
