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

import random
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sentinel.analyzer import FailureAnalyzer
from sentinel.config import SentinelConfig
from sentinel.curriculum import Curriculum
from sentinel.env.chat import ChatFormat
from sentinel.env.environment import Episode, replay
from sentinel.env.parser import PARSERS
from sentinel.rewards import score
from sentinel.rollout import run_episodes
from sentinel.tasks import TaskFamily, load_family
from sentinel.types import Failure, Rejection, Task, Trajectory, new_id
from task_store import Store

POLICY_DIR = "policy"


@dataclass
class RoundRecord:
    """Everything one round will commit, gathered in memory until the round's transaction."""

    round: int
    tasks: dict[str, Task] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
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
        self.eval_tasks = self._held_out_tasks()
        self.curriculum = Curriculum(
            self._sample_base, mined_fraction=config.curriculum.mined_fraction,
            replay_fraction=config.curriculum.replay_fraction,
            mastery_threshold=config.curriculum.mastery_threshold,
            mastery_min_samples=config.curriculum.mastery_min_samples,
            seed=config.seed, excluded_ids={t.task_id for t in self.eval_tasks},
        )
        self.store = Store.create(self.run_dir / "sentinel.duckdb", run_id=new_id("run"),
                                  config=config.model_dump(mode="json"))
        self.history: list[dict[str, Any]] = []

    # -- tasks -------------------------------------------------------------------------------
    def _sample_base(self, rng: random.Random) -> Task:
        entry = rng.choices(self.config.families, weights=self.weights)[0]
        return self.families[entry.name].sample_task(rng, origin="seed")

    def _held_out_tasks(self) -> list[Task]:
        cfg = self.config.eval
        entries = cfg.families or self.config.families
        families = {e.name: self.families.get(e.name) or load_family(e.name, e.config)
                    for e in entries}
        self.families.update({k: v for k, v in families.items() if k not in self.families})
        rng = random.Random(cfg.seed)
        tasks: dict[str, Task] = {}
        for _ in range(100 * cfg.num_tasks):
            if len(tasks) >= cfg.num_tasks:
                break
            entry = rng.choices(entries, weights=[e.weight for e in entries])[0]
            task = families[entry.name].sample_task(rng, origin="eval")
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
                                 batch_size=self.config.rollout.batch_size)

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
                episode = Episode(task, family.tool_map(), self.chat, self.parser,
                                  self.config.env, random.Random(self.rng.getrandbits(64)))
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
            turns = family.solve(task.spec, family.tool_map()).assistant_turns()
            traj = replay(task, turns, family.tool_map(), self.chat, self.parser, self.config.env)
            examples.append((traj.token_ids, traj.loss_mask))
            record.tasks[task.task_id] = task
        trainer = SFTTrainer(self.model, cfg, pad_token_id=self.tokenizer.pad_token_id)
        with self._progress() as progress:
            bar = progress.add_task("SFT cold start", total=cfg.steps)
            metrics = trainer.train(examples, on_step=lambda s, m: progress.update(bar, completed=s))
        self.model.eval()
        record.metrics.update({f"sft/{k}": float(v) for k, v in metrics.items()})
        record.metrics["sft/examples"] = float(len(examples))

    def _train_round(self, record: RoundRecord) -> None:
        from trainers.grpo import group_advantages

        cfg = self.config.batch
        step_metrics: list[dict[str, float]] = []
        for step in range(cfg.steps_per_round):
            with record.timed("rollout"):
                tasks = self.curriculum.sample(cfg.tasks_per_step)
                for t in tasks:
                    record.tasks.setdefault(t.task_id, t)
                trajs = self._rollout(
                    tasks, cfg.group_size, split="train", round=record.round,
                    group_prefix=f"r{record.round}s{step}",
                    label=f"round {record.round} step {step + 1}/{cfg.steps_per_round} rollouts")
            metrics = dict(self.curriculum.metrics())
            with record.timed("train"):
                advantages = group_advantages([t.reward for t in trajs],
                                              [t.group_id for t in trajs],
                                              scale=self.config.grpo.scale_rewards)
                metrics.update(self.trainer.step(trajs, advantages))
            by_task: dict[str, list[bool]] = defaultdict(list)
            for t in trajs:
                by_task[t.task_id].append(t.success)
            for task_id, outcomes in by_task.items():
                self.curriculum.observe(task_id, sum(outcomes), len(outcomes))
            metrics["reward"] = _mean([t.reward for t in trajs]) or 0.0
            metrics["success"] = _mean([float(t.success) for t in trajs]) or 0.0
            step_metrics.append(metrics)
            record.trajectories += trajs
        for key in step_metrics[0]:
            record.metrics[key] = sum(m.get(key, 0.0) for m in step_metrics) / len(step_metrics)

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

    def _generate(self, record: RoundRecord) -> list[Task]:
        from generators import GenerationContext, run_generators

        with record.timed("generate"):
            ctx = GenerationContext(
                round=record.round, failures=record.failures,
                tasks={f.task_id: record.tasks[f.task_id] for f in record.failures},
                families=self.families, rng=random.Random(self.rng.getrandbits(64)),
                budget=self.config.generation.budget,
            )
            pending = {t.task_id for t in self.eval_tasks} | set(self.curriculum.tasks)

            def known(ids):
                ids = list(ids)
                return {i for i in ids if i in pending} | self.store.existing_task_ids(ids)

            accepted, rejections, counts = run_generators(
                self.generators, ctx, known_task_ids=known,
                time_limit_s=self.config.generation.time_limit_s)
        for task in accepted:
            record.tasks[task.task_id] = task
        record.rejections += rejections
        record.generated = counts
        return accepted

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
                evals=record.evals,
            )
            self._save_policy()
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

    # -- driver --------------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        """Run round 0 (cold start) and `config.rounds` GRPO rounds; returns the round rows."""
        from trainers.grpo import GRPOTrainer

        if self.store.completed_rounds():
            raise RuntimeError(f"{self.run_dir} already holds a run; use a fresh --run-dir")
        self._load_policy()
        started = time.time()
        record = RoundRecord(round=0)
        if self.config.sft.enabled:
            with record.timed("sft"):
                self._cold_start(record)
        self._evaluate(record)
        self._commit(record, started)

        self.trainer = GRPOTrainer(self.model, self.config.grpo,
                                   pad_token_id=self.tokenizer.pad_token_id)
        for r in range(1, self.config.rounds + 1):
            started = time.time()
            record = RoundRecord(round=r)
            self._train_round(record)
            self._evaluate(record)
            self._analyze(record)
            self.curriculum.add_mined(self._generate(record))
            self._commit(record, started)
        return self.history
