"""One `trainer.backend: verl` round, for the loop to call: write the dataset version, write
the launch overrides, run `python -m verl.trainer.main_ppo` in veRL's environment, ingest its
rollout dump back as Sentinel trajectories. The loop then mines, generates and commits them as
after any round (`sentinel ingest verl-rollouts` does the same for a job it did not launch).

Layout under `<run-dir>/verl/round-<r>/`: `dataset.jsonl` (the version), `agent_loops.yaml`,
`overrides.txt` (the exact command line, for a person to rerun), `rollouts/` (veRL's dump),
`checkpoints/` (veRL's; its HF model is round r+1's `model.path`), `verl.log`.

veRL needs its own environment (it pins transformers < 5.11): `python` is that environment's
interpreter (`make verl-env` builds `.venv-verl`), with Sentinel installed in it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sentinel.env.environment import EnvConfig
from sentinel.rewards import RewardConfig
from sentinel.tasks.base import TaskFamily
from sentinel.types import Task
from sentinel.verl.ingest import DumpRound, read_dump
from sentinel.verl.launch import VerlRound, agent_loop_config, hf_model_dir, overrides
from sentinel.verl.version import write_version


class VerlRunError(RuntimeError):
    """veRL's training process failed; the message names its log."""


@dataclass
class RoundResult:
    """The round's rollouts as Sentinel records (not committed: the loop commits the round with
    its evaluation and generation), the HF model veRL saved, and the command that ran."""

    round: int
    dump: DumpRound
    model_dir: Path
    command: list[str] = field(default_factory=list)


def round_dir(run_dir: Path, round_: int) -> Path:
    return Path(run_dir) / "verl" / f"round-{round_}"


def prepare_round(run_dir: Path, round_: int, tasks: list[Task], *, env: EnvConfig,
                  reward: RewardConfig, families: dict[str, TaskFamily], launch: VerlRound,
                  python: str) -> list[str]:
    """Write round `round_`'s dataset version and agent-loop file; return the veRL command.
    `launch` gives the model and the knobs; its paths are replaced by the round's."""
    where = round_dir(run_dir, round_).resolve()
    dataset = write_version(where / "dataset.jsonl", tasks, version=round_, env=env,
                            reward=reward, families=families)
    launch = replace(launch, dataset=dataset, rollout_dir=where / "rollouts",
                     checkpoint_dir=where / "checkpoints",
                     agent_loop_config=agent_loop_config(where / "agent_loops.yaml"),
                     experiment_name=f"{Path(run_dir).name}-round-{round_}")
    # Hydra's own output (config, log) goes to the round's folder, not to the caller's cwd.
    command = [python, "-m", "verl.trainer.main_ppo", f"hydra.run.dir={where / 'hydra'}",
               *overrides(launch)]
    (where / "overrides.txt").write_text("\n".join(command) + "\n", encoding="utf-8")
    return command


def run_round(run_dir: Path, round_: int, tasks: list[Task], *, env: EnvConfig,
              reward: RewardConfig, families: dict[str, TaskFamily], launch: VerlRound,
              python: str, timeout_s: float | None = None) -> RoundResult:
    """Prepare the round, run veRL to completion (its output in `verl.log`), read its dump.
    Raises `VerlRunError` when veRL exits non-zero."""
    command = prepare_round(run_dir, round_, tasks, env=env, reward=reward, families=families,
                            launch=launch, python=python)
    where = round_dir(run_dir, round_).resolve()
    log = where / "verl.log"
    with log.open("w", encoding="utf-8") as fh:
        proc = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False)
    if proc.returncode != 0:
        raise VerlRunError(f"veRL round {round_} exited with {proc.returncode}; see {log}")
    dump = read_dump(where / "rollouts", round_)
    return RoundResult(round=round_, dump=dump, command=command,
                       model_dir=hf_model_dir(where / "checkpoints", launch.steps))


def verl_missing_reason(python: str) -> str | None:
    """Why `python` cannot run a veRL round (missing, or veRL / Sentinel's agent loop do not
    import there), or None."""
    if not Path(python).exists():
        return (f"trainer.verl.python {python!r} does not exist: build veRL's environment with "
                "`make verl-env` (or point it at an interpreter with verl 0.9 and Sentinel)")
    probe = subprocess.run([python, "-c", "import verl, sentinel.verl.agent_loop"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"trainer.verl.python {python!r} cannot import veRL and Sentinel: {last}"
    return None


LOSS_AGG = {"token-mean": "token-mean", "seq-mean-token-mean": "seq-mean-token-mean",
            "dr_grpo": "seq-mean-token-sum-norm"}


class VerlTrainer:
    """`trainer.backend: verl` behind the loop's round seam (`train_round`, like the trl
    backend): each round draws `steps_per_round x tasks_per_step` tasks from the curriculum
    into a dataset version, runs one veRL job on it from the loop's current policy (saved in
    `<run-dir>/policy`), reads its rollout dump back (every trajectory through `io.observe`,
    so the loop mines and commits them as always) and loads the weights veRL saved into the
    loop's model, which evaluation, probes and the next round start from.

    veRL's optimizer state does not carry over from round to round (each job starts fresh from
    the saved weights); `state_dict` therefore holds nothing but the backend's name."""

    def __init__(self, model: Any, run_dir: Path, config: Any, families: dict[str, TaskFamily]
                 ) -> None:
        self.model, self.run_dir = model, Path(run_dir)
        self.config, self.families = config, families

    def state_dict(self) -> dict[str, Any]:
        return {"backend": "verl"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("backend") != "verl":
            raise ValueError("the checkpoint was written by another trainer backend; resume with "
                             "the config of the checkpoint (trainer.backend)")

    def launch(self, io: Any) -> VerlRound:
        cfg, v = self.config, self.config.trainer.verl
        return VerlRound(
            dataset=Path(), rollout_dir=Path(), checkpoint_dir=Path(), agent_loop_config=Path(),
            model=str((self.run_dir / "policy").resolve()), steps=io.steps,
            tasks_per_step=io.tasks_per_step, group_size=io.group_size,
            max_prompt_length=v.max_prompt_length,
            max_response_length=v.max_response_length or cfg.env.max_tokens,
            temperature=cfg.rollout.temperature, lr=cfg.grpo.lr,
            clip_low=cfg.grpo.epsilon_low, clip_high=cfg.grpo.epsilon_high,
            kl_coef=cfg.grpo.beta, loss_agg_mode=LOSS_AGG[cfg.grpo.loss_agg],
            micro_batch_size_per_gpu=v.micro_batch_size_per_gpu, rollout_name=v.rollout,
            n_gpus_per_node=v.n_gpus_per_node, nnodes=v.nnodes, extra=list(v.overrides))

    def train_round(self, io: Any) -> None:
        from transformers import AutoModelForCausalLM

        cfg = self.config
        tasks = [t for _ in range(io.steps) for t in io.sample(io.tasks_per_step)]
        result = run_round(self.run_dir, io.round, tasks, env=cfg.env, reward=cfg.reward,
                           families=self.families, launch=self.launch(io),
                           python=cfg.trainer.verl.python, timeout_s=cfg.trainer.verl.timeout_s)
        _, metrics = io.observe(result.dump.trajectories)
        trained = AutoModelForCausalLM.from_pretrained(result.model_dir)
        self.model.load_state_dict(trained.state_dict())
        self.model.eval()
        io.log({**metrics, "verl/steps": float(len(result.dump.steps))})
