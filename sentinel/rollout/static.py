"""A static-KV-cache sampler for Llama-family decoders (Llama, Mistral, Qwen2, Qwen3).

`generate` spends most of a CPU rollout outside the arithmetic that matters: its dynamic cache
concatenates every layer's keys and values at every step (quadratic copying), it prefills the
same prompt once per sample of a group, and it keeps computing rows that already ended. This
engine runs the same weights (read from the transformers module, so it samples from exactly the
model being trained) through a loop that

- preallocates one key/value buffer per layer for the whole chunk and writes each step in place;
- prefills each distinct context once and copies its cache rows to the samples that share it
  (the G samples of a task in the first turn), and the prefix every context of the chunk shares
  (a family's system prompt and tools block, hundreds of tokens for a real tokenizer) once for
  all of them;
- drops finished rows from the batch (and their cache rows) as they end;
- fuses the q/k/v and gate/up projections into one matmul each.

The forward is the transformers one, step for step (RMSNorm in float32, rotary embeddings from the
model's own `rotary_emb`, so any rope scaling carries over; SDPA with the default scale; GQA); a
test checks that greedy outputs equal `generate`'s and that the returned log-probs equal a full
forward's to 1e-4. Models outside this family, or with features it does not implement (sliding
windows, attention biases other than q/k/v, soft-capping), return `None` from `StaticEngine.build`
and the caller falls back to `generate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class _Layer:
    w_in: Any
    eps_in: float
    qkv_w: Any
    qkv_b: Any
    q_norm: Any  # Qwen3: RMSNorm over head_dim on q and k (module or None)
    k_norm: Any
    o_w: Any
    o_b: Any
    w_post: Any
    eps_post: float
    gu_w: Any
    down_w: Any
    act: Any


def _unsupported(model: Any) -> str | None:
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED:
        return f"model_type {getattr(cfg, 'model_type', None)!r} is not one of {SUPPORTED}"
    if getattr(cfg, "use_sliding_window", False) or (
            cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None)):
        return "sliding-window attention"
    if getattr(cfg, "mlp_bias", False):
        return "MLP biases"
    if any(getattr(cfg, k, None) for k in ("attn_logit_softcapping", "final_logit_softcapping")):
        return "logit soft-capping"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "not a *ForCausalLM with .model.layers and .model.rotary_emb"
    return None


class StaticEngine:
    """Samples continuations of token contexts with a preallocated cache. Build it with
    `StaticEngine.build(model)`; weights are re-read on every `sample` call, so it always samples
    from the current parameters of a model being trained."""

    def __init__(self, model: Any, eos_id: int, pad_id: int) -> None:
        self.model, self.eos_id, self.pad_id = model, eos_id, pad_id
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads

    @classmethod
    def build(cls, model: Any, eos_id: int, pad_id: int) -> StaticEngine | None:
        return None if _unsupported(model) else cls(model, eos_id, pad_id)

    # -- weights ---------------------------------------------------------------------------------
    def _layers(self) -> list[_Layer]:
        import torch

        layers = []
        for layer in self.model.model.layers:
            att, mlp = layer.self_attn, layer.mlp
            projs = (att.q_proj, att.k_proj, att.v_proj)
            biases = [p.bias for p in projs]
            qkv_b = None
            if any(b is not None for b in biases):
                qkv_b = torch.cat([
                    b if b is not None else p.weight.new_zeros(p.out_features)
                    for p, b in zip(projs, biases, strict=True)])
            layers.append(_Layer(
                w_in=layer.input_layernorm.weight, eps_in=_eps(layer.input_layernorm),
                qkv_w=torch.cat([p.weight for p in projs]), qkv_b=qkv_b,
                q_norm=getattr(att, "q_norm", None), k_norm=getattr(att, "k_norm", None),
                o_w=att.o_proj.weight, o_b=att.o_proj.bias,
                w_post=layer.post_attention_layernorm.weight,
                eps_post=_eps(layer.post_attention_layernorm),
                gu_w=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                down_w=mlp.down_proj.weight, act=mlp.act_fn,
            ))
        return layers

    # -- forward ---------------------------------------------------------------------------------
    def _forward(self, layers: list[_Layer], ids: Any, pos: Any, k_cache: list, v_cache: list,
                 start: int, mask: Any) -> Any:
        """Run `ids` [B, S] at positions `pos` [B, S]; write their keys/values into the caches at
        [start, start+S); `mask` [B, 1, S, start+S] (bool) says what each query may attend to.
        Returns the final hidden state of the last position, [B, hidden]."""
        import torch.nn.functional as F

        inner = self.model.model
        b, s = ids.shape
        h = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(h, pos)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        nq, nk, d = self.n_heads * self.head_dim, self.n_kv * self.head_dim, self.head_dim
        gqa = self.n_heads != self.n_kv
        end = start + s
        for i, L in enumerate(layers):
            x = _rms(h, L.w_in, L.eps_in)
            qkv = F.linear(x, L.qkv_w, L.qkv_b)
            q = qkv[..., :nq].view(b, s, self.n_heads, d).transpose(1, 2)
            k = qkv[..., nq:nq + nk].view(b, s, self.n_kv, d).transpose(1, 2)
            v = qkv[..., nq + nk:].view(b, s, self.n_kv, d).transpose(1, 2)
            if L.q_norm is not None:
                q, k = L.q_norm(q), L.k_norm(k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k_cache[i][:, :, start:end] = k
            v_cache[i][:, :, start:end] = v
            att = F.scaled_dot_product_attention(q, k_cache[i][:, :, :end], v_cache[i][:, :, :end],
                                                 attn_mask=mask, enable_gqa=gqa)
            h = h + F.linear(att.transpose(1, 2).reshape(b, s, nq), L.o_w, L.o_b)
            x = _rms(h, L.w_post, L.eps_post)
            gate, up = F.linear(x, L.gu_w).chunk(2, dim=-1)
            h = h + F.linear(L.act(gate) * up, L.down_w)
        return inner.norm(h[:, -1])

    def _logits(self, hidden: Any) -> Any:
        return self.model.lm_head(hidden).float()

    # -- sampling ----------------------------------------------------------------------------------
    def sample(self, contexts: Sequence[list[int]], budgets: Sequence[int], *, temperature: float,
               greedy: bool) -> list[tuple[list[int], list[float]]]:
        """Sample up to `budgets[i]` new tokens after each context (stopping at eos); returns each
        row's new ids and their log-probs under softmax(logits / T) (T = 1 when greedy)."""
        import torch

        with torch.no_grad():
            return self._sample(contexts, budgets, temperature, greedy)

    def _sample(self, contexts: Sequence[list[int]], budgets: Sequence[int], temperature: float,
                greedy: bool) -> list[tuple[list[int], list[float]]]:
        import torch

        p = next(self.model.parameters())
        device, dtype = p.device, p.dtype
        layers = self._layers()
        n = len(contexts)
        # Prefill every distinct context once; the prefix every context shares (a family's
        # system prompt and tools block) once for all of them.
        uniq: dict[tuple[int, ...], int] = {}
        row_of = [uniq.setdefault(tuple(c), len(uniq)) for c in contexts]
        distinct = list(uniq)
        u = len(distinct)
        lcp = _shared_prefix_len(distinct) if u > 1 else 0
        if lcp < MIN_SHARED_PREFIX:
            lcp = 0
        rests = [c[lcp:] for c in distinct]
        rest_w = max(len(r) for r in rests)
        width = lcp + rest_w
        total = width + max(budgets)
        ids = torch.full((u, rest_w), self.pad_id, dtype=torch.long)
        valid = torch.zeros((u, total), dtype=torch.bool)
        valid[:, :lcp] = True
        for r, rest in enumerate(rests):  # left-padded: every row's last token is in one column
            ids[r, rest_w - len(rest):] = torch.tensor(rest, dtype=torch.long)
            valid[r, width - len(rest):width] = True
        ids, valid = ids.to(device), valid.to(device)
        pos = (valid[:, :width].long().cumsum(-1) - 1).clamp(min=0)
        shape = (u, self.n_kv, total, self.head_dim)
        k_cache = [torch.empty(shape, dtype=dtype, device=device) for _ in layers]
        v_cache = [torch.empty(shape, dtype=dtype, device=device) for _ in layers]
        if lcp:
            pre_shape = (1, self.n_kv, lcp, self.head_dim)
            pre_k = [torch.empty(pre_shape, dtype=dtype, device=device) for _ in layers]
            pre_v = [torch.empty(pre_shape, dtype=dtype, device=device) for _ in layers]
            pre_mask = torch.ones(lcp, lcp, dtype=torch.bool, device=device).tril()
            self._forward(layers, torch.tensor([distinct[0][:lcp]], device=device),
                          pos[:1, :lcp], pre_k, pre_v, 0, pre_mask[None, None])
            for i in range(len(layers)):
                k_cache[i][:, :, :lcp] = pre_k[i]
                v_cache[i][:, :, :lcp] = pre_v[i]
        # Query j (column lcp + j) sees the valid keys up to its own column; pad queries attend
        # to themselves only, so no softmax row is empty (their outputs are never read; their
        # keys are masked for every real query).
        causal = torch.ones(rest_w, width, dtype=torch.bool, device=device).tril(diagonal=lcp)
        eye = torch.eye(rest_w, width, dtype=torch.bool, device=device).roll(lcp, dims=1)
        mask = (causal & valid[:, None, :width]) | eye
        hidden = self._forward(layers, ids, pos[:, lcp:], k_cache, v_cache, lcp, mask[:, None])
        logits = self._logits(hidden)
        # Fan the distinct rows out to the samples.
        index = torch.tensor(row_of, dtype=torch.long, device=device)
        if u != n or row_of != list(range(n)):
            k_cache = [k.index_select(0, index) for k in k_cache]
            v_cache = [v.index_select(0, index) for v in v_cache]
            logits, valid = logits.index_select(0, index), valid.index_select(0, index)
        next_pos = pos[index, -1] + 1
        rows = torch.arange(n, device=device)  # original row of each live batch row
        limit = torch.tensor(list(budgets), dtype=torch.long, device=device)
        out_ids = torch.full((n, max(budgets)), self.pad_id, dtype=torch.long, device=device)
        out_lp = torch.zeros((n, max(budgets)), dtype=torch.float32, device=device)
        lengths = torch.zeros(n, dtype=torch.long, device=device)
        scale = 1.0 if greedy else temperature
        live = torch.ones(n, dtype=torch.bool, device=device)  # per batch row: still sampling
        for step in range(max(budgets)):
            logp = torch.log_softmax(logits / scale, dim=-1)
            tok = logp.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1).squeeze(-1)
            lp = logp.gather(-1, tok[:, None]).squeeze(-1)
            live_rows = rows[live]
            out_ids[live_rows, step] = tok[live]
            out_lp[live_rows, step] = lp[live]
            lengths[live_rows] = step + 1
            live &= (tok != self.eos_id) & (limit[rows] > step + 1)
            n_live = int(live.sum())
            if n_live == 0:
                break
            # Drop ended rows once they are a quarter of the batch: copying the cache costs about
            # as much as a few steps of computing rows nobody reads.
            if 4 * (len(rows) - n_live) >= len(rows):
                keep = live.nonzero().squeeze(-1)
                rows, tok, next_pos, valid = rows[keep], tok[keep], next_pos[keep], valid[keep]
                live = live[keep]
                k_cache = [k.index_select(0, keep) for k in k_cache]
                v_cache = [v.index_select(0, keep) for v in v_cache]
            at = width + step
            valid[:, at] = True
            hidden = self._forward(layers, tok[:, None], next_pos[:, None], k_cache, v_cache, at,
                                   valid[:, None, None, :at + 1])
            logits = self._logits(hidden)
            next_pos = next_pos + 1
        ids_out, lp_out = out_ids.cpu().tolist(), out_lp.cpu().tolist()
        lens = lengths.cpu().tolist()
        return [(ids_out[r][:lens[r]], lp_out[r][:lens[r]]) for r in range(n)]


MIN_SHARED_PREFIX = 16  # shorter common prefixes are not worth their own forward


def _shared_prefix_len(contexts: Sequence[Sequence[int]]) -> int:
    """The length of the prefix all `contexts` share, less than the shortest one (so every
    context keeps at least its last token to prefill)."""
    first, shortest = contexts[0], min(len(c) for c in contexts)
    n = shortest - 1
    for c in contexts[1:]:
        i = 0
        while i < n and c[i] == first[i]:
            i += 1
        n = i
        if n == 0:
            break
    return max(n, 0)


def _eps(norm: Any) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _rms(x: Any, weight: Any, eps: float) -> Any:
    import torch

    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
