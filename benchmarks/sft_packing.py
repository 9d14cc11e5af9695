"""SFT tokens per second, packed against right-padded, on the quickstart's cold-start data.

The data are what the loop's round 0 trains on: reference trajectories of the quickstart's arith
distribution (2-4 operands, values up to 20, no instruction), replayed through the real tool
environment with the tiny policy's chat format. The model is the quickstart's tiny Llama (hidden
192, 4 layers), batch 64, the same seeded batches for both modes, alternated step by step in one
process. Prints the padding share and non-pad tokens per second of each mode and the ratio.

Run: `.venv/bin/python benchmarks/sft_packing.py [--steps 10] [--threads 1]`. Not a test.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch


def reference_examples(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    from sentinel.env.chat import ChatFormat
    from sentinel.env.environment import EnvConfig, replay
    from sentinel.env.parser import HermesParser
    from sentinel.policy import build_tokenizer
    from sentinel.tasks import load_family

    family = load_family(
        "arith", {"min_operands": 2, "max_operands": 4, "max_value": 20, "instruction": ""}
    )
    chat = ChatFormat(build_tokenizer())
    env = EnvConfig(max_turns=6, max_tokens=384, max_turn_tokens=40)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        task = family.sample_task(rng)
        turns = family.solve(task.spec, family.tool_map()).assistant_turns()
        traj = replay(task, turns, family.tool_map(), chat, HermesParser(), env)
        out.append((traj.token_ids, traj.loss_mask))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per mode")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from sentinel.policy import TinyPolicyConfig, build_tiny_policy, load_policy
    from trainers import batch_loss

    model_dir = build_tiny_policy(Path(tempfile.mkdtemp(prefix="bench-sft-")), TinyPolicyConfig())
    model, tokenizer = load_policy(model_dir)
    model.train()
    examples = reference_examples(2048, seed=1)
    lengths = [len(ids) for ids, _ in examples]
    print(
        f"{len(examples)} reference trajectories, {min(lengths)}-{max(lengths)} tokens "
        f"(mean {statistics.mean(lengths):.0f}); batch {args.batch_size}, "
        f"max_seq_len {args.max_seq_len}, torch threads {torch.get_num_threads()}"
    )
    rng = random.Random(0)
    stats: dict[bool, list[tuple[float, int, int]]] = {False: [], True: []}
    for step in range(args.steps + 1):  # step 0 is warm-up
        batch = rng.sample(examples, args.batch_size)
        for pack in (False, True):
            t0 = time.perf_counter()
            loss, counts = batch_loss(
                model, batch, tokenizer.pad_token_id, pack=pack, max_seq_len=args.max_seq_len
            )
            loss.backward()
            model.zero_grad(set_to_none=True)
            if step:
                stats[pack].append(
                    (time.perf_counter() - t0, counts["tokens"], counts["positions"])
                )
    rate = {}
    for pack, rows in stats.items():
        seconds = sum(s for s, _, _ in rows)
        tokens = sum(t for _, t, _ in rows)
        positions = sum(p for _, _, p in rows)
        rate[pack] = tokens / seconds
        print(
            f"{'packed' if pack else 'padded':7s} {rate[pack]:8.0f} tokens/s  "
            f"padding {1 - tokens / positions:5.1%}  {seconds / len(rows):.3f} s/step "
            "(forward + backward)"
        )
    print(f"packed/padded: {rate[True] / rate[False]:.2f}")


if __name__ == "__main__":
    main()
