"""Shared fixtures: the tiny real policy (built once per session), its chat format, the arith
family and a parser. No mocks: everything here is the object the loop itself uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sentinel.env.chat import ChatFormat
from sentinel.env.parser import HermesParser
from sentinel.policy import TinyPolicyConfig, build_tiny_policy, load_policy
from sentinel.tasks import load_family
from sentinel.tasks.arith import ArithFamily

TINY_SHAPE = TinyPolicyConfig(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_policy(tmp_path_factory.mktemp("tiny"), TINY_SHAPE)


@pytest.fixture(scope="session")
def tiny_policy(tiny_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) loaded back from disk with the Auto classes, in eval mode."""
    return load_policy(tiny_dir)


@pytest.fixture(scope="session")
def tiny_model(tiny_policy: tuple[Any, Any]) -> Any:
    return tiny_policy[0]


@pytest.fixture(scope="session")
def tokenizer(tiny_policy: tuple[Any, Any]) -> Any:
    return tiny_policy[1]


@pytest.fixture(scope="session")
def chat(tokenizer: Any) -> ChatFormat:
    return ChatFormat(tokenizer)


@pytest.fixture(scope="session")
def arith() -> ArithFamily:
    family = load_family("arith")
    assert isinstance(family, ArithFamily)
    return family


@pytest.fixture
def parser() -> HermesParser:
    return HermesParser()
