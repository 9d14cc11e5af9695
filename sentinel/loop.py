"""The Sentinel loop: cold start, then rounds of GRPO → analyze → generate.

Round 0: build or load the policy, SFT on reference trajectories of the base distribution (each
made by replaying the family's reference solution through the real environment, so SFT sees
exactly the tokens a rollout would), then evaluate on the held-out set.

Round r ≥ 1, `batch.steps_per_round` times: the curriculum picks tasks (failure-mined, replayed and
base), the policy samples a group per task, each trajectory is rewarded, and one GRPO update is
taken. Then: held-out evaluation, failure analysis of the round's failed training rollouts, and
task generation from those failures; accepted tasks enter the curriculum and are trained on in
round r+1. Everything a round produced is committed to the store in one transaction at its end,
then the policy checkpoint is written.

Simplifications (deliberate, for now): rollouts and updates alternate synchronously; the held-out
set is drawn once from the base distribution and never trained on; failures are mined from
training rollouts only (held-out failures would leak the test set into training).
"""

from __future__ import annotations

import errno
import os
import random
import signal
import statistics
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sentinel.analyzer import FailureAnalyzer, cluster_failures
from sentinel.config import SentinelConfig
from sentinel.curriculum import Curriculum, group_signal
from sentinel.env.chat import ChatFormat
from sentinel.env.environment import Episode, replay
from sentinel.env.parser import PARSERS
from sentinel.logging import make_logger, trl_names
from sentinel.rewards import score
from sentinel.rollout import run_episodes
from sentinel.tasks import TaskFamily, load_family
from sentinel.types import Failure, Rejection, Task, Trajectory, new_id
from task_store import Store

POLICY_DIR = "policy"
CHECKPOINT_DIR = "checkpoints"


class LoopError(RuntimeError):
    """A run that cannot start or continue as asked; the message says why."""


@dataclass
class RoundRecord:
    """Everything one round will commit, gathered in memory until the round's transaction."""

    round: int
    tasks: dict[str, Task] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    clusters: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    generated: dict[str, dict[str, int]] = field(default_factory=dict)

    @contextmanager
    def timed(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[phase] += time.perf_counter() - start


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


class Loop:
    def __init__(self, config: SentinelConfig, run_dir: str | Path,
                 console: Console | None = None) -> None:
        self.config, self.run_dir = config, Path(run_dir)
        self.console = console or Console()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(config.seed)
        self.families: dict[str, TaskFamily] = {
            f.name: load_family(f.name, f.config) for f in config.families
        }
        self.weights = [f.weight for f in config.families]
        self.parser = PARSERS[config.env.parser]()
        self.analyzer = FailureAnalyzer(self.families)
        from generators import load_generator

        self.generators = [load_generator(spec) for spec in config.generators]
        from sentinel.spec_writer import bind_spec_writers

        bind_spec_writers(self.generators)  # a `teacher` with `model: tiny` gets its model here
        self.eval_tasks = self._held_out_tasks()
        self.curriculum = Curriculum(
            self._sample_base, mined_fraction=config.curriculum.mined_fraction,
            replay_fraction=config.curriculum.replay_fraction,
            mastery_threshold=config.curriculum.mastery_threshold,
            mastery_min_samples=config.curriculum.mastery_min_samples,
            seed=config.seed, excluded_ids={t.task_id for t in self.eval_tasks},
            drop_zero_variance=config.curriculum.drop_zero_variance,
        )
        self.store = Store.create(self.run_dir / "sentinel.duckdb", run_id=new_id("run"),
                                  config=config.model_dump(mode="json"))
        self.history: list[dict[str, Any]] = []
        # cluster_id -> [(round, share of rollouts)]: the analyzer's trend input.
        self.cluster_history: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.logger = make_logger(config.logging, self.run_dir,
                                  run_config=config.model_dump(mode="json"), console=self.console)

    # -- tasks -------------------------------------------------------------------------------
    def _sample_base(self, rng: random.Random) -> Task:
        entry = rng.choices(self.config.families, weights=self.weights)[0]
        return self.families[entry.name].sample_task(rng, origin="seed")

    def _held_out_tasks(self) -> list[Task]:
        cfg = self.config.eval
        entries = cfg.families or self.config.families
        # Each entry samples with its own config (a held-out set may reach past the training
        # range: more operands, larger numbers); a task is verified and run by its family, whose
        # checks depend on the task's spec, not on the sampling config.
        samplers = [load_family(e.name, e.config) for e in entries]
        for e, family in zip(entries, samplers, strict=True):
            self.families.setdefault(e.name, family)
        rng = random.Random(cfg.seed)
        tasks: dict[str, Task] = {}
        for _ in range(100 * cfg.num_tasks):
            if len(tasks) >= cfg.num_tasks:
                break
            k = rng.choices(range(len(entries)), weights=[e.weight for e in entries])[0]
            task = samplers[k].sample_task(rng, origin="eval")
            tasks.setdefault(task.task_id, task)
        return list(tasks.values())

    # -- policy ------------------------------------------------------------------------------
    def _load_policy(self) -> None:
        import torch

        from sentinel.policy import build_tiny_policy, load_policy

        torch.manual_seed(self.config.seed)
        source: str | Path = self.config.policy.model
        if source == "tiny":
            source = self.run_dir / "policy-init"
            if not (source / "config.json").exists():
                build_tiny_policy(source, self.config.policy.tiny)
        self.model, self.tokenizer = load_policy(source, device=self.config.policy.device,
                                                 dtype=self.config.policy.dtype)
        self.chat = ChatFormat(self.tokenizer)
        if self.config.rollout.backend == "vllm":
            raise NotImplementedError("the vllm rollout backend is not available yet; use 'hf'")
        from sentinel.rollout.hf import HFBackend

        self.backend = HFBackend(self.model, self.tokenizer,
                                 batch_size=self.config.rollout.batch_size,
                                 engine=self.config.rollout.engine)

    def _save_policy(self) -> None:
        out = self.run_dir / POLICY_DIR
        self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)

    # -- rollouts ------------------------------------------------------------------------------
    def _progress(self) -> Progress:
        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=self.console, transient=True)

    def _rollout(self, tasks: list[Task], samples: int, *, split: str, round: int,
                 group_prefix: str, greedy: bool = False, label: str = "rollouts"
                 ) -> list[Trajectory]:
        episodes: list[tuple[Task, int, Episode]] = []
        for task in tasks:
            family = self.families[task.family]
            for k in range(samples):
                episode = Episode(task, family.tool_map(task.spec), self.chat, self.parser,
                                  self.config.env, random.Random(self.rng.getrandbits(64)),
                                  follow_ups=family.follow_up_turns(task.spec))
                episodes.append((task, k, episode))
        with self._progress() as progress:
            bar = progress.add_task(label, total=len(episodes))
            run_episodes(self.backend, [e for _, _, e in episodes],
                         temperature=self.config.rollout.temperature, greedy=greedy,
                         on_turn=lambda done: progress.update(bar, completed=done))
        trajectories = []
        for task, k, episode in episodes:
            traj = episode.trajectory(round=round, split=split, sample_idx=k,
                                      group_id=f"{group_prefix}-{task.task_id}")
            traj.reward, traj.reward_terms, traj.success = score(
                task, traj, self.families[task.family], self.config.reward)
            trajectories.append(traj)
        return trajectories

    # -- phases --------------------------------------------------------------------------------
    def _cold_start(self, record: RoundRecord) -> None:
        from trainers.sft import SFTTrainer

        cfg = self.config.sft
        rng = random.Random(self.config.seed + 1)
        examples = []
        for _ in range(cfg.num_examples):
            task = self.curriculum.base_sampler(rng)
            if task.task_id in self.curriculum.excluded_ids:
                continue
            family = self.families[task.family]
            turns = family.solve(task.spec, family.tool_map(task.spec)).assistant_turns()
            traj = replay(task, turns, family.tool_map(task.spec), self.chat, self.parser,
                          self.config.env, follow_ups=family.follow_up_turns(task.spec))
            examples.append((traj.token_ids, traj.loss_mask))
            record.tasks[task.task_id] = task
        trainer = SFTTrainer(self.model, cfg, pad_token_id=self.tokenizer.pad_token_id)
        with self._progress() as progress:
            bar = progress.add_task("SFT cold start", total=cfg.steps)
            metrics = trainer.train(
                examples, on_step=lambda s, m: progress.update(bar, completed=s))
        self.model.eval()
        record.metrics.update({f"sft/{k}": float(v) for k, v in metrics.items()})
        record.metrics["sft/examples"] = float(len(examples))

    def _train_round(self, record: RoundRecord) -> None:
        from trainers.grpo import group_advantages

        cfg = self.config.batch
        step_metrics: list[dict[str, float]] = []
        for step in range(cfg.steps_per_round):
            fault_point("rollout", record.round)
            with record.timed("rollout"):
                tasks = self.curriculum.sample(cfg.tasks_per_step)
                for t in tasks:
                    record.tasks.setdefault(t.task_id, t)
                trajs = self._rollout(
                    tasks, cfg.group_size, split="train", round=record.round,
                    group_prefix=f"r{record.round}s{step}",
                    label=f"round {record.round} step {step + 1}/{cfg.steps_per_round} rollouts")
            by_task: dict[str, list[bool]] = defaultdict(list)
            by_group: dict[str, list[float]] = defaultdict(list)
            for t in trajs:
                by_task[t.task_id].append(t.success)
                by_group[t.group_id].append(
                    group_signal(t, self.config.curriculum.zero_variance_on))
            for task_id, outcomes in by_task.items():
                self.curriculum.observe(task_id, sum(outcomes), len(outcomes))
            keep = self.curriculum.filter_zero_variance(by_group)
            batch = [t for t in trajs if t.group_id in keep]
            metrics = dict(self.curriculum.metrics())
            fault_point("train", record.round)
            if batch:
                with record.timed("train"):
                    advantages = group_advantages([t.reward for t in batch],
                                                  [t.group_id for t in batch],
                                                  scale=self.config.grpo.scale_rewards)
                    metrics.update(self.trainer.step(batch, advantages))
            rewards = [t.reward for t in trajs]
            metrics["reward"] = _mean(rewards) or 0.0
            metrics["reward_std"] = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
            metrics["success"] = _mean([float(t.success) for t in trajs]) or 0.0
            metrics["completions/mean_length"] = _mean([float(t.n_policy_tokens) for t in trajs])
            metrics["learning_rate"] = self.trainer.scheduler.get_last_lr()[0]
            self.logger.log(trl_names(metrics),
                            step=(record.round - 1) * cfg.steps_per_round + step + 1)
            step_metrics.append(metrics)
            record.trajectories += trajs
        for key in {k for m in step_metrics for k in m}:
            values = [m[key] for m in step_metrics if key in m]
            record.metrics[key] = sum(values) / len(values)

    def _evaluate(self, record: RoundRecord) -> None:
        cfg = self.config.eval
        with record.timed("eval"):
            sampled = self._rollout(self.eval_tasks, cfg.samples, split="eval", round=record.round,
                                    group_prefix=f"r{record.round}eval",
                                    label=f"round {record.round} held-out eval")
            greedy = (self._rollout(self.eval_tasks, 1, split="eval", round=record.round,
                                    group_prefix=f"r{record.round}greedy", greedy=True,
                                    label=f"round {record.round} held-out greedy")
                      if cfg.greedy else [])
        record.trajectories += sampled + greedy
        greedy_ok = {t.task_id: t.success for t in greedy}
        by_task: dict[str, list[bool]] = defaultdict(list)
        for t in sampled:
            by_task[t.task_id].append(t.success)
        for task in self.eval_tasks:
            record.tasks.setdefault(task.task_id, task)
            outcomes = by_task[task.task_id]
            record.evals.append({
                "round": record.round, "task_id": task.task_id, "k": len(outcomes),
                "successes": sum(outcomes), "success_rate": sum(outcomes) / len(outcomes),
                "greedy_success": greedy_ok.get(task.task_id),
            })
        record.metrics["heldout_success"] = _mean([float(t.success) for t in sampled]) or 0.0
        if greedy:
            record.metrics["heldout_greedy"] = _mean([float(t.success) for t in greedy]) or 0.0

    def _analyze(self, record: RoundRecord) -> None:
        with record.timed("analyze"):
            for traj in record.trajectories:
                if traj.split != "train" or traj.success:
                    continue
                failure = self.analyzer.classify(record.tasks[traj.task_id], traj)
                if failure is not None:
                    record.failures.append(failure)
            n_train = sum(t.split == "train" for t in record.trajectories)
            if n_train:
                record.clusters = cluster_failures(record.failures, record.round, n_train,
                                                   history=self.cluster_history,
                                                   tasks=record.tasks)
            for row in record.clusters:
                self.cluster_history[row["cluster_id"]].append((row["round"], row["share"]))

    def _generate(self, record: RoundRecord) -> list[Task]:
        from generators import GenerationContext, run_generators

        with record.timed("generate"):
            ctx = GenerationContext(
                round=record.round, failures=record.failures,
                tasks={f.task_id: record.tasks[f.task_id] for f in record.failures},
                families=self.families, rng=random.Random(self.rng.getrandbits(64)),
                budget=self.config.generation.budget, clusters=record.clusters,
                mastered=self.curriculum.mastered_tasks(), policy=(self.model, self.tokenizer),
            )
            pending = {t.task_id for t in self.eval_tasks} | set(self.curriculum.tasks)

            def known(ids):
                ids = list(ids)
                return {i for i in ids if i in pending} | self.store.existing_task_ids(ids)

            gen = self.config.generation
            accepted, rejections, counts = run_generators(
                self.generators, ctx, known_task_ids=known, time_limit_s=gen.time_limit_s,
                probe=(lambda tasks: self._probe(tasks, record)) if gen.probe else None,
                probe_band=tuple(gen.probe_band), probe_budget=gen.probe_budget)
        for task in accepted:
            record.tasks[task.task_id] = task
        record.rejections += rejections
        record.generated = counts
        return accepted

    def _probe(self, tasks: list[Task], record: RoundRecord) -> dict[str, float]:
        """Difficulty probe: the current policy's pass rate on each candidate task. Probe
        rollouts are not stored (most probed tasks are rejected and never become task rows)."""
        with record.timed("probe"):
            trajs = self._rollout(tasks, self.config.generation.probe_samples, split="probe",
                                  round=record.round, group_prefix=f"r{record.round}probe",
                                  label=f"round {record.round} difficulty probe")
        record.metrics["probe_rollouts"] = record.metrics.get("probe_rollouts", 0.0) + len(trajs)
        outcomes: dict[str, list[bool]] = defaultdict(list)
        for t in trajs:
            outcomes[t.task_id].append(t.success)
        return {task_id: sum(v) / len(v) for task_id, v in outcomes.items()}

    def _commit(self, record: RoundRecord, started: float) -> None:
        with record.timed("store"):
            train = [t for t in record.trajectories if t.split == "train"]
            proposed = sum(c.get("proposed", 0) for c in record.generated.values())
            accepted = sum(c.get("accepted", 0) for c in record.generated.values())
            metrics = {k: v for k, v in record.metrics.items()
                       if k not in ("heldout_success", "heldout_greedy")}
            metrics["failures"] = dict(Counter(f.mode for f in record.failures))
            metrics["generators"] = record.generated
            round_row = {
                "started_at": started, "finished_at": time.time(),
                "n_train_rollouts": len(train),
                "train_success": _mean([float(t.success) for t in train]),
                "train_reward": _mean([t.reward for t in train]),
                "heldout_success": record.metrics.get("heldout_success"),
                "heldout_greedy": record.metrics.get("heldout_greedy"),
                "n_proposed": proposed, "n_accepted": accepted,
                "n_rejected": len(record.rejections),
                "metrics": metrics, "timings": dict(record.timings),
            }
            self.store.record_round(
                record.round, round_row,
                tasks=[t.to_row() for t in record.tasks.values()],
                trajectories=[t.to_row() for t in record.trajectories],
                steps=[s.to_row(t.traj_id) for t in record.trajectories for s in t.steps],
                failures=[f.to_row() for f in record.failures],
                rejections=[r.to_row() for r in record.rejections],
                evals=record.evals, clusters=record.clusters,
                before_commit=lambda: fault_point("in_commit", record.round),
            )
            self._save_policy()
        self.logger.log_round(record.round, round_row)
        self.history.append(round_row)
        self._report(record, round_row)

    def _report(self, record: RoundRecord, row: dict[str, Any]) -> None:
        modes = Counter(f.mode for f in record.failures)
        parts = [f"[bold]round {record.round}[/bold]",
                 f"held-out success {row['heldout_success']:.3f}"]
        if row["heldout_greedy"] is not None:
            parts.append(f"(greedy {row['heldout_greedy']:.3f})")
        if row["train_success"] is not None:
            parts.append(f"train success {row['train_success']:.3f}")
        if modes:
            parts.append("failures " + ", ".join(f"{m}={n}" for m, n in modes.most_common()))
        if record.round > 0:
            parts.append(f"generated {row['n_accepted']} accepted / {row['n_rejected']} rejected")
        parts.append(f"[dim]{sum(record.timings.values()):.0f}s[/dim]")
        self.console.print("  ".join(parts))

    # -- checkpoints -------------------------------------------------------------------------
    def _checkpoint_path(self, round: int) -> Path:
        return self.run_dir / CHECKPOINT_DIR / f"round-{round}.pt"

    def _save_checkpoint(self, round: int) -> None:
        """Written BEFORE the round's commit: a committed round always has its checkpoint, and a
        checkpoint without a committed round is discarded on resume."""
        from trainers.checkpoint import save_checkpoint

        save_checkpoint(self._checkpoint_path(round), self.model, self.trainer, extra={
            "round": round, "loop_rng": self.rng.getstate(),
            "curriculum": self.curriculum.state_dict(),
        })

    def _prune_checkpoints(self, keep: int) -> None:
        for path in (self.run_dir / CHECKPOINT_DIR).glob("round-*.pt"):
            if int(path.stem.removeprefix("round-")) < keep:
                path.unlink()

    def _restore(self, round: int) -> None:
        """Continue after committed round `round`: weights, optimizer, schedule, the curriculum
        and every RNG, so the rest of the run samples exactly as an uninterrupted one."""
        from trainers.checkpoint import load_checkpoint

        for path in (self.run_dir / CHECKPOINT_DIR).glob("round-*.pt*"):
            stem = path.name.split(".")[0]
            if int(stem.removeprefix("round-")) > round:
                path.unlink()  # written, but its round never committed
        path = self._checkpoint_path(round)
        if not path.exists():
            raise LoopError(f"cannot resume: round {round} is committed but {path} is missing")
        extra = load_checkpoint(path, self.model, self.trainer)
        _, rows = self.store.query("SELECT cluster_id, round, share FROM clusters ORDER BY round")
        for cluster_id, r, share in rows:
            self.cluster_history[cluster_id].append((r, share))
        version, internal, gauss = extra["loop_rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.curriculum.load_state_dict(extra["curriculum"])
        self.model.eval()

    # -- driver --------------------------------------------------------------------------------
    def _new_trainer(self) -> None:
        from trainers.grpo import GRPOTrainer

        b = self.config.batch
        self.trainer = GRPOTrainer(
            self.model, self.config.grpo, pad_token_id=self.tokenizer.pad_token_id,
            total_steps=self.config.rounds * b.steps_per_round * self.config.grpo.num_iterations)

    def _finish_round(self, record: RoundRecord, started: float) -> None:
        fault_point("checkpoint", record.round)
        self._save_checkpoint(record.round)
        fault_point("commit", record.round)
        self._commit(record, started)
        self._prune_checkpoints(keep=record.round)

    def run(self, *, resume: bool = False) -> list[dict[str, Any]]:
        """Run round 0 (cold start) and `config.rounds` GRPO rounds; returns the new round rows.

        With `resume`, continue a run whose process died: the store says which rounds are
        committed, the matching checkpoint restores everything else.
        """
        try:
            return self._run(resume)
        finally:
            self.logger.close()

    def _run(self, resume: bool) -> list[dict[str, Any]]:
        done = self.store.completed_rounds()
        if done and not resume:
            raise LoopError(f"{self.run_dir} already holds a run; use --resume to continue it "
                               "or a fresh --run-dir")
        self._load_policy()
        first = 0
        if done:
            if done != list(range(len(done))):
                raise LoopError(f"{self.run_dir}: committed rounds {done} are not contiguous")
            self._new_trainer()
            self._restore(done[-1])
            first = done[-1] + 1
            self.console.print(f"resuming {self.run_dir} after round {done[-1]}")
        if first == 0:
            started = time.time()
            record = RoundRecord(round=0)
            if self.config.sft.enabled:
                with record.timed("sft"):
                    self._cold_start(record)
            self._new_trainer()  # after SFT: its reference model (beta > 0) is the SFT policy
            self._evaluate(record)
            self._finish_round(record, started)
            first = 1
        for r in range(first, self.config.rounds + 1):
            started = time.time()
            record = RoundRecord(round=r)
            self._train_round(record)
            self._evaluate(record)
            self._analyze(record)
            self.curriculum.add_mined(self._generate(record))
            self._finish_round(record, started)
        return self.history


def fault_point(phase: str, round: int) -> None:
    """Crash-test hook: `SENTINEL_FAULT_AT=phase:round` kills this process with SIGKILL when the
    loop reaches that point (phases: rollout, train, checkpoint, commit, in_commit: inside the
    store transaction, after every insert). `disk_full:round` instead raises ENOSPC inside that
    transaction, as a full disk would. Unset, it does nothing. The reliability tests use it to
    fail the loop at exact places."""
    target = os.environ.get("SENTINEL_FAULT_AT")
    if not target:
        return
    if target == f"{phase}:{round}":
        os.kill(os.getpid(), signal.SIGKILL)
    if phase == "in_commit" and target == f"disk_full:{round}":
        raise OSError(errno.ENOSPC, "No space left on device (injected by SENTINEL_FAULT_AT)")
