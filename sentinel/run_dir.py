"""A run directory: where a run's store, policy and checkpoints live, and how they are saved and
restored.

Layout of `<run-dir>/`:
- `sentinel.duckdb`: the run store (task_store), one transaction per round;
- `policy-init/`: the embedded policy as built from its config (`policy.model: tiny`), before SFT;
- `policy/`: the latest committed round's policy, an ordinary Hugging Face model directory;
- `checkpoints/round-<r>.pt`: exact-resume state after round r (weights, trainer, every RNG, the
  curriculum); only the latest committed round's file is kept.

Ordering contract (what makes a killed run resumable): a round's checkpoint is written BEFORE its
store transaction commits, so a committed round always has its checkpoint, and a checkpoint whose
round never committed is discarded on resume (`discard_uncommitted`).

`fault_point` is the crash-test hook the reliability tests use to kill the loop at exact places.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path
from typing import Any

from task_store.store import DB_FILENAME

POLICY_DIR = "policy"
POLICY_INIT_DIR = "policy-init"
CHECKPOINT_DIR = "checkpoints"


class RunDir:
    """Paths and persistence of one run directory (created if missing)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    @property
    def store_path(self) -> Path:
        return self.path / DB_FILENAME

    @property
    def policy_dir(self) -> Path:
        return self.path / POLICY_DIR

    @property
    def policy_init_dir(self) -> Path:
        return self.path / POLICY_INIT_DIR

    def checkpoint_path(self, round: int) -> Path:
        return self.path / CHECKPOINT_DIR / f"round-{round}.pt"

    def save_policy(self, model: Any, tokenizer: Any) -> None:
        model.save_pretrained(self.policy_dir)
        tokenizer.save_pretrained(self.policy_dir)

    def save_checkpoint(self, round: int, model: Any, trainer: Any, extra: dict[str, Any]) -> None:
        from trainers.checkpoint import save_checkpoint

        save_checkpoint(self.checkpoint_path(round), model, trainer,
                        extra={"round": round, **extra})

    def load_checkpoint(self, round: int, model: Any, trainer: Any) -> dict[str, Any]:
        """Restore `model` and `trainer` (and the global RNGs) from round `round`'s checkpoint;
        returns its `extra` dict."""
        from trainers.checkpoint import load_checkpoint

        path = self.checkpoint_path(round)
        if not path.exists():
            raise FileNotFoundError(f"cannot resume: round {round} is committed but {path} is "
                                    "missing")
        return load_checkpoint(path, model, trainer)

    def _checkpoints(self) -> list[tuple[int, Path]]:
        return [(int(p.name.split(".")[0].removeprefix("round-")), p)
                for p in (self.path / CHECKPOINT_DIR).glob("round-*.pt*")]

    def prune_checkpoints(self, keep: int) -> None:
        """Delete the checkpoints of rounds before `keep`."""
        for r, path in self._checkpoints():
            if r < keep:
                path.unlink()

    def discard_uncommitted(self, last_committed: int) -> None:
        """Delete checkpoints (and half-written temporaries) of rounds after `last_committed`:
        written, but their round never committed."""
        for r, path in self._checkpoints():
            if r > last_committed:
                path.unlink()


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
