"""`hf` rollout backend: batched sampling with transformers models, through the static-cache
engine (`sentinel.rollout.static`) where the architecture allows, else through `generate`.

Contexts are left-padded into micro-batches (sorted by length to waste less padding), sampled with
plain temperature sampling (no top-k/top-p, so the sampling distribution is exactly
softmax(logits / T) and the stored log-probs are the ones GRPO's importance ratio needs), cut at the
first eos and at each context's budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

ENGINES = ("auto", "static", "generate")


class HFBackend:
    """`engine`: `static` samples with `StaticEngine` (preallocated cache, shared prefill, ended
    rows dropped; Llama-family models only), `generate` with transformers' `generate`, `auto` (the
    default) with the first when the model supports it."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int = 128,
                 engine: str = "auto") -> None:
        from sentinel.rollout.static import StaticEngine, _unsupported

        if engine not in ENGINES:
            raise ValueError(f"rollout engine {engine!r}: expected one of {ENGINES} "
                             "(static, generate or auto)")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.engine = None
        if engine != "generate":
            self.engine = StaticEngine.build(model, self.eos_id, self.pad_id)
            if self.engine is None and engine == "static":
                raise ValueError(f"rollout engine 'static' cannot run this model: "
                                 f"{_unsupported(model)}; use 'generate' or 'auto'")

    def sample(self, contexts: Sequence[list[int]], budgets: Sequence[int], *, temperature: float,
               greedy: bool) -> list[tuple[list[int], list[float]]]:
        results: list[tuple[list[int], list[float]]] = [([], []) for _ in contexts]
        order = sorted(range(len(contexts)), key=lambda i: len(contexts[i]))
        for start in range(0, len(order), self.batch_size):
            chunk = [i for i in order[start:start + self.batch_size] if budgets[i] > 0]
            if chunk:
                outs = self._sample_chunk([contexts[i] for i in chunk], [budgets[i] for i in chunk],
                                          temperature, greedy)
                for i, out in zip(chunk, outs, strict=True):
                    results[i] = out
        return results

    def _sample_chunk(self, contexts: list[list[int]], budgets: list[int], temperature: float,
                      greedy: bool) -> list[tuple[list[int], list[float]]]:
        if self.engine is not None:
            return self.engine.sample(contexts, budgets, temperature=temperature, greedy=greedy)
        import torch

        device = next(self.model.parameters()).device
        width = max(len(c) for c in contexts)
        input_ids = torch.full((len(contexts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(contexts), width), dtype=torch.long)
        for row, ctx in enumerate(contexts):
            input_ids[row, width - len(ctx):] = torch.tensor(ctx, dtype=torch.long)
            attention[row, width - len(ctx):] = 1
        sampling: dict[str, Any] = (
            {"do_sample": False} if greedy
            else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        )
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention.to(device),
                max_new_tokens=max(budgets), eos_token_id=self.eos_id, pad_token_id=self.pad_id,
                return_dict_in_generate=True, output_logits=True, **sampling,
            )
        new_tokens = out.sequences[:, width:].cpu()
        logits = torch.stack(out.logits, dim=1).float().cpu()  # [B, new, V], unprocessed
        scale = 1.0 if greedy else temperature
        logprobs = torch.log_softmax(logits / scale, dim=-1)
        chosen = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        results = []
        for row, budget in enumerate(budgets):
            ids = new_tokens[row].tolist()[:budget]
            if self.eos_id in ids:
                ids = ids[: ids.index(self.eos_id) + 1]
            results.append((ids, chosen[row, : len(ids)].tolist()))
        return results
