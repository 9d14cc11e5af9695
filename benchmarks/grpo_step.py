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

`--policy smollm2-135m` (or any policy source `load_policy` takes) measures something else: the
native update of a real 135M model on CPU in float32 against bf16 autocast (`grpo.bf16: true`;
weights, gradients and AdamW stay float32), in one process, on the same batch, alternating which
goes first. No trl, no sampling. The recipe is `--config` (default `configs/demo_smol.yaml`, the
demo this model runs in: its `grpo` section, `rollout.temperature`, families, env and `sft`):

- The batch: `--tasks` tasks (default `batch.tasks_per_step`, 8) drawn from the config's families
  as the loop draws them, each task's reference trajectory (`TaskFamily.reference_trajectory`:
  the multi-turn arith tool-use episode replayed through the real environment and rendered with
  the model's `ChatFormat`, ~300 prompt tokens with the tools block, 40-110 trained tokens),
  `--samples` times (default `batch.group_size`, 8) per group; old log-probs are the model's own
  (float32, at the config's temperature), so the first pass is on-policy (up to bf16's rounding).
  The rows of a group are identical tokens: the cost of a real group of the same lengths, not its
  variety. Group-centred advantages would cancel exactly on identical rows (a zero gradient, and
  with `adam_v_warm_start` a zero second moment), so the advantages are given, not computed from
  rewards: +1.0 and -0.5 alternating, every row nonzero (the full backward, as the demo's
  `drop_zero_variance` leaves only groups with signal) and a net push towards the reference.
- GRPO: `GRPOTrainer.step` on that batch, one trainer whose config is switched between
  `bf16: false` and `bf16: true` before each update (one model, one AdamW; the weights move by
  `lr` per update, which does not change the cost). The demo's `kl_guard` follows each update
  with a no-grad forward of the batch; that forward runs here too, but the guard's threshold is
  raised to 1e9 so that no step is undone or retaken: a retake costs a forward and an optimizer
  step more, and an undone step empties AdamW, so the next update runs `adam_v_warm_start`'s extra
  forward and backward again; how often that happens depends on the batch, not on the precision.
  The KL the guard measured is printed per update.
- SFT (unless `--no-sft`): one step of the cold start (`trainers.sft.batch_loss`, packed to
  `sft.max_seq_len`, backward, grad clip, AdamW) on the tasks' distinct reference trajectories
  (8, the demo's `sft.batch_size`), `sft.bf16` false against true.

It prints a line per update and per SFT step, then the CPU (model name, the flags that matter for
bf16 matmuls: avx512_bf16, amx_tile, amx_bf16, and torch's CPU capability), `torch threads`,
seconds per update of each precision and `grpo float32/bf16: N.NN` (likewise `sft ...`).
Run: `.venv/bin/python benchmarks/grpo_step.py --policy smollm2-135m [--steps 1] [--warmup 0]
[--threads 1]`: per precision one warm-up update on the batch's first group (first-call costs,
AdamW's state, the warm start's extra pass), `--warmup` full ones, then `--steps` measured ones
(SFT alike, its warm-up on one example). The defaults keep it to minutes (an 8 x 8 update is
~9k forward tokens of a 135M model); `--steps 3` for a steadier figure. Smoke: `--tasks 2
--samples 2`. The smoke's peak RSS was ~5 GiB (weights, gradients, AdamW); the full batch adds
its micro-batches' activations (16 rows, 49k-vocab logits).
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


def cpu_summary() -> str:
    """The CPU's model name and the flags that decide bf16 matmul speed, from /proc/cpuinfo."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"cpu unknown (no /proc/cpuinfo), torch capability {cpu_capability()}"
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), []))
    marks = " ".join(f"{f}={'yes' if f in flags else 'no'}"
                     for f in ("avx512f", "avx512_bf16", "amx_tile", "amx_bf16"))
    return f"cpu {name}; {marks}; torch capability {cpu_capability()}"


def cpu_capability() -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except AttributeError:  # older torch
        return "?"


def reference_batch(cfg: Any, tokenizer: Any, n_tasks: int, seed: int) -> list[Any]:
    """The reference trajectories of `n_tasks` tasks drawn from `cfg.families` (as the loop draws
    them), rendered with the model's ChatFormat and the config's parser and env."""
    from sentinel.env.chat import ChatFormat
    from sentinel.env.parser import parser_class
    from sentinel.tasks.mixture import TaskMixture

    mixture = TaskMixture.from_entries(cfg.families)
    chat, parser = ChatFormat(tokenizer), parser_class(cfg.env.parser)()
    rng = random.Random(seed)
    refs = []
    for _ in range(n_tasks):
        task = mixture.sample(rng)
        refs.append(mixture.families[task.family].reference_trajectory(task, chat, parser,
                                                                       cfg.env))
    return refs


def grpo_rows(model: Any, refs: list[Any], samples: int,
              temperature: float) -> tuple[list[Any], list[float]]:
    """`samples` copies of each reference as one group, old log-probs the model's own (float32,
    no grad) on the trained tokens, and their advantages: +1.0, -0.5, +1.0, ... (nonzero, and not
    summing to zero over a group, whose rows are identical)."""
    import dataclasses

    from trainers.common import token_logprobs

    rows = []
    with torch.no_grad():
        for g, ref in enumerate(refs):
            ids = torch.tensor([ref.token_ids])
            lp = token_logprobs(model, ids, torch.ones_like(ids), temperature)[0].tolist()
            old = [x if m else 0.0 for x, m in zip(lp, ref.loss_mask, strict=True)]
            rows += [dataclasses.replace(ref, logprobs=list(old), group_id=f"g{g}",
                                         sample_idx=k, traj_id=f"g{g}-{k}")
                     for k in range(samples)]
    return rows, [1.0 if row.sample_idx % 2 == 0 else -0.5 for row in rows]


def timed(fn: Callable[..., Any], *fn_args: Any) -> tuple[float, float, Any]:
    """(wall seconds, process CPU seconds, result) of `fn(*fn_args)`."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*fn_args)
    return time.perf_counter() - t0, time.process_time() - c0, out


def summarise(kind: str, rows: dict[str, list[tuple[float, float]]], unit: str) -> None:
    means = {}
    for name, measured in rows.items():
        secs = [s for s, _ in measured]
        means[name] = statistics.mean(secs)
        cpu = statistics.mean(c for _, c in measured)
        print(f"{kind:4s} {name:8s} {means[name]:7.2f} s/{unit} (min {min(secs):.2f}, "
              f"cpu {cpu:.2f} s, {len(secs)} measured)")
    print(f"{kind} float32/bf16: {means['float32'] / means['bf16']:.2f}")


def alternate_precisions(kind: str, names: list[str], run: Callable[[str, int], str],
                         full: int, small: tuple[int, str], warmup: int,
                         steps: int) -> dict[str, list[tuple[float, float]]]:
    """Time `run(name, n)` for each precision `name`: first one call on the first `small[0]` rows
    (a cheap warm-up: first-call costs, AdamW's state, `adam_v_warm_start`'s pass), then `warmup`
    unmeasured and `steps` measured calls on all `full` rows, alternating which name goes first.
    A line per call; returns the measured (wall, CPU) seconds per name."""
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    plan = [(small[0], f"warm-up, {small[1]}" if small[0] < full else "warm-up")]
    plan += [(full, "warm-up")] * warmup + [(full, "measured")] * steps
    for i, (n, label) in enumerate(plan):
        order = names if i % 2 == 0 else list(reversed(names))
        for name in order:
            seconds, cpu, info = timed(run, name, n)
            if label == "measured":
                measured[name].append((seconds, cpu))
            print(f"{kind} {i} {name:8s} {seconds:7.2f} s (cpu {cpu:6.2f} s) {label}: {info}",
                  flush=True)
    return measured


def precision_bench(args: argparse.Namespace) -> None:
    """`--policy`: the native GRPO update (and an SFT step) in float32 against bf16 autocast."""
    import gc

    from sentinel.config import load_config
    from sentinel.policy import load_policy
    from trainers import GRPOTrainer
    from trainers.sft import batch_loss

    cfg = load_config(args.config)
    tasks = args.tasks or cfg.batch.tasks_per_step
    samples = args.samples or cfg.batch.group_size
    steps = 1 if args.steps is None else args.steps
    warmup = 0 if args.warmup is None else args.warmup
    print(cpu_summary())
    print(f"torch threads {torch.get_num_threads()}, torch {torch.__version__}", flush=True)
    t0 = time.perf_counter()
    model, tokenizer = load_policy(args.policy)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"policy {args.policy}: {n_params / 1e6:.1f}M parameters, vocab "
          f"{model.config.vocab_size}, {next(model.parameters()).dtype} weights, loaded in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    refs = reference_batch(cfg, tokenizer, tasks, seed=0)
    grpo_cfg = cfg.grpo_trainer_config()
    guard = grpo_cfg.kl_guard
    if guard is not None:  # its forward runs, its threshold never trips (see the docstring)
        grpo_cfg = grpo_cfg.model_copy(update={"kl_guard": 1e9})
    rows, advantages = grpo_rows(model, refs, samples, grpo_cfg.temperature)
    leads = [r.loss_mask.index(1) for r in refs]
    print(f"batch: {tasks} tasks x {samples} samples of reference trajectories ({args.config}),"
          f" {min(len(r.token_ids) for r in refs)}-{max(len(r.token_ids) for r in refs)} tokens"
          f" (prompts {min(leads)}-{max(leads)}, shared per group), "
          f"{sum(r.n_policy_tokens for r in rows)} trained tokens in all; micro-batch "
          f"{grpo_cfg.micro_batch_size}, kl_guard "
          f"{'none' if guard is None else f'{guard} (its forward runs; threshold set to 1e9)'}, "
          f"adam_v_warm_start {grpo_cfg.adam_v_warm_start} (first update only); "
          "per precision a warm-up update of "
          f"one group, then {warmup} warm-up + {steps} measured of the batch", flush=True)

    precisions = {"float32": False, "bf16": True}
    trainer = GRPOTrainer(model, grpo_cfg.model_copy(update={"bf16": False}),
                          tokenizer.pad_token_id)
    configs = {name: grpo_cfg.model_copy(update={"bf16": on}) for name, on in precisions.items()}

    def grpo_update(name: str, n_rows: int) -> str:
        trainer.config = configs[name]
        m = trainer.step(rows[:n_rows], advantages[:n_rows])
        kl = "" if guard is None else f", guard kl {m['guard/kl']:.4f}"
        return f"loss {m['loss']:.4f}, grad norm {m['grad_norm']:.3f}{kl}"

    grpo = alternate_precisions("grpo update", list(precisions), grpo_update, len(rows),
                                (samples, "1 group"), warmup, steps)
    trainer.optimizer.state.clear()  # its AdamW moments (2 x the weights) before SFT's own
    gc.collect()

    sft: dict[str, list[tuple[float, float]]] = {}
    if not args.no_sft:
        sft_cfg = cfg.sft
        examples = [(r.token_ids, r.loss_mask) for r in refs]
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=sft_cfg.lr, weight_decay=sft_cfg.weight_decay)
        device = next(model.parameters()).device
        print(f"sft: {len(examples)} examples (the batch's references; pack {sft_cfg.pack}, "
              f"max_seq_len {sft_cfg.max_seq_len}, lr {sft_cfg.lr}), a step = batch_loss + "
              "backward + grad clip + AdamW", flush=True)
        model.train()

        def sft_step(name: str, n_examples: int) -> str:
            dtype = sft_cfg.model_copy(update={"bf16": precisions[name]}).autocast_dtype(device)
            loss, _ = batch_loss(model, examples[:n_examples], tokenizer.pad_token_id,
                                 sft_cfg.pack, sft_cfg.max_seq_len, dtype)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, sft_cfg.max_grad_norm)
            optimizer.step()
            return f"loss {float(loss.item()):.4f}"

        sft = alternate_precisions("sft step", list(precisions), sft_step, len(examples),
                                   (1, "1 example"), warmup, steps)
        model.eval()

    status = Path("/proc/self/status").read_text()
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    print(f"{cpu_summary()}; torch threads {torch.get_num_threads()}; peak RSS "
          f"{int(kib) / 1024:.0f} MiB")
    if steps:
        summarise("grpo", grpo, "update")
        if sft:
            summarise("sft", sft, "step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per side (default 3; with --policy 1)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="unmeasured first steps per side (default 1; with --policy 0, "
                        "after a warm-up on one group that always runs)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--policy", default=None,
                        help="e.g. smollm2-135m: time this policy's native GRPO update (and SFT "
                        "step) in float32 against bf16 autocast instead of Sentinel against trl")
    parser.add_argument("--config", default="configs/demo_smol.yaml",
                        help="with --policy: the recipe (grpo, sft, families, env, batch)")
    parser.add_argument("--tasks", type=int, default=None,
                        help="with --policy: groups in the batch (default batch.tasks_per_step)")
    parser.add_argument("--samples", type=int, default=None,
                        help="with --policy: rows per group (default batch.group_size)")
    parser.add_argument("--no-sft", action="store_true", help="with --policy: skip the SFT step")
    parser.add_argument("--memory-of", choices=["sentinel", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_of:
        run_alone(args.memory_of, args.model_dir)
        return
    if args.policy is not None:
        precision_bench(args)
        return
    args.steps = 3 if args.steps is None else args.steps
    args.warmup = 1 if args.warmup is None else args.warmup

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
