"""The embedded tiny policy: tokenizer round trips, structural tokens, model shape, loading."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from sentinel.env.parser import format_answer, format_call
from sentinel.policy import (
    CHARS,
    SPECIAL_TOKENS,
    STRUCTURAL_TOKENS,
    build_tokenizer,
)
from tests.conftest import TINY_SHAPE

ASCII_SAMPLES = [
    "Compute (12+7)*3-5",
    string.printable.replace("\t", "").replace("\r", "").replace("\x0b", "").replace("\x0c", ""),
    "a . b , c ! d ? e 's f n't g 'm",  # tokenizers' "clean up spaces" must not touch these
    "  leading and trailing spaces  \n\n",
    'The answer is 42. {"name": "x"}',
    "user\nassistant\nsystem\n",
]


def test_saved_tokenizer_reloads_identically(tiny_dir: Path, tokenizer: Any) -> None:
    fresh = build_tokenizer()
    reloaded = AutoTokenizer.from_pretrained(str(tiny_dir))
    text = format_call("calculator", {"expression": "12*(3+4)"}) + format_answer("84")
    for tok in (reloaded, tokenizer):
        assert tok.encode(text, add_special_tokens=False) == fresh.encode(
            text, add_special_tokens=False)
        assert tok.get_vocab() == fresh.get_vocab()
        assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    messages = [{"role": "user", "content": "Compute 1+1"}]
    assert reloaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nCompute 1+1<|im_end|><|im_start|>assistant\n")


def test_vocabulary_layout(tokenizer: Any) -> None:
    assert len(tokenizer) == len(SPECIAL_TOKENS) + len(CHARS) + len(STRUCTURAL_TOKENS)
    assert tokenizer.pad_token_id == 0
    assert tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == "<|im_end|>"
    assert tokenizer.padding_side == "left"


@pytest.mark.parametrize("token", SPECIAL_TOKENS + STRUCTURAL_TOKENS)
def test_marker_is_one_token(tokenizer: Any, token: str) -> None:
    ids = tokenizer.encode(token, add_special_tokens=False)
    assert len(ids) == 1
    assert tokenizer.decode(ids, skip_special_tokens=False) == token


def test_characters_are_one_token_each(tokenizer: Any) -> None:
    unk = tokenizer.convert_tokens_to_ids("<|unk|>")
    for ch in CHARS:
        ids = tokenizer.encode(ch, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] != unk, ch
    assert len(set(tokenizer.convert_tokens_to_ids(CHARS))) == len(CHARS)


@pytest.mark.parametrize("text", ASCII_SAMPLES)
def test_decode_encode_round_trip(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_hermes_call_is_cheap(tokenizer: Any) -> None:
    call = format_call("calculator", {"expression": "12*(3+4)"})
    ids = tokenizer.encode(call, add_special_tokens=False)
    assert len(ids) <= 20
    assert len(ids) == 7 + len("12*(3+4)")  # 7 structural pieces + one id per character
    assert len(tokenizer.encode(format_answer("84"), add_special_tokens=False)) == 4


def test_model_has_configured_shape(tiny_model: Any, tokenizer: Any, tiny_dir: Path) -> None:
    cfg = tiny_model.config
    assert cfg.hidden_size == TINY_SHAPE.hidden_size == 32
    assert cfg.intermediate_size == 64
    assert cfg.num_hidden_layers == 2 == len(tiny_model.model.layers)
    assert cfg.num_attention_heads == 4
    assert cfg.vocab_size == len(tokenizer)
    assert tuple(tiny_model.get_input_embeddings().weight.shape) == (len(tokenizer), 32)
    assert cfg.eos_token_id == tokenizer.eos_token_id
    assert cfg.pad_token_id == tokenizer.pad_token_id
    saved = json.loads((tiny_dir / "config.json").read_text())
    assert saved["hidden_size"] == 32 and saved["num_hidden_layers"] == 2


def test_load_policy_gives_eval_mode(tiny_model: Any) -> None:
    import torch

    assert not tiny_model.training
    assert all(not m.training for m in tiny_model.modules())
    assert next(tiny_model.parameters()).dtype == torch.float32
    assert next(tiny_model.parameters()).device.type == "cpu"


def test_build_is_seeded(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from sentinel.policy import build_tiny_policy

    again = build_tiny_policy(tmp_path / "again", TINY_SHAPE)
    a, b = load_file(tiny_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(bool((a[k] == b[k]).all()) for k in a)


def test_the_token_ids_are_the_ones_saved_policies_were_built_with() -> None:
    """The vocabulary, id for id, is pinned: a tiny policy saved by any earlier run (the demo's
    included) reloads with the ids it was trained on. (The `numbers` tokenizer, which appended
    whole numbers and remedy tools, was removed without touching these: docs/architecture.md.)"""
    import hashlib

    vocab = sorted(build_tokenizer().get_vocab().items(), key=lambda kv: kv[1])
    assert [t for t, _ in vocab] == SPECIAL_TOKENS + CHARS + STRUCTURAL_TOKENS
    assert [i for _, i in vocab] == list(range(119))
    assert hashlib.sha256(json.dumps(vocab).encode()).hexdigest() == (
        "31dc31ea3fefe5bfc2ba67dd09cea4407b20cf2766daad66d5f72cd083e73296")
