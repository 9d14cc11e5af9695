"""GRPO update with zero-advantage rows run forward only, against the full backward, side by side.

A group whose rewards are all equal has all-zero advantages; with `beta = 0` and no covariance
penalty its rows contribute exactly nothing to the gradient, so `GRPOTrainer` runs them forward
only (for the entropy/clip metrics and the KL guard) instead of forward and backward
(`trainers/grpo.py`, `skip_inert`). This script times `GRPOTrainer.update` both ways on the same
batches, alternating (ours, then the full backward, per batch), with the recovery bench's GRPO
recipe (`configs/bench_recovery.yaml`: micro-batches of 64, Adam's second moment warm-started,
KL guard 0.02 with halving) and its batch shape (16 groups x 8).

Batches:
- default: the embedded tiny policy (the bench config's `policy.tiny`, random init) and synthetic
  multi-turn rows: per group one prompt of 60-90 tokens shared by its 8 rows, completions of
  3 turns (policy tokens trained, tool observations not), 20-60 tokens in all; a share
  `--zero-share` of the groups (default 0.75, the recovery bench's uniform arm measured 0.77 of
  its groups with equal rewards) get equal rewards, the others random ones.
- `--run-dir RUN --policy DIR`: the training rows a real run stored (`RUN/sentinel.duckdb`,
  round `--round`, in batches of 16 groups as stored) with that policy; their old log-probs are
  recomputed by the policy (the store keeps none), so the first pass is on-policy.

Both sides start from the same weights and see the same batches, so they stay equal: the script
prints the largest parameter difference at the end (float summation order only). Time: wall
seconds per update and process CPU seconds; torch runs with `--threads` threads.

Run: `.venv/bin/python benchmarks/grpo_inert.py [--steps 6] [--threads 1]`. Last line:
`full/forward-only: N.NN` (the full backward's seconds per update / ours). Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sentinel.bench import BenchConfig
from sentinel.config import load_config
from sentinel.policy import build_tiny_policy, load_policy
from sentinel.types import Trajectory
from trainers.grpo import GRPOTrainer

GROUPS = 16
GROUP = 8


def synthetic(vocab: int, zero_share: float, rng: random.Random) -> list[Trajectory]:
    rows = []
    n_zero = round(zero_share * GROUPS)
    for g in range(GROUPS):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(60, 90))]
        equal = g < n_zero
        level = float(rng.random() < 0.8)
        for k in range(GROUP):
            ids, mask = list(prompt), [0] * len(prompt)
            for turn in range(3):
                n = rng.randint(6, 16)
                ids += [rng.randrange(3, vocab) for _ in range(n)]
                mask += [1] * n
                if turn < 2:  # a tool observation between policy turns: context, not trained
                    n = rng.randint(4, 10)
                    ids += [rng.randrange(3, vocab) for _ in range(n)]
                    mask += [0] * n
            reward = level if equal else float(rng.random() < 0.5) + 0.1 * rng.random()
            rows.append(Trajectory(task_id=f"t{g}", messages=[], token_ids=ids, loss_mask=mask,
                                   logprobs=[0.0] * len(ids), steps=[], finish_reason="answer",
                                   reward=reward, group_id=f"g{g}", sample_idx=k))
    return rows


def stored(run_dir: Path, round_: int) -> list[list[Trajectory]]:
    import duckdb

    con = duckdb.connect(str(run_dir / "sentinel.duckdb"), read_only=True)
    rows = con.execute("SELECT group_id, token_ids, loss_mask, reward FROM trajectories "
                       "WHERE split = 'train' AND round = ? ORDER BY rowid", [round_]).fetchall()
    con.close()
    groups: dict[str, list[Trajectory]] = {}
    for gid, ids, mask, reward in rows:
        groups.setdefault(gid, []).append(Trajectory(
            task_id=gid, messages=[], token_ids=list(ids), loss_mask=list(mask),
            logprobs=[0.0] * len(ids), steps=[], finish_reason="answer", reward=float(reward),
            group_id=gid))
    ordered = list(groups.values())
    return [[t for g in ordered[i:i + GROUPS] for t in g]
            for i in range(0, len(ordered) - GROUPS + 1, GROUPS)]


def with_old_logprobs(model: torch.nn.Module, rows: list[Trajectory], temperature: float) -> None:
    from trainers.common import token_logprobs

    with torch.no_grad():
        for t in rows:
            ids = torch.tensor([t.token_ids])
            lp = token_logprobs(model, ids, torch.ones_like(ids), temperature)[0].tolist()
            t.logprobs = [x if m else 0.0 for x, m in zip(lp, t.loss_mask, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/bench_recovery.yaml")
    parser.add_argument("--steps", type=int, default=6, help="batches (updates per side)")
    parser.add_argument("--warmup", type=int, default=1, help="first updates left out")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--zero-share", type=float, default=0.75)
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--policy", type=Path, default=None)
    parser.add_argument("--round", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, model=BenchConfig)
    grpo = cfg.grpo_trainer_config()
    with tempfile.TemporaryDirectory() as tmp:
        policy = args.policy or build_tiny_policy(Path(tmp) / "policy", cfg.policy.tiny)
        model, tokenizer = load_policy(policy)
    model.eval()
    rng = random.Random(0)
    if args.run_dir is not None:
        batches = stored(args.run_dir, args.round)[: args.steps]
    else:
        batches = [synthetic(len(tokenizer), args.zero_share, rng) for _ in range(args.steps)]
    sides = {}
    for name, skip in (("forward-only", True), ("full", False)):
        m = copy.deepcopy(model)
        trainer = GRPOTrainer(m, grpo, pad_token_id=tokenizer.pad_token_id)
        trainer.skip_inert = skip
        sides[name] = (m, trainer)
    wall: dict[str, list[float]] = {n: [] for n in sides}
    cpu: dict[str, list[float]] = {n: [] for n in sides}
    inert = []
    for i, batch in enumerate(batches):
        with_old_logprobs(sides["full"][0], batch, grpo.temperature)
        for name, (_, trainer) in sides.items():
            w0, c0 = time.perf_counter(), time.process_time()
            out = trainer.update(batch)
            w, c = time.perf_counter() - w0, time.process_time() - c0
            if i >= args.warmup:
                wall[name].append(w)
                cpu[name].append(c)
            if name == "forward-only":
                inert.append(out["n_inert"])
        print(f"batch {i}: {len(batch)} rows, {int(inert[-1])} with zero advantage; "
              + ", ".join(f"{n} {wall[n][-1]:.2f} s" for n in sides if i >= args.warmup))
    diff = max(float((a - b).detach().abs().max()) for a, b in
               zip(sides["forward-only"][0].parameters(), sides["full"][0].parameters(),
                   strict=True))
    for name in sides:
        print(f"{name:12s} {statistics.fmean(wall[name]):6.2f} s/update wall, "
              f"{statistics.fmean(cpu[name]):6.2f} s CPU (mean of {len(wall[name])})")
    print(f"zero-advantage rows: {statistics.fmean(inert) / (GROUPS * GROUP):.2f} of each batch; "
          f"largest parameter difference after {len(batches)} updates: {diff:.2e}")
    ratio = statistics.fmean(wall["full"]) / statistics.fmean(wall["forward-only"])
    print(f"full/forward-only: {ratio:.2f}")


if __name__ == "__main__":
    main()
