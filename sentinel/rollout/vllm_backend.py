"""`vllm` rollout backend: an in-process `vllm.LLM` engine samples the policy's turns, token in and
token out, and follows the policy being trained by weight pushes.

- **Token in, token out.** Each context goes to the engine as `TokensPrompt(prompt_token_ids=...)`
  (no tokenizer in the engine: `skip_tokenizer_init`), and comes back as the sampled ids and their
  log-probs. The environment appends observation ids with loss mask 0, exactly as with `hf`. The G
  samples of a group share their prompt, and every later turn extends an earlier context: vLLM's
  prefix cache reuses those blocks instead of prefilling them again.
- **Log-probs.** The engine runs with `logprobs_mode="processed_logprobs"`, so a sampled token's
  log-prob is `log_softmax(logits / T)` (no top-k/top-p/min-p is set), the distribution it was
  drawn from and the one GRPO's importance ratio needs; greedy turns get `log_softmax(logits)`, as
  the `hf` backend returns them. GRPO uses these engine log-probs as the "old" log-probs;
  `grpo.rollout_correction` recomputes them with the trainer instead, or keeps them and adds trl's
  truncated importance-sampling correction (docs/vllm.md).
- **Weight sync.** The backend watches the policy's parameters (their in-place version counters,
  which every optimizer step and `load_state_dict` bump). Before the first sample after a change it
  pushes the whole state dict into the engine (`collective_rpc("reload_weights",
  weights_iterator=...)`, the path that also works on vLLM's CPU backend, whose parameters are
  repacked), resets the prefix cache (its blocks hold keys and values of the old weights), and
  checks that the engine's weights did change (a checksum read back from the worker). The engine
  runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the push hands tensors over by
  reference.

The engine starts from the policy as it is when the backend is built (saved to a temporary
directory as an HF model directory), so any model the `hf` backend runs and vLLM supports runs here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any


def vllm_missing_reason() -> str | None:
    """Why `rollout.backend: vllm` cannot run here, or None when the package imports."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return ("the vllm package is not installed: `pip install 'sentinel-rl[vllm]'` on a GPU "
                "machine, or `make vllm-cpu-env` for vLLM's CPU backend (docs/vllm.md)")
    return None


def _engine_checksum(worker: Any) -> float:
    """Sum of every parameter of the engine's model (float64): changes when a push lands."""
    import torch

    runner = getattr(worker, "model_runner", worker)
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    with torch.no_grad():
        return float(sum(p.detach().double().sum().item() for p in model.parameters()))


class VLLMBackend:
    """Samples with an in-process `vllm.LLM` built from `model`'s current weights.

    `options` (a `VLLMOptions` or a mapping) sets the engine: `gpu_memory_utilization`,
    `cpu_kv_cache_gb` (vLLM's CPU backend: `VLLM_CPU_KVCACHE_SPACE`), `enforce_eager`,
    `max_model_len`, `max_num_seqs`, and `engine_kwargs` passed to `vllm.LLM` as they are.
    """

    name = "vllm"

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int = 128,
                 options: Any = None, seed: int = 0) -> None:
        reason = vllm_missing_reason()
        if reason:
            raise RuntimeError(f"rollout.backend 'vllm': {reason}")
        opts = dict(options.model_dump() if hasattr(options, "model_dump") else (options or {}))
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") not in ("0", "false", "False"):
            raise RuntimeError("rollout.backend 'vllm' runs the engine in this process (weights "
                               "are pushed by reference): unset VLLM_ENABLE_V1_MULTIPROCESSING "
                               "or set it to 0")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if opts.get("cpu_kv_cache_gb") is not None:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(opts["cpu_kv_cache_gb"])))
        # vLLM logs every engine step of its start at INFO; a loop's own progress is what a user
        # reads. VLLM_LOGGING_LEVEL set by the user wins.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        import logging

        import torch
        from vllm import LLM

        # Without a tokenizer in the engine (token in/out), vLLM's chat-template warm-up fails
        # and logs the traceback as a warning; nothing here renders chat templates.
        logging.getLogger("vllm.renderers.base").addFilter(
            lambda record: "Chat template warmup failed" not in record.getMessage())

        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.eos_id = tokenizer.eos_token_id
        self._dir = tempfile.mkdtemp(prefix="sentinel-vllm-")
        model.save_pretrained(self._dir)
        dtype = next(model.parameters()).dtype
        kwargs: dict[str, Any] = {
            "model": self._dir,
            "dtype": {torch.float32: "float32", torch.bfloat16: "bfloat16",
                      torch.float16: "float16"}.get(dtype, "auto"),
            "skip_tokenizer_init": True,
            "logprobs_mode": "processed_logprobs",
            "enable_prefix_caching": True,
            "enforce_eager": opts.get("enforce_eager", True),
            "seed": seed,
            "max_num_seqs": opts.get("max_num_seqs") or batch_size,
        }
        if opts.get("gpu_memory_utilization") is not None:
            kwargs["gpu_memory_utilization"] = opts["gpu_memory_utilization"]
        if opts.get("max_model_len") is not None:
            kwargs["max_model_len"] = opts["max_model_len"]
        kwargs.update(opts.get("engine_kwargs") or {})
        self.llm = LLM(**kwargs)
        self.pushes = 0
        self._stamp = self._version()
        try:  # one token now: a model the engine cannot run fails here, not mid-round
            self.sample([[self.eos_id]], [1], temperature=1.0, greedy=True)
        except Exception as exc:
            self.close()
            raise RuntimeError(f"rollout.backend 'vllm': the engine could not run this model "
                               f"({type(exc).__name__}: {exc})") from exc

    # -- weight sync ---------------------------------------------------------------------------
    def _version(self) -> tuple[int, ...]:
        return tuple(p._version for p in self.model.parameters())

    def checksum(self) -> float:
        """The engine's parameter checksum (see `_engine_checksum`)."""
        return float(self.llm.collective_rpc(_engine_checksum)[0])

    def push_weights(self, *, verify: bool = True) -> None:
        """Load the policy's current state dict into the engine and reset its prefix cache. With
        `verify`, raise if the engine's weights did not change although the policy's did."""
        before = self.checksum() if verify else None
        weights = [(name, t.detach()) for name, t in self.model.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()
        self._stamp = self._version()
        self.pushes += 1
        if verify and self.checksum() == before:
            raise RuntimeError("vllm weight push: the engine's weights are unchanged after "
                               "reload_weights although the policy's changed")

    def sync(self) -> bool:
        """Push the weights when the policy changed since the last push; True if it pushed."""
        if self._version() == self._stamp:
            return False
        self.push_weights()
        return True

    # -- sampling ------------------------------------------------------------------------------
    def sample(self, contexts: Sequence[list[int]], budgets: Sequence[int], *, temperature: float,
               greedy: bool, seed: int | None = None) -> list[tuple[list[int], list[float]]]:
        """`RolloutBackend.sample`; `seed` seeds request k with `seed + k` (reproducible
        samples whatever the engine ran before), else the engine's own generator draws."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.sync()
        results: list[tuple[list[int], list[float]]] = [([], []) for _ in contexts]
        live = [i for i, b in enumerate(budgets) if b > 0]
        if not live:
            return results
        prompts = [TokensPrompt(prompt_token_ids=list(contexts[i])) for i in live]
        params = [SamplingParams(max_tokens=int(budgets[i]), temperature=0.0 if greedy
                                 else float(temperature), top_p=1.0, top_k=0, min_p=0.0,
                                 logprobs=0, stop_token_ids=[self.eos_id], detokenize=False,
                                 skip_special_tokens=False,
                                 seed=None if seed is None else seed + k)
                  for k, i in enumerate(live)]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        for i, out in zip(live, outputs, strict=True):
            completion = out.outputs[0]
            ids = list(completion.token_ids)[: budgets[i]]
            if self.eos_id in ids:
                ids = ids[: ids.index(self.eos_id) + 1]
            logprobs = [entry[tok].logprob for tok, entry in zip(ids, completion.logprobs,
                                                                 strict=False)]
            results[i] = (ids, logprobs)
        return results

    def close(self) -> None:
        """Shut the engine down now and remove its weight directory. vLLM's parallel state is
        process-wide: this ends every engine of the process (the loop closes its own at the end
        of a run, so that a later run's engine is not torn down by a late garbage collection)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if client is not None and hasattr(client, "shutdown"):
                client.shutdown()
            del llm
        shutil.rmtree(self._dir, ignore_errors=True)
