"""Two counts behind the tail bench (configs/bench_recovery_tail.yaml), from its config alone:

- the cold start's recovery demonstrations per fault type, drawn as `Loop._recovery_example`
  draws them (a type the example cannot carry leaves it clean), over `sft.num_examples` examples;
- the share of one base-distribution draw that cannot carry each operator-bound fault type
  (`with_fault` gives None): what `fault.fresh` lost before it drew again.

Usage: python docs/results/recovery/tail_counts.py [CONFIG] [--draws N]
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections import Counter
from pathlib import Path

from sentinel.bench import load_bench_config
from sentinel.config import load_config
from sentinel.env.faults import NOTATIONS
from sentinel.loop import Loop


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", nargs="?", default="configs/bench_recovery_tail.yaml")
    parser.add_argument("--draws", type=int, default=2000)
    args = parser.parse_args()
    data = load_bench_config(args.config).run_config()
    config = load_config(data=data)
    with tempfile.TemporaryDirectory() as tmp:
        loop = Loop(config, Path(tmp) / "run")
        rng, counts = random.Random(0), Counter()
        for _ in range(config.sft.num_examples):
            task = loop._recovery_example(loop.mixture.sample(rng), config.sft.recovery_share,
                                          rng, config.sft.recovery_types)
            counts[next((s for s in task.skills if s.startswith("recover:")), "clean")] += 1
        print(f"cold-start examples ({config.sft.num_examples}):",
              ", ".join(f"{k} {v}" for k, v in counts.most_common()))
        family = next(iter(loop.families.values()))
        rng = random.Random(0)
        specs = [family.without_faults(family.sample_spec(rng)) for _ in range(args.draws)]
        for kind in NOTATIONS:
            lost = sum(family.with_fault(s, kind, rng) is None for s in specs) / len(specs)
            print(f"one draw cannot carry {kind}: {lost:.2f} ({args.draws} draws)")


if __name__ == "__main__":
    main()
