"""The embedded default policy: a tiny Llama built from a config, and a character-level tokenizer.

Both are saved as an ordinary Hugging Face model directory (`config.json`, weights,
`tokenizer.json`, a jinja2 chat template), and loaded back with `AutoModelForCausalLM` /
`AutoTokenizer` exactly as a hub model is, so every code path is the one a real model takes.

The tokenizer is character level (printable ASCII and newline) plus whole tokens for the
structural markers of the chat and tool-call format (`<|im_start|>`, `<tool_call>`, the fixed JSON
keys of a Hermes call, tool names, ...). A Hermes call then costs the tiny model about ten tokens,
as it costs a real tokenizer, instead of ~70 characters. The token ids are fixed (special tokens,
characters, structural tokens, in that order): saved tiny policies depend on them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SPECIAL_TOKENS = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<|unk|>"]
STRUCTURAL_TOKENS = [
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<answer>", "</answer>",
    '{"name": "', '", "arguments": ', '{"expression": "', '{"entity": "', '", "attribute": "',
    '{"code": "', '"}}', "calculator", "lookup", "python", "system\n", "user\n", "assistant\n",
]
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]

# Compact on purpose: every character is a token for this model, so the framing is kept short
# (no newlines between turns; a tool result is just its <tool_response> block).
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools: "
    "{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}<|im_end|>"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<tool_response>{{ m['content'] }}</tool_response>"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TinyPolicyConfig(BaseModel):
    """Shape of the embedded tiny Llama."""

    model_config = ConfigDict(extra="forbid")
    hidden_size: int = Field(192, ge=8, description="width of the tiny Llama")
    intermediate_size: int = Field(768, ge=8, description="MLP width")
    num_hidden_layers: int = Field(4, ge=1, description="layers")
    num_attention_heads: int = Field(6, ge=1, description="attention heads (no grouped KV)")
    max_position_embeddings: int = Field(1024, ge=64, description="context length")
    seed: int = Field(0, description="seed of the weight init")


def build_tokenizer() -> Any:
    """The character-level `PreTrainedTokenizerFast` with the chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|unk|>"))
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    core.add_tokens([AddedToken(t, normalized=False, special=False) for t in STRUCTURAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<|pad|>", eos_token="<|im_end|>",
        bos_token="<|im_start|>", unk_token="<|unk|>", padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_policy(out_dir: str | Path, config: TinyPolicyConfig | None = None) -> Path:
    """Create the tiny policy (random init, seeded) and save it as an HF model directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    config = config or TinyPolicyConfig()
    out = Path(out_dir)
    tokenizer = build_tokenizer()
    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(model_config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def load_policy(path_or_id: str | Path, *, device: str = "cpu", dtype: str = "float32") -> tuple:
    """Load (model, tokenizer) from a local directory, a hub id or a built-in pretrained name
    (`sentinel.pretrained.BUILTINS`, converted once), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from sentinel.pretrained import resolve

    hf_logging.disable_progress_bar()  # the loop draws its own progress
    path_or_id = resolve(str(path_or_id))

    tokenizer = AutoTokenizer.from_pretrained(str(path_or_id))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(path_or_id), dtype=getattr(torch, dtype))
    model.to(device)
    model.eval()
    return model, tokenizer


def check_policy_source(model: str) -> None:
    """Raise `ValueError` (message starting `policy.model`) unless `model` can be loaded: `tiny`;
    a built-in pretrained name whose package is installed (`smollm2-135m`); an existing directory
    holding a `config.json`; or a hub id (`name` or `owner/name`) whose `config.json` is in the
    local Hugging Face cache or, unless `HF_HUB_OFFLINE` is set, that the hub answers for. A local
    `config.json` (the directory's, or the cached one) must be a JSON object with a `model_type`
    transformers knows. Checked before a run writes anything, so a typo or a broken model
    directory never leaves a store behind.
    """
    import json
    import os

    from sentinel.pretrained import BUILTINS, gguf_path

    if model == "tiny":
        return
    if model in BUILTINS:
        gguf_path(model)  # its package is installed, or a one-line error naming the command
        return

    def model_config(file: Path) -> None:
        """`file`, a model's config.json, is a JSON object whose `model_type` transformers knows
        (what `AutoConfig` needs; `architectures` alone does not load): else a one-line error
        now, not a traceback after the store is made and the cold start begun."""
        try:
            text = file.read_bytes() if file.stat().st_size <= 16 << 20 else None
        except OSError as exc:
            raise ValueError(f"policy.model: {file} cannot be read: {exc.strerror or exc}"
                             ) from None
        if text is None:
            raise ValueError(f"policy.model: {file} is larger than 16 MiB, not a model's "
                             "config.json")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"policy.model: {file} is not valid JSON ({exc})") from None
        kind = data.get("model_type") if isinstance(data, dict) else None
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"policy.model: {file} has no model_type (not a Hugging Face model "
                             "config)")
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if kind not in CONFIG_MAPPING:
            raise ValueError(f"policy.model: {file} has model_type {kind!r}, which this "
                             "transformers does not know (a newer transformers may)")

    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"policy.model: the directory {path} holds no config.json (not a "
                             "Hugging Face model directory)")
        model_config(path / "config.json")
        return
    if path.exists():
        raise ValueError(f"policy.model: {path} is a file; give 'tiny', a Hugging Face model "
                         "directory or a hub id")
    from huggingface_hub import model_info, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(model)
    except HFValidationError:
        raise ValueError(f"policy.model: {model!r} is neither an existing directory nor a hub id "
                         "of the form owner/name; give 'tiny', a Hugging Face model directory "
                         "or a hub id") from None
    if isinstance(cached := try_to_load_from_cache(model, "config.json"), str):
        model_config(Path(cached))
        return
    looked = (f"no directory {path.resolve()} and no hub model {model!r} in the local Hugging "
              "Face cache")
    offline = any(os.environ.get(k, "").upper() in {"1", "ON", "YES", "TRUE"}
                  for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    if offline:
        raise ValueError(f"policy.model: {looked} (HF_HUB_OFFLINE is set, so the hub was not "
                         "asked)")
    try:
        model_info(model, timeout=10)
    except Exception as exc:  # any failure (network, 404, gated, timeout): the run cannot load it
        raise ValueError(f"policy.model: {looked}, and the hub did not answer for it "
                         f"({type(exc).__name__})") from None


def load_run_policy(config: Any, init_dir: Path, seed: int) -> tuple:
    """The policy a run starts from, as `(model, tokenizer)`: `config.model` (a `PolicyConfig`)
    loaded on `config.device` in `config.dtype`; `tiny` is the embedded model, built from
    `config.tiny` into `init_dir` the first time (seeded with `seed`) and loaded from there."""
    import torch

    torch.manual_seed(seed)
    source: str | Path = config.model
    if source == "tiny":
        source = Path(init_dir)
        if not (source / "config.json").exists():
            build_tiny_policy(source, config.tiny)
    return load_policy(source, device=config.device, dtype=config.dtype)
