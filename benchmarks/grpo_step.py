"""One full GRPO step (generation + update), Sentinel against trl, on the quickstart's tiny policy.

Both sides get the same model (the embedded Llama, hidden 192, 4 layers, random init, so every
completion runs to the length cap), the same 16 single-turn arith prompts per step (rendered by
`sentinel.tasks.load_family("arith")` through the chat template, no tools), 8 samples per prompt,
at most 48 new tokens at temperature 0.7 (no top-k/top-p), the same reward function, token-mean
loss ("dapo" in trl), one optimizer step per batch and one forward/backward micro-batch of 128.

- Sentinel: `HFBackend.sample` (the loop's rollout backend: the static-cache engine) +
  `GRPOTrainer.step` (shared-prefix update). Same prompts, samples, token limits and trained
  tokens as trl.
- trl: a real `trl.GRPOTrainer.train()` (generation inside trl with transformers' `generate`);
  a callback times each of its steps from `on_step_begin` to `on_step_end` (generation, reward,
  loss, backward, optimizer step) and runs one Sentinel step right after, so the two alternate
  in one process and see the same machine load.

Time: wall-clock seconds per step (the speedup is computed from these) and process CPU seconds
per step beside them (steadier on a shared machine). torch runs with `--threads` intra-op threads
(default 1: on an oversubscribed 2-core machine two OpenMP threads spin at their barriers and a
step takes several times longer, for both sides alike).

Memory: two figures per side. "peak RSS" is the high-water mark (`VmHWM` in /proc/self/status,
Linux; `ru_maxrss` would carry the parent's peak across exec) of a separate process that runs only
that side for two steps (clean, but includes the imported libraries; torch CPU tensors are not
seen by tracemalloc). "step +RSS" is the peak RSS
increase during a step of the alternating run over the RSS at its start (a psutil thread samples
every 5 ms); in one process the allocator reuses what the other side freed, so read it as "new
memory this step needed", not as a footprint.

Then Sentinel's own two trainer backends on equal work (`trainer.backend: trl` against the native
trainer, issue #19): `trainers.trl_backend.TRLTrainer.train_round` (trl's `GRPOTrainer` with
Sentinel's rollouts as its `rollout_func`: the same `HFBackend` sampling of the same 16 tasks x 8,
the reward as the `outcome` term) against `SentinelStep`, alternating: each trl-backend step is
timed from the start of its sampling to the start of the next batch's (its update and trl's
per-step overhead included), and one native step runs in between, untimed for trl.

Run: `.venv/bin/python benchmarks/grpo_step.py [--steps 3] [--warmup 1] [--threads 1]`. Its lines
`speedup: N.NN` (trl's seconds per step / Sentinel's) and `trl-backend/native: N.NN` (the trl
backend's seconds per step / the native trainer's). Not a test: it prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

PROMPTS = 16
GROUP = 8
MAX_NEW = 48
TEMPERATURE = 0.7
LR = 3e-5


class PeakRSS:
    """Context manager: the peak RSS increase (bytes) while it is open, sampled every 5 ms."""

    def __enter__(self) -> PeakRSS:
        self.proc = psutil.Process()
        self.start = self.proc.memory_info().rss
        self.peak = self.start
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self) -> None:
        while not self.stop.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def increase(self) -> int:
        return self.peak - self.start


def digit_share(text: str) -> float:
    """The benchmark's reward: the share of digits in the completion (varies between samples)."""
    return sum(c.isdigit() for c in text) / max(len(text), 1)


def arith_prompts(n: int, seed: int) -> list[list[dict[str, str]]]:
    from sentinel.tasks import load_family

    family = load_family(
        "arith", {"min_operands": 2, "max_operands": 4, "max_value": 20, "instruction": ""}
    )
    rng = random.Random(seed)
    return [family.render(family.sample_spec(rng)) for _ in range(n)]


class SentinelStep:
    """One Sentinel GRPO step: sample the group with `HFBackend`, score, `GRPOTrainer.step`."""

    def __init__(self, model_dir: Path, prompts: list[list[dict[str, str]]]) -> None:
        from sentinel.env.chat import ChatFormat
        from sentinel.policy import load_policy
        from sentinel.rollout.hf import HFBackend
        from trainers import GRPOConfig, GRPOTrainer

        self.model, self.tokenizer = load_policy(model_dir)
        self.backend = HFBackend(self.model, self.tokenizer, batch_size=PROMPTS * GROUP)
        chat = ChatFormat(self.tokenizer)
        self.contexts = [chat.prompt_ids(p, None) for p in prompts]
        cfg = GRPOConfig(
            lr=LR,
            temperature=TEMPERATURE,
            loss_agg="token-mean",
            micro_batch_size=PROMPTS * GROUP,
            max_completion_tokens=MAX_NEW,
        )
        self.trainer = GRPOTrainer(self.model, cfg, self.tokenizer.pad_token_id)

    def __call__(self) -> int:
        """Run one step; return the number of completion tokens generated."""
        from sentinel.types import Trajectory
        from trainers import group_advantages

        contexts = [c for c in self.contexts for _ in range(GROUP)]
        outs = self.backend.sample(
            contexts, [MAX_NEW] * len(contexts), temperature=TEMPERATURE, greedy=False
        )
        trajs, rewards = [], []
        for i, (ctx, (ids, logprobs)) in enumerate(zip(contexts, outs, strict=True)):
            trajs.append(
                Trajectory(
                    task_id=str(i // GROUP),
                    messages=[],
                    token_ids=ctx + ids,
                    loss_mask=[0] * len(ctx) + [1] * len(ids),
                    logprobs=[0.0] * len(ctx) + logprobs,
                    steps=[],
                    finish_reason="stop",
                    group_id=str(i // GROUP),
                )
            )
            rewards.append(digit_share(self.tokenizer.decode(ids)))
        self.trainer.step(trajs, group_advantages(rewards, [t.group_id for t in trajs]))
        return sum(len(ids) for ids, _ in outs)


def build_trl(model_dir: Path, prompts: list[list[dict[str, str]]], steps: int) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def reward(completions: list[Any], **_: Any) -> list[float]:
        return [digit_share(c[0]["content"]) for c in completions]

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"),
        report_to="none",
        use_cpu=True,
        bf16=False,
        learning_rate=LR,
        lr_scheduler_type="constant",
        per_device_train_batch_size=PROMPTS * GROUP,
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        max_completion_length=MAX_NEW,
        temperature=TEMPERATURE,
        loss_type="dapo",
        beta=0.0,
        max_steps=steps,
        logging_steps=10_000,
        save_strategy="no",
        disable_tqdm=True,
    )
    # 16 distinct prompts and 16 per step: every step sees exactly Sentinel's prompt set.
    dataset = Dataset.from_list([{"prompt": p} for p in prompts])
    from sentinel.policy import load_policy

    model, tokenizer = load_policy(model_dir)
    return GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )


def alternate(trl_trainer: Any, sentinel_step: Callable[[], int], total: int) -> dict[str, list]:
    """Train trl for `total` steps; after each trl step run one Sentinel step. Timings per side."""
    from transformers import TrainerCallback

    rows: dict[str, list] = {"trl": [], "sentinel": []}

    class Alternate(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.mem = PeakRSS().__enter__()
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            seconds, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
            self.mem.__exit__()
            # trl records the mean completion length of each generation batch.
            mean_len = trl_trainer._metrics["train"]["completions/mean_length"][-1]
            rows["trl"].append((seconds, cpu, PROMPTS * GROUP * mean_len, self.mem.increase))
            with PeakRSS() as mem:
                t0, c0 = time.perf_counter(), time.process_time()
                tokens = sentinel_step()
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            rows["sentinel"].append((seconds, cpu, tokens, mem.increase))

    trl_trainer.add_callback(Alternate())
    trl_trainer.train()
    assert len(rows["trl"]) == total
    return rows


def trl_backend_rows(model_dir: Path, seed: int, total: int,
                     native: Callable[[], int]) -> dict[str, list[float]]:
    """`total` steps of the trl backend (`TRLTrainer.train_round`) on the benchmark's 16 tasks,
    one native step run between each two; seconds per step of each."""
    from sentinel.env.chat import ChatFormat
    from sentinel.policy import load_policy
    from sentinel.rollout.hf import HFBackend
    from sentinel.tasks import load_family
    from sentinel.types import Trajectory
    from trainers import GRPOConfig
    from trainers.trl_backend import RoundIO, TRLTrainer

    family = load_family(
        "arith", {"min_operands": 2, "max_operands": 4, "max_value": 20, "instruction": ""}
    )
    rng = random.Random(seed)
    tasks = [family.make_task(family.sample_spec(rng)) for _ in range(PROMPTS)]
    model, tokenizer = load_policy(model_dir)
    backend = HFBackend(model, tokenizer, batch_size=PROMPTS * GROUP)
    chat = ChatFormat(tokenizer)
    contexts = {t.task_id: chat.prompt_ids(family.render(t.spec), None) for t in tasks}
    cfg = GRPOConfig(lr=LR, temperature=TEMPERATURE, loss_agg="token-mean",
                     micro_batch_size=PROMPTS * GROUP, max_completion_tokens=MAX_NEW)
    trainer = TRLTrainer(model, tokenizer, cfg, max_completion_tokens=MAX_NEW,
                         reward_weights={"outcome": 1.0, "format": 0.0, "process": 0.0},
                         seed=0, output_dir=tempfile.mkdtemp(prefix="trl-backend-bench-"),
                         reference_dir=None)
    rows: dict[str, list[float]] = {"trl-backend": [], "native": []}
    started: list[float] = []

    def rollout(batch: list[Any], group: int, prefix: str) -> list[Trajectory]:
        if started:
            rows["trl-backend"].append(time.perf_counter() - started[-1])
        t0 = time.perf_counter()
        native()
        rows["native"].append(time.perf_counter() - t0)
        started.append(time.perf_counter())
        ctxs = [contexts[t.task_id] for t in batch for _ in range(group)]
        outs = backend.sample(ctxs, [MAX_NEW] * len(ctxs), temperature=TEMPERATURE,
                              greedy=False)
        trajs = []
        for i, (ctx, (ids, logprobs)) in enumerate(zip(ctxs, outs, strict=True)):
            task = batch[i // group]
            score = digit_share(tokenizer.decode(ids))
            trajs.append(Trajectory(
                task_id=task.task_id, messages=[], token_ids=ctx + ids,
                loss_mask=[0] * len(ctx) + [1] * len(ids), logprobs=[0.0] * len(ctx) + logprobs,
                steps=[], finish_reason="stop", group_id=f"{prefix}-{task.task_id}",
                sample_idx=i % group, reward=score,
                reward_terms={"outcome": score, "format": 0.0, "process": 0.0}))
        return trajs

    # One step more than measured: the last one's end is not a next batch's start.
    trainer.train_round(RoundIO(round=1, steps=total + 1, tasks_per_step=PROMPTS,
                                group_size=GROUP, sample=lambda n: tasks[:n], rollout=rollout,
                                observe=lambda b: ({t.traj_id for t in b}, {}),
                                log=lambda m: None))
    return {side: times[:total] for side, times in rows.items()}


def peak_rss_alone(side: str, model_dir: Path) -> float:
    """Peak RSS (MiB) of a fresh process that runs two steps of `side` only."""
    out = subprocess.run(
        [sys.executable, __file__, "--memory-of", side, "--model-dir", str(model_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def run_alone(side: str, model_dir: Path) -> None:
    """Two steps of one side, then print this process's peak RSS (VmHWM) in MiB."""
    prompts = arith_prompts(PROMPTS, seed=0)
    if side == "sentinel":
        step = SentinelStep(model_dir, prompts)
        step()
        step()
    else:
        build_trl(model_dir, prompts, 2).train()
    status = Path("/proc/self/status").read_text()
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    print(int(kib) / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per side")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured first steps per side")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--memory-of", choices=["sentinel", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_of:
        run_alone(args.memory_of, args.model_dir)
        return

    from sentinel.policy import TinyPolicyConfig, build_tiny_policy

    model_dir = build_tiny_policy(
        Path(tempfile.mkdtemp(prefix="bench-policy-")), TinyPolicyConfig()
    )
    prompts = arith_prompts(PROMPTS, seed=0)
    total = args.warmup + args.steps
    torch.manual_seed(0)
    rows = alternate(build_trl(model_dir, prompts, total), SentinelStep(model_dir, prompts), total)
    print(
        f"torch threads {torch.get_num_threads()}, {PROMPTS} prompts x {GROUP} samples, "
        f"<= {MAX_NEW} new tokens, {args.steps} measured steps after {args.warmup} warm-up"
    )
    per_step = {}
    for side, measured in rows.items():
        measured = measured[args.warmup :]
        secs = [s for s, _, _, _ in measured]
        per_step[side] = statistics.mean(secs)
        cpu = statistics.mean(c for _, c, _, _ in measured)
        tok_s = sum(t for _, _, t, _ in measured) / sum(secs)
        grew = max(m for _, _, _, m in measured) / 2**20
        alone = peak_rss_alone(side, model_dir)
        print(
            f"{side:9s} {per_step[side]:6.2f} s/step (min {min(secs):.2f}, cpu {cpu:.2f} s)  "
            f"{tok_s:6.0f} completion tokens/s  peak RSS {alone:6.0f} MiB  "
            f"step +RSS {grew:5.0f} MiB"
        )
    print(f"speedup: {per_step['trl'] / per_step['sentinel']:.2f}")

    torch.manual_seed(0)
    native = SentinelStep(model_dir, prompts)
    backends = trl_backend_rows(model_dir, seed=0, total=total, native=native)
    means = {side: statistics.mean(t[args.warmup :]) for side, t in backends.items()}
    for side, times in backends.items():
        print(f"{side:11s} {means[side]:6.2f} s/step (min {min(times[args.warmup:]):.2f})  "
              "Sentinel loop's trainer backends, same sampler and tasks")
    print(f"trl-backend/native: {means['trl-backend'] / means['native']:.2f}")


if __name__ == "__main__":
    main()
