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
    NUMBER_TOKENS,
    REMEDY_TOKENS,
    SPECIAL_TOKENS,
    STRUCTURAL_TOKENS,
    TinyPolicyConfig,
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


def test_numbers_tokenizer_has_whole_numbers_and_remedy_tools() -> None:
    chars, numbers = build_tokenizer("chars"), build_tokenizer("numbers")
    assert len(numbers) == len(chars) + len(NUMBER_TOKENS) + len(REMEDY_TOKENS)
    # the chars tokenizer's ids are unchanged, so the extra tokens only append to the vocabulary
    assert all(numbers.get_vocab()[t] == i for t, i in chars.get_vocab().items())
    call = format_call("calculator", {"expression": "76+15"})
    assert numbers.convert_ids_to_tokens(numbers.encode(call, add_special_tokens=False))[5:8] == [
        "76", "+", "15"]
    wait = format_call("wait", {"seconds": 2})
    assert numbers.convert_ids_to_tokens(numbers.encode(wait, add_special_tokens=False))[:5] == [
        "<tool_call>", '{"name": "', "wait", '", "arguments": ', '{"seconds": ']
    # longest match first: a three-digit number is two tokens, `calculator` stays one
    ids = numbers.encode("123 calculator calc", add_special_tokens=False)
    assert numbers.convert_ids_to_tokens(ids) == ["12", "3", " ", "calculator", " ", "calc"]
    for text in [*ASCII_SAMPLES, call, wait, "-10 waited 2 s; available: calc"]:
        ids = numbers.encode(text, add_special_tokens=False)
        assert numbers.decode(ids, skip_special_tokens=False) == text
        assert len(ids) <= len(chars.encode(text, add_special_tokens=False))


def test_tokenizer_kind_is_checked(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from sentinel.policy import build_tiny_policy

    with pytest.raises(ValidationError, match="tokenizer"):
        TinyPolicyConfig(tokenizer="words")
    with pytest.raises(ValueError, match=r"policy\.tiny\.tokenizer"):
        build_tokenizer("words")
    shape = TINY_SHAPE.model_copy(update={"tokenizer": "numbers"})
    out = build_tiny_policy(tmp_path / "numbers", shape)
    reloaded = AutoTokenizer.from_pretrained(str(out))
    assert reloaded.get_vocab() == build_tokenizer("numbers").get_vocab()
    assert json.loads((out / "config.json").read_text())["vocab_size"] == len(reloaded)
