"""The eighth run's rewrite-only exposure (docs/results.md): the tail bench's exposure arm, each
seed at the fault share its exposure run had in RUNS/tail, drawing only the three rewrite faults
(`families.0.fault_weights`: plus, colon, minus; `fault_types` unchanged, so every prompt still
lists the `wait` tool), from the kept cold start RUNS/tail/cold-start, into RUNS/tail-tailexp,
through the bench's own launcher (`sentinel.bench.arm_config`, `_launch`).

Usage: python docs/results/recovery/rewrite_exposure.py RUNS SEED [SEED ...]
       (two at a time on 2 cores: one process with seeds 0 2 4, one with 1 3)
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from sentinel.bench import _launch, arm_config, load_bench_config


def main(runs: Path, seeds: list[int]) -> None:
    cfg = load_bench_config("configs/bench_recovery_tail.yaml", ["bench.arms=[exposure]"])
    for seed in seeds:
        made = yaml.safe_load((runs / f"tail/exposure-s{seed}/bench-config.yaml").read_text())
        share = made["families"][0]["fault_share"]
        data = arm_config(cfg, "exposure", seed, runs / "tail/cold-start/policy",
                          exposure_share=share)
        data["families"][0]["fault_weights"] = {"plus": 1.0, "colon": 1.0, "minus": 1.0}
        _launch(data, runs / f"tail-tailexp/exposure-s{seed}", data["rounds"], 1)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(s) for s in sys.argv[2:]])
