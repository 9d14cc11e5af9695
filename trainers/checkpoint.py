"""Exact-resume checkpoints: model weights, trainer state and every RNG the loop draws from.

Design: one file written with `torch.save` (to a temporary name, then renamed, so a kill mid-write
leaves the previous checkpoint intact) and read back with `weights_only=True`, so loading a
checkpoint cannot run code. It holds the model's `state_dict`, the trainer's `state_dict`
(optimizer, LR schedule, reference model: `GRPOTrainer.state_dict`), the torch (CPU and, where
present, CUDA), Python `random` and NumPy global RNG states, and a caller's `extra` dict (round
number, curriculum state, ...). After `load_checkpoint`, training continues bit for bit as it would
have without the interruption (tested with `torch.equal` on the parameters).

Left out: sharded or distributed checkpoints, and keeping more than one file (the caller picks
the path); `extra` must hold only what `weights_only` loading accepts (tensors, numbers, strings,
lists, tuples, dicts).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Protocol

import torch

FORMAT = 1


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def rng_state() -> dict[str, Any]:
    """The global torch, CUDA (empty list without CUDA), `random` and NumPy RNG states."""
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        # Plain types, so `weights_only` loading accepts them.
        "numpy": (str(kind), torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    import numpy as np

    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def save_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    trainer: Stateful,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write model weights, `trainer.state_dict()`, the RNG states and `extra` to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "model": model.state_dict(),
        "trainer": trainer.state_dict(),
        "rng": rng_state(),
        "extra": dict(extra or {}),
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path, model: torch.nn.Module, trainer: Stateful) -> dict[str, Any]:
    """Restore `model`, `trainer` and the RNG states from `path`; return the saved `extra`.

    `model` and `trainer` must be built as the saved ones were (same architecture, same trainer
    config); the weights are loaded onto the model's current device.
    """
    device = next(model.parameters()).device
    payload = torch.load(Path(path), map_location=device, weights_only=True)
    if payload.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {payload.get('format')!r}, expected {FORMAT}")
    model.load_state_dict(payload["model"])
    trainer.load_state_dict(payload["trainer"])
    rng = payload["rng"]
    # RNG states must be CPU byte tensors whatever map_location moved them to.
    rng["torch"] = rng["torch"].cpu()
    rng["cuda"] = [s.cpu() for s in rng["cuda"]]
    set_rng_state(rng)
    return payload["extra"]
