"""How large a GRPO step can the cold-started policy take? Loss and KL after one step, side by side.

One batch of the quickstart's training distribution (16 arith tasks x 8 samples, temperature 1.0)
is rolled out with a trained policy; one GRPO backward pass gives the gradient `g`. The model is
then moved by one step along three directions of the same L2 size and the batch's GRPO loss
(clipped surrogate + 0.04 k3, the quickstart's) and its mean k3 KL to the unmoved policy are
recomputed:

- `adam`: Adam's first step, `-lr * sign(g)` (bias-corrected Adam with eps << |g| moves every
  coordinate with a gradient by exactly lr on its first step; `tests/test_trainers.py` checks it);
- `sgd`: the normalised gradient, scaled to the same L2 norm as the Adam step;
- `random`: a random sign vector of the same size (a control: how sensitive is the policy to a
  step that does not follow the gradient).

Then the Adam step at `--group-lr` is applied to one parameter group at a time (embeddings,
q/k projections, v/o projections, MLPs, norms) and to all of them.

Run: `.venv/bin/python benchmarks/step_size.py --policy runs/quickstart/policy` (after
`make demo`; any HF model directory of the embedded policy works). Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True, help="HF model directory of a trained policy")
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lrs", default="3e-6,1e-5,3e-5,1e-4",
                        help="Adam first-step sizes (per coordinate) to try")
    parser.add_argument("--group-lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--run-dir", default=None,
                        help="where the throw-away store goes (default: a temporary directory)")
    args = parser.parse_args()

    from sentinel.config import load_config
    from sentinel.env.chat import ChatFormat
    from sentinel.env.parser import PARSERS
    from sentinel.loop import Loop
    from sentinel.rollout import Rollouts, build_backend
    from trainers.grpo import group_advantages

    cfg = load_config(args.config, [f"policy.model={args.policy}", "sft.enabled=false",
                                    "generators=[]", "grpo.beta=0.04", "rollout.temperature=1.0"])
    loop = Loop(cfg, args.run_dir or tempfile.mkdtemp(prefix="sentinel-step-size-"))
    model, tokenizer = loop._load_policy()
    trainer = loop._new_trainer(model, tokenizer)
    rollouts = Rollouts(
        build_backend(cfg.rollout.backend, model, tokenizer, batch_size=cfg.rollout.batch_size),
        ChatFormat(tokenizer), PARSERS[cfg.env.parser](), loop.families, cfg.env, cfg.reward,
        temperature=cfg.rollout.temperature, rng=loop.rng)
    rng = random.Random(args.seed)
    tasks = [loop.mixture.sample(rng) for _ in range(args.tasks)]
    trajs = rollouts.run(tasks, args.group_size, split="train", round=1, group_prefix="s")
    adv = group_advantages([t.reward for t in trajs], [t.group_id for t in trajs])
    base = trainer.accumulate_gradients(trajs, adv, {})
    named = list(trainer.model.named_parameters())
    grads = {n: p.grad.detach().clone() for n, p in named}
    orig = {n: p.detach().clone() for n, p in named}
    n_params = sum(p.numel() for p in orig.values())
    gnorm = math.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))
    gen = torch.Generator().manual_seed(0)
    noise = {n: torch.sign(torch.randn(p.shape, generator=gen)) for n, p in orig.items()}
    success = sum(t.success for t in trajs) / len(trajs)
    print(f"policy {args.policy}: {len(trajs)} rollouts, success {success:.3f}, "
          f"{n_params:,} parameters, |g| {gnorm:.3f}, loss before the step {base['loss']:.5f}")

    def moved(direction, keys=("",)) -> dict[str, float]:
        with torch.no_grad():
            for n, p in named:
                p.copy_(orig[n] - direction(n) if any(k in n for k in keys) else orig[n])
        return trainer.accumulate_gradients(trajs, adv, {})

    print(f"{'step (Adam lr)':>14} {'L2':>7} | {'adam loss':>10} {'adam KL':>9} | "
          f"{'sgd loss':>10} {'sgd KL':>9} | {'random KL':>9}")
    for lr in (float(x) for x in args.lrs.split(",")):
        l2 = lr * math.sqrt(n_params)
        a = moved(lambda n, lr=lr: lr * torch.sign(grads[n]))
        s = moved(lambda n, l2=l2: grads[n] * (l2 / gnorm))
        r = moved(lambda n, lr=lr: lr * noise[n])
        print(f"{lr:>14.0e} {l2:>7.3f} | {a['loss']:>10.5f} {a['kl']:>9.4f} | "
              f"{s['loss']:>10.5f} {s['kl']:>9.4f} | {r['kl']:>9.4f}")
    groups = {"embeddings": ("embed",), "q/k proj": ("q_proj", "k_proj"),
              "v/o proj": ("v_proj", "o_proj"), "mlp": ("mlp",), "norms": ("norm",),
              "all": ("",)}
    print(f"Adam first step at lr {args.group_lr:g}, one parameter group at a time:")
    for name, keys in groups.items():
        out = moved(lambda n: args.group_lr * torch.sign(grads[n]), keys)
        print(f"  {name:>10}: loss {out['loss']:>9.5f}  KL {out['kl']:.4f}")


if __name__ == "__main__":
    main()
