"""The static engine's shared-prefix prefill, on against off, on SmolLM2-135M's arith prompts.

Every prompt of a family starts with the same system text (the instruction and, for a template
that drops `tools`, Sentinel's tools block: ~290 SmolLM2 tokens). The static engine prefills that
common prefix once per chunk and shares it with every row (`MIN_SHARED_PREFIX`); turning the
sharing off (a threshold no prefix reaches) prefills it once per distinct context, as before.
Both run on the same contexts in one process, alternated, seeded alike. Prints seconds per call
of each and the ratio.

Run: `.venv/bin/python benchmarks/shared_prefix.py [--contexts 32] [--tokens 8] [--repeats 2]
[--threads 1] [--policy smollm2-135m]`. Not a test.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch


def contexts(tokenizer, n: int, seed: int) -> list[list[int]]:
    from sentinel.env.chat import ChatFormat
    from sentinel.env.tools import tool_schema
    from sentinel.tasks.arith import ArithConfig, ArithFamily

    chat = ChatFormat(tokenizer)
    family = ArithFamily(ArithConfig(fault_share=0.5, fault_types=[
        "timeout", "rate_limit", "notation", "renamed", "truncated"]))
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        task = family.make_task(family.sample_spec(rng))
        schemas = [tool_schema(t) for t in family.tool_map(task.spec).values()
                   if not getattr(t, "hidden", False)]
        out.append(chat.prompt_ids(task.prompt, schemas))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="smollm2-135m")
    parser.add_argument("--contexts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=8, help="new tokens per context")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from sentinel.policy import load_policy
    from sentinel.rollout import static

    model, tokenizer = load_policy(args.policy)
    ctxs = contexts(tokenizer, args.contexts, seed=0)
    shared = static._shared_prefix_len(ctxs)
    print(f"{args.policy}: {len(ctxs)} prompts of {min(map(len, ctxs))}-{max(map(len, ctxs))} "
          f"tokens, {shared} shared; {args.tokens} new tokens each; {args.threads} thread(s)")
    engine = static.StaticEngine.build(model, tokenizer.eos_token_id, tokenizer.pad_token_id)
    default = static.MIN_SHARED_PREFIX
    times: dict[str, list[float]] = {"shared": [], "per context": []}
    try:
        for rep in range(args.repeats):
            for mode in ("per context", "shared") if rep % 2 == 0 else ("shared", "per context"):
                static.MIN_SHARED_PREFIX = default if mode == "shared" else 1 << 30
                torch.manual_seed(rep)
                start = time.perf_counter()
                engine.sample(ctxs, [args.tokens] * len(ctxs), temperature=0.7, greedy=False)
                times[mode].append(time.perf_counter() - start)
                print(f"repeat {rep + 1}: {mode}: {times[mode][-1]:.2f} s", flush=True)
    finally:
        static.MIN_SHARED_PREFIX = default
    med = {mode: statistics.median(ts) for mode, ts in times.items()}
    print(f"per context {med['per context']:.2f} s, shared {med['shared']:.2f} s: "
          f"ratio {med['per context'] / med['shared']:.1f}x (median of {args.repeats})")


if __name__ == "__main__":
    main()
