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
