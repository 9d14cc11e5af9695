"""The Sentinel loop: cold start, then rounds of train → evaluate → analyze → generate.

Round 0: load (or build) the policy, SFT on reference trajectories of the base distribution (each
made by replaying the family's reference solution through the real environment, so SFT sees
exactly the tokens a rollout would), then evaluate on the held-out set.

Round r ≥ 1, `batch.steps_per_round` times: the curriculum picks tasks (mined, replayed, base),
`Rollouts` samples and scores a group per task, the curriculum observes them and admits the groups
worth training on, and the trainer takes one update. Then: held-out evaluation, failure analysis
of the round's failed training rollouts, and task generation from those failures; accepted tasks
enter the curriculum and are trained on in round r+1. Everything a round produced is committed to
the store in one transaction at its end, after its checkpoint is written (`sentinel.run_dir`).

Each phase is one call into its component: `TaskMixture` (base and held-out draws),
`Curriculum`, `Rollouts` (any `RolloutBackend`), the trainer (`trainers.base.PolicyTrainer`),
`FailureAnalyzer`, `run_generators`, `Store`. The loop itself holds no model state: `run` builds
the policy, the rollouts and the trainer, and hands them to the phases that use them.

Simplifications (deliberate, for now): rollouts and updates alternate synchronously; the held-out
set is drawn once and never trained on; failures are mined from training rollouts only (held-out
failures would leak the test set into training).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from sentinel.analyzer import FailureAnalyzer
from sentinel.config import SentinelConfig
from sentinel.curriculum import Curriculum
from sentinel.env.chat import ChatFormat
from sentinel.env.parser import parser_class
from sentinel.loggers import make_logger, trl_names
from sentinel.progress import phase
from sentinel.record import RoundRecord, average
from sentinel.rollout import Rollouts, batch_metrics, build_backend, pass_rates
from sentinel.run_dir import RunDir, fault_point
from sentinel.tasks.mixture import TaskMixture
from sentinel.types import Task, Trajectory, new_id
from task_store import Store
from trainers import distributed

__all__ = ["Loop", "LoopError", "RoundRecord", "fault_point"]

REFERENCE_DIR = "reference"  # trainer.backend trl, beta > 0: the cold-started policy


class LoopError(RuntimeError):
    """A run that cannot start or continue as asked; the message says why."""


@contextmanager
def _verl_errors(round: int) -> Iterator[None]:
    """A veRL job that failed (trainer.backend verl) as a `LoopError` saying what to do."""
    try:
        yield
    except RuntimeError as exc:
        from sentinel.verl.round import VerlRunError

        if not isinstance(exc, VerlRunError):
            raise
        raise LoopError(f"{exc}\nround {round} was not stored; once the cause is fixed, "
                        "continue with: sentinel loop --resume --run-dir <run-dir>") from None


class Loop:
    """One run in `run_dir`. Constructing it reads the config and draws the held-out set; it
    writes nothing but the directory. `run` does the work."""

    def __init__(self, config: SentinelConfig, run_dir: str | Path,
                 console: Console | None = None) -> None:
        from generators import load_generator

        self.config, self.run_dir = config, RunDir(run_dir)
        # Under a launcher only rank 0 reports; the others train and sample, silently.
        self.console = console or Console(quiet=not distributed.is_main())
        self.rng = random.Random(config.seed)
        self.mixture = TaskMixture.from_entries(config.families)
        held_out = TaskMixture.from_entries(config.eval.families or config.families)
        # Tasks find their family by name; a training entry wins over a held-out one of the name.
        self.families = self.mixture.families | {
            k: v for k, v in held_out.families.items() if k not in self.mixture.families}
        self.eval_tasks = held_out.draw(config.eval.num_tasks, config.eval.seed,
                                        stratified=config.eval.stratified)
        self.curriculum = Curriculum.from_config(
            config.curriculum, self.mixture.sample, seed=config.seed,
            excluded_ids={t.task_id for t in self.eval_tasks})
        self.analyzer = FailureAnalyzer(self.families)
        self.generators = [load_generator(spec) for spec in config.generators]
        self.store = Store(self.run_dir.store_path)
        self.history: list[dict[str, Any]] = []

    # -- driver --------------------------------------------------------------------------------
    def run(self, *, resume: bool = False) -> list[dict[str, Any]]:
        """Run round 0 (cold start) and `config.rounds` GRPO rounds; returns the new round rows.

        With `resume`, continue the run whose process died: the store says which rounds are
        committed, the matching checkpoint restores everything else. Without it, a run directory
        whose store already holds a run is refused. The run's `runs` row is written once, when
        the run starts; resuming adds none.
        """
        from sentinel.policy import check_policy_source
        from sentinel.spec_writer import bind_spec_writers

        if distributed.launched() and self.config.trainer.backend != "trl":
            raise LoopError(f"{distributed.world_size()} processes were launched, but "
                            f"trainer.backend {self.config.trainer.backend!r} runs in one: set "
                            "trainer.backend: trl (docs/scale-out.md)")
        if not distributed.is_main():
            return self._follow()
        if self.config.trainer.backend == "verl":  # before the store, like the policy check
            from sentinel.verl.round import verl_missing_reason

            reason = verl_missing_reason(self.config.trainer.verl.python)
            if reason:
                raise LoopError(reason)
        try:  # before the store is opened: a policy that cannot load leaves nothing behind
            check_policy_source(self.config.policy.model)
        except ValueError as exc:
            raise LoopError(str(exc)) from None
        done = self._open_store(resume)
        cfg = self.config
        if done and done[-1] >= cfg.rounds:
            self.console.print(f"{self.run_dir.path}: all {cfg.rounds} rounds are committed; "
                               "nothing to do")
            distributed.broadcast({"first": cfg.rounds + 1})
            return []
        bind_spec_writers(self.generators)  # a `teacher` with `model: tiny` gets its model here
        logger = make_logger(cfg.logging, self.run_dir.path,
                             run_config=cfg.model_dump(mode="json"), console=self.console)
        rollouts = None
        try:
            model, tokenizer, rollouts = self._policy()
            first = 0
            if done:
                trainer = self._new_trainer(model, tokenizer)
                self._restore(done[-1], model, trainer)
                first = done[-1] + 1
                self.console.print(f"resuming {self.run_dir.path} after round {done[-1]}")
            else:
                record = RoundRecord(round=0)
                if cfg.sft.enabled:
                    with record.timed("sft"):
                        self._cold_start(record, model, tokenizer, rollouts)
                # After SFT: the trainer's reference model (beta > 0) is the SFT policy.
                trainer = self._new_trainer(model, tokenizer)
                if hasattr(trainer, "save_reference"):
                    trainer.save_reference()
                self._evaluate(record, rollouts)
                self._finish(record, model, tokenizer, trainer, logger)
                first = 1
            # Other ranks (a launcher's) start from the checkpoint of round first - 1.
            distributed.broadcast({"first": first})
            for r in range(first, cfg.rounds + 1):
                record = RoundRecord(round=r)
                self._train(record, rollouts, trainer, logger)
                self._evaluate(record, rollouts)
                self._analyze(record)
                self.curriculum.add_mined(self._generate(record, rollouts, (model, tokenizer)))
                self._finish(record, model, tokenizer, trainer, logger)
                distributed.broadcast(self.curriculum.state_dict())
            return self.history
        finally:
            # A vLLM engine is shut down here, not whenever it is collected: vLLM's parallel
            # state is process-wide, and a late shutdown would tear down a later engine's.
            close = getattr(getattr(rollouts, "backend", None), "close", None)
            if close is not None:
                close()
            logger.close()

    def _policy(self) -> tuple[Any, Any, Rollouts]:
        """The run's policy `(model, tokenizer)` and the `Rollouts` that sample it. Under a
        launcher, `policy.device: cuda` means this rank's GPU (LOCAL_RANK)."""
        import os

        from sentinel.policy import load_run_policy

        cfg = self.config
        policy = cfg.policy
        if distributed.launched() and policy.device == "cuda":
            policy = policy.model_copy(update={"device": f"cuda:{os.environ['LOCAL_RANK']}"})
        model, tokenizer = load_run_policy(policy, self.run_dir.policy_init_dir, cfg.seed)
        rollouts = Rollouts(
            build_backend(cfg.rollout.backend, model, tokenizer,
                          batch_size=cfg.rollout.batch_size, engine=cfg.rollout.engine,
                          vllm=cfg.rollout.vllm, seed=cfg.seed),
            ChatFormat(tokenizer), parser_class(cfg.env.parser)(), self.families, cfg.env,
            cfg.reward, temperature=cfg.rollout.temperature, rng=self.rng)
        return model, tokenizer, rollouts

    def _follow(self) -> list[dict[str, Any]]:
        """A launcher's rank > 0: wait for rank 0's cold start (or resume), start from its
        checkpoint, then train every round beside it (trl's collectives keep the weights and
        optimizer equal) and take rank 0's curriculum after each round, mined tasks included.
        It writes nothing to the run directory."""
        import torch

        from sentinel.loggers import NullLogger

        cfg, rank = self.config, distributed.rank()
        first = distributed.broadcast(None)["first"]
        if first > cfg.rounds:
            return []
        model, tokenizer, rollouts = self._policy()
        try:
            trainer = self._new_trainer(model, tokenizer)
            extra = self.run_dir.load_checkpoint(first - 1, model, trainer)
            self.curriculum.load_state_dict(extra["curriculum"])
            model.eval()
            for r in range(first, cfg.rounds + 1):
                # This rank's own episode and sampling randomness (rank 0 keeps the run's).
                self.rng.seed(f"{cfg.seed}:{rank}:{r}")
                torch.manual_seed(cfg.seed * 1_000_003 + rank * 1009 + r)
                self._train(RoundRecord(round=r), rollouts, trainer, NullLogger())
                self.curriculum.load_state_dict(distributed.broadcast(None))
            return []
        finally:
            close = getattr(rollouts.backend, "close", None)
            if close is not None:
                close()

    def _make_sampler(self, backend: str, model: Any, tokenizer: Any,
                      options: dict[str, Any] | None = None) -> Any:
        """A rollout backend over another model (a generator's own), with this run's settings;
        `options` overrides `rollout.vllm`'s keys for a vllm one."""
        cfg = self.config.rollout
        vllm = {**cfg.vllm.model_dump(), **(options or {})}
        return build_backend(backend, model, tokenizer, batch_size=cfg.batch_size,
                             engine=cfg.engine, vllm=vllm, seed=self.config.seed)

    def _open_store(self, resume: bool) -> list[int]:
        """The committed rounds; creates the store and its `runs` row for a new run."""
        path = self.run_dir.store_path
        if not path.exists() or not self.store.run_ids():
            self.store = Store.create(path, run_id=new_id("run"),
                                      config=self.config.model_dump(mode="json"))
            return []
        if not resume:
            raise LoopError(f"{self.run_dir.path} already holds a run; use --resume to continue "
                            "it or a fresh --run-dir")
        done = self.store.completed_rounds()
        if done != list(range(len(done))):
            raise LoopError(f"{self.run_dir.path}: committed rounds {done} are not contiguous")
        return done

    def _new_trainer(self, model: Any, tokenizer: Any) -> Any:
        cfg = self.config
        steps = cfg.rounds * cfg.batch.steps_per_round * cfg.grpo.num_iterations
        if cfg.trainer.backend == "verl":
            from sentinel.verl.round import VerlTrainer

            return VerlTrainer(model, self.run_dir.path, cfg, self.families)
        if cfg.trainer.backend == "trl":
            from trainers.trl_backend import TRLTrainer

            return TRLTrainer(
                model, tokenizer, cfg.grpo_trainer_config(),
                max_completion_tokens=cfg.grpo.max_completion_tokens,
                reward_weights={"outcome": cfg.reward.w_outcome, "format": cfg.reward.w_format,
                                "process": cfg.reward.w_process},
                seed=cfg.seed, output_dir=self.run_dir.path / "trl",
                reference_dir=self.run_dir.path / REFERENCE_DIR if cfg.grpo.beta > 0 else None,
                world_size=distributed.world_size(), total_steps=steps)
        from trainers.grpo import GRPOTrainer

        return GRPOTrainer(model, cfg.grpo_trainer_config(), pad_token_id=tokenizer.pad_token_id,
                           total_steps=steps)

    # -- phases --------------------------------------------------------------------------------
    def _rollout(self, rollouts: Rollouts, tasks: list[Task], samples: int, label: str,
                 **kwargs: Any) -> list[Trajectory]:
        with phase(self.console, label, len(tasks) * samples) as update:
            return rollouts.run(tasks, samples, on_turn=update, **kwargs)

    def _cold_start(self, record: RoundRecord, model: Any, tokenizer: Any,
                    rollouts: Rollouts) -> None:
        from trainers.sft import SFTTrainer

        cfg, rng = self.config.sft, random.Random(self.config.seed + 1)
        examples = []
        for _ in range(cfg.num_examples):
            task = self.mixture.sample(rng)
            if cfg.recovery_share is not None:
                task = self._recovery_example(task, cfg.recovery_share, rng, cfg.recovery_types)
            if task.task_id in self.curriculum.excluded_ids:
                continue
            traj = self.families[task.family].reference_trajectory(
                task, rollouts.chat, rollouts.parser, self.config.env)
            examples.append((traj.token_ids, traj.loss_mask))
            record.tasks[task.task_id] = task
        trainer = SFTTrainer(model, cfg, pad_token_id=tokenizer.pad_token_id)
        with phase(self.console, "SFT cold start", cfg.steps) as update:
            metrics = trainer.train(examples, on_step=lambda s, m: update(s))
        model.eval()
        record.metrics.update({f"sft/{k}": float(v) for k, v in metrics.items()})
        record.metrics["sft/examples"] = float(len(examples))

    def _recovery_example(self, task: Task, share: float, rng: random.Random,
                          weights: dict[str, float] | None = None) -> Task:
        """`task` clean, or with probability `share` carrying a fault of its family's configured
        types (`sft.recovery_share`), drawn by `weights` (`sft.recovery_types`; None: uniformly):
        the cold start's dose of recovery demonstrations."""
        family = self.families[task.family]
        spec = family.without_faults(task.spec)
        types = list(getattr(family.config, "fault_types", None) or [])
        if weights is not None:
            types = [t for t in types if weights.get(t, 0.0) > 0]
        if types and rng.random() < share:
            kind = (rng.choice(types) if weights is None
                    else rng.choices(types, [weights[t] for t in types])[0])
            spec = family.with_fault(spec, kind, rng) or spec
        return task if spec == task.spec else family.make_task(spec, origin=task.origin)

    def _train(self, record: RoundRecord, rollouts: Rollouts, trainer: Any, logger: Any) -> None:
        if hasattr(trainer, "train_round"):
            self._train_round(record, rollouts, trainer, logger)
            return
        cfg, r = self.config.batch, record.round
        step_metrics: list[dict[str, float]] = []
        for step in range(cfg.steps_per_round):
            fault_point("rollout", r)
            with record.timed("rollout"):
                tasks = self.curriculum.sample(cfg.tasks_per_step)
                record.tasks |= {t.task_id: t for t in tasks if t.task_id not in record.tasks}
                trajs = self._rollout(
                    rollouts, tasks, cfg.group_size,
                    f"round {r} step {step + 1}/{cfg.steps_per_round} rollouts",
                    split="train", round=r, group_prefix=f"r{r}s{step}")
            batch = self.curriculum.observe(trajs)
            metrics = self.curriculum.metrics()
            fault_point("train", r)
            with record.timed("train"), phase(
                    self.console, f"round {r} step {step + 1}/{cfg.steps_per_round} update",
                    1) as done:
                metrics.update(trainer.update(batch))
                done(1)
            metrics.update(batch_metrics(trajs))
            logger.log(trl_names(metrics), step=(r - 1) * cfg.steps_per_round + step + 1)
            step_metrics.append(metrics)
            record.trajectories += trajs
        record.metrics.update(average(step_metrics))

    def _train_round(self, record: RoundRecord, rollouts: Rollouts, trainer: Any,
                     logger: Any) -> None:
        """A round trained by a backend that samples itself (trl): it draws from the
        curriculum and rolls out through the loop's `Rollouts`; every rank's trajectories come
        back through `observe` (on every rank, so each rank's curriculum stays identical), and
        rank 0 keeps them for the store."""
        from trainers.trl_backend import RoundIO

        cfg, r = self.config.batch, record.round
        step_metrics: list[dict[str, float]] = []
        updates = [0]

        def rollout(tasks: list[Task], samples: int, prefix: str) -> list[Trajectory]:
            fault_point("rollout", r)
            with record.timed("rollout"):
                return self._rollout(rollouts, tasks, samples,
                                     f"round {r} step {updates[0] + 1}/{cfg.steps_per_round} "
                                     "rollouts", split="train", round=r, group_prefix=prefix)

        def observe(trajs: list[Trajectory]) -> tuple[set[str], dict[str, float]]:
            fault_point("train", r)
            admitted = {t.traj_id for t in self.curriculum.observe(trajs)}
            updates[0] += 1
            if distributed.is_main():
                record.trajectories += trajs
                # Tasks are recorded when rolled out (by any rank), not when drawn: the data
                # loader draws a batch ahead, and the round's last draw is never trained on.
                record.tasks |= {t.task_id: self.curriculum.tasks[t.task_id] for t in trajs
                                 if t.task_id not in record.tasks}
            return admitted, {**self.curriculum.metrics(), **batch_metrics(trajs)}

        def log(metrics: dict[str, float]) -> None:
            step_metrics.append(metrics)
            logger.log(trl_names(metrics), step=(r - 1) * cfg.steps_per_round + updates[0])

        with record.timed("train"), _verl_errors(r):
            trainer.train_round(RoundIO(
                round=r, steps=cfg.steps_per_round, tasks_per_step=cfg.tasks_per_step,
                group_size=cfg.group_size, sample=self.curriculum.sample, rollout=rollout,
                observe=observe,
                log=log))
        record.metrics.update(average(step_metrics))

    def _evaluate(self, record: RoundRecord, rollouts: Rollouts) -> None:
        cfg, r = self.config.eval, record.round
        with record.timed("eval"):
            sampled = self._rollout(rollouts, self.eval_tasks, cfg.samples,
                                    f"round {r} held-out eval", split="eval", round=r,
                                    group_prefix=f"r{r}eval")
            greedy = (self._rollout(rollouts, self.eval_tasks, 1, f"round {r} held-out greedy",
                                    split="eval", round=r, group_prefix=f"r{r}greedy",
                                    greedy=True) if cfg.greedy else [])
        record.add_eval(self.eval_tasks, sampled, greedy)

    def _analyze(self, record: RoundRecord) -> None:
        with record.timed("analyze"):
            record.failures, record.clusters = self.analyzer.analyze(
                record.train(), record.tasks, record.round)

    def _generate(self, record: RoundRecord, rollouts: Rollouts, policy: Any) -> list[Task]:
        from generators import GenerationContext, Replay, run_generators

        gen, r = self.config.generation, record.round

        def probe(tasks: list[Task]) -> dict[str, float]:
            with record.timed("probe"):
                trajs = self._rollout(rollouts, tasks, gen.probe_samples,
                                      f"round {r} difficulty probe", split="probe", round=r,
                                      group_prefix=f"r{r}probe")
            n = record.metrics.get("probe_rollouts", 0.0)
            record.metrics["probe_rollouts"] = n + len(trajs)
            return pass_rates(trajs)

        with record.timed("generate"):
            ctx = GenerationContext(
                round=r, failures=record.failures,
                tasks={f.task_id: record.tasks[f.task_id] for f in record.failures},
                families=self.families, rng=random.Random(self.rng.getrandbits(64)),
                budget=gen.max_candidates, clusters=record.clusters,
                mastered=self.curriculum.mastered_tasks(), policy=policy,
                trajectories={t.traj_id: t for t in record.train()},
                replay=Replay(rollouts.chat, rollouts.parser, self.config.env),
                sampler=rollouts.backend, make_sampler=self._make_sampler)
            # Every task of this round is in `record.tasks` (eval, trained, mined before);
            # earlier rounds' are in the store.
            accepted, rejections, counts = run_generators(
                self.generators, ctx, time_limit_s=gen.time_limit_s,
                known_task_ids=lambda ids: (set(ids) & record.tasks.keys())
                | self.store.existing_task_ids(ids),
                probe=probe if gen.probe else None,
                probe_band=tuple(gen.probe_band), probe_budget=gen.max_probed)
        record.tasks.update({t.task_id: t for t in accepted})
        record.rejections += rejections
        record.generated = counts
        return accepted

    # -- end of a round --------------------------------------------------------------------------
    def _finish(self, record: RoundRecord, model: Any, tokenizer: Any, trainer: Any,
                logger: Any) -> None:
        """Checkpoint, then commit the round in one transaction, then keep only its checkpoint
        (see `sentinel.run_dir` for why in this order)."""
        r = record.round
        fault_point("checkpoint", r)
        self.run_dir.save_checkpoint(r, model, trainer, extra={
            "loop_rng": self.rng.getstate(), "curriculum": self.curriculum.state_dict()})
        fault_point("commit", r)
        with record.timed("store"):
            row = record.row()
            self.store.record_round(
                r, row, tasks=[t.to_row() for t in record.tasks.values()],
                trajectories=[t.to_row() for t in record.trajectories],
                steps=[s.to_row(t.traj_id) for t in record.trajectories for s in t.steps],
                failures=[f.to_row() for f in record.failures],
                rejections=[x.to_row() for x in record.rejections],
                evals=record.evals, clusters=record.clusters,
                before_commit=lambda: fault_point("in_commit", r))
            self.run_dir.save_policy(model, tokenizer)
        self.run_dir.prune_checkpoints(keep=r)
        logger.log_round(r, row)
        self.history.append(row)
        self.console.print(record.summary(row))

    def _restore(self, round: int, model: Any, trainer: Any) -> None:
        """Continue after committed round `round`: weights, optimizer, schedule, the curriculum
        and every RNG, so the rest of the run samples exactly as an uninterrupted one."""
        self.run_dir.discard_uncommitted(round)
        try:
            extra = self.run_dir.load_checkpoint(round, model, trainer)
        except FileNotFoundError as exc:
            raise LoopError(str(exc)) from None
        self.analyzer.remember(
            self.store.query("SELECT cluster_id, round, share FROM clusters ORDER BY round")[1])
        version, internal, gauss = extra["loop_rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.curriculum.load_state_dict(extra["curriculum"])
        model.eval()
