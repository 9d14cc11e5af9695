"""Bad configs, table-driven: each gives ONE error (one line) that names the dotted key.

Each row changes the quickstart config with `--set` overrides (the way users make mistakes) and
says which dotted key the error must name and, where the rule is worth pinning, a fragment of
the rule. Plugin names (families, generators, loggers, parsers) are resolved when the config is
loaded, so an unknown one is a config error too; the real CLI is checked for one of them.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import annotated_types as at
import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from sentinel.config import ConfigError, SentinelConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"

# (overrides, dotted key the message must name, fragment of the rule or "")
BAD_CONFIGS: dict[str, tuple[list[str], str, str]] = {
    # wrong types
    "int given a word": (["rounds=abc"], "rounds", "valid integer"),
    "int given a list": (["seed=[1]"], "seed", "valid integer"),
    "section given a number": (["env=5"], "env", "dictionary"),
    "list given a mapping": (["families={type: arith}"], "families", "list"),
    "bool given a word": (["eval.greedy=sometimes"], "eval.greedy", "boolean"),
    # a backend this environment cannot run is refused at load, not at the first rollout
    "unknown rollout backend": (["rollout.backend=sglang"], "rollout.backend", "'hf' or 'vllm'"),
    # unknown keys at several depths
    "unknown top-level key": (["bogus=1"], "bogus", "unknown config key"),
    "unknown key, depth 2": (["grpo.lrr=1"], "grpo.lrr", "unknown config key"),
    "unknown key, depth 3": (["env.faults.rat=0.1"], "env.faults.rat", "unknown config key"),
    "unknown key in a list entry": (["families.0.extra=1"], "families.0.extra", "unknown"),
    "unknown key in eval.families": (["eval.families=[{type: arith, wieght: 1}]"],
                                     "eval.families.0.wieght", "unknown config key"),
    "unknown family option": (["families.0.bogus=1"], "families.0.bogus", "unknown config key"),
    "unknown generator option": (["generators.0.per_failur=1"], "generators.0.per_failur",
                                 "unknown config key"),
    # impossible values and combinations
    "group size 1": (["batch.group_size=1"], "batch.group_size",
                     ">= 2: GRPO compares samples within a group"),
    "min_operands > max_operands": (["families.0.min_operands=5"], "families.0",
                                    "min_operands (5) must not exceed max_operands (4)"),
    "family option out of range": (["families.0.max_value=-1"], "families.0.max_value", ">= 2"),
    "generator option out of range": (["generators.0.per_failure=0"],
                                      "generators.0.per_failure", ">= 1"),
    "mined + replay > 1": (["curriculum.mined_fraction=0.5", "curriculum.replay_fraction=0.6"],
                           "curriculum",
                           "mined_fraction + replay_fraction must not exceed 1"),
    "rollout temperature 0": (["rollout.temperature=0"], "rollout.temperature", "greater than 0"),
    "second temperature": (["grpo.temperature=0.5"], "grpo.temperature",
                           "set rollout.temperature (now 1.0), the one temperature"),
    "old and new name together": (["generation.budget=3", "generation.max_candidates=4"],
                                  "generation.budget", "give only generation.max_candidates"),
    "negative reward weight": (["reward.w_format=-0.1"], "reward.w_format", ">= 0"),
    "no held-out tasks": (["eval.num_tasks=0"], "eval.num_tasks", ">= 1"),
    "unknown family": (["families.0.type=nope"], "families.0.type", "unknown task family 'nope'"),
    "unknown held-out family": (["eval.families=[{type: nope}]"], "eval.families.0.type",
                                "unknown task family 'nope'"),
    "family module:Class that does not import": (["families.0.type=no_such_module:Family"],
                                                 "families.0.type", "No module named"),
    "family module:Class that is not a family": (["families.0.type=json:JSONDecoder"],
                                                 "families.0.type", "not a TaskFamily"),
    "unknown generator": (["generators.0.type=no_such_generator"], "generators.0.type",
                          "unknown generator 'no_such_generator'"),
    "unknown logger": (["logging.backends=[tensorbord]"], "logging.backends",
                       "unknown logger 'tensorbord'"),
    "no families": (["families=[]"], "families", "at least one task family"),
    "zero family weight": (["families.0.weight=0"], "families.0.weight", "greater than 0"),
    "generator without type": (["generators.0={per_failure: 2}"], "generators.0.type",
                               "needs a string 'type'"),
    "turn longer than the episode": (["env.max_turn_tokens=400"], "env.max_turn_tokens",
                                     "must not exceed env.max_tokens (384)"),
    "unknown parser": (["env.parser=xml"], "env.parser",
                       "unknown tool-call parser 'xml'; built-in: hermes"),
    "fault rate above 1": (["env.faults.rate=2"], "env.faults.rate", "less than or equal to 1"),
    "unknown dtype": (["policy.dtype=int8"], "policy.dtype", "'int8'"),
    "zero learning rate": (["sft.lr=0"], "sft.lr", "greater than 0"),
    "clip epsilon of 1": (["grpo.epsilon_low=1"], "grpo.epsilon_low",
                          "less than 1: the lower clip bound 1 - epsilon_low must stay positive"),
    "zero turns": (["env.max_turns=0"], "env.max_turns", ">= 1"),
    "trl with a native-only option": (["trainer.backend=trl", "grpo.kl_guard=0.05"],
                                      "trainer.backend", "cannot do grpo.kl_guard=0.05"),
    "a removed knob turned on": (["repair.epochs=1"], "repair.epochs",
                                 "with a measured gain): supervised repair"),
    # text that cannot be tokenized or stored, or is far too long (issue #42): a general check
    # over every string of the config, keys included, before anything else is validated
    "lone surrogate in an instruction": (['families.0.instruction="\\ud800"'],
                                         "families.0.instruction", "lone surrogate ('\\ud800'"),
    "lone surrogate in a plugin name": (['generators.0.type="mut\\udfffate"'],
                                        "generators.0.type", "lone surrogate ('\\udfff'"),
    "lone surrogate in a key (non-UTF-8 argv)": (["seed\udcff=1"], "seed", "lone surrogate"),
    "instruction over 4,000 characters": (["families.0.instruction=" + "x" * 4001],
                                          "families.0.instruction", "at most 4000 characters"),
    "a string of 100,001 characters": (["logging.project=" + "x" * 100_001], "logging.project",
                                       "a config string has at most 100,000"),
    # counts past what one machine can hold (every other cap: the bound table below)
    "10^26 rounds": (["rounds=" + "1" + "0" * 26], "rounds", "less than or equal to 10000"),
    "a group of 10^9": (["batch.group_size=1000000000"], "batch.group_size",
                        "less than or equal to 1024"),
}


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_bad_config_gives_one_error_naming_the_key(name: str) -> None:
    overrides, key, fragment = BAD_CONFIGS[name]
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, overrides)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert key in message, message
    assert fragment in message.replace("greater than or equal to", ">="), message


def test_every_section_has_a_bad_case() -> None:
    """Every top-level key of `SentinelConfig` (read from the model, so a new section counts)
    is named by at least one row of the table."""
    named = {key.split(".")[0] for _, key, _ in BAD_CONFIGS.values()}
    missing = set(SentinelConfig.model_fields) - named
    assert not missing, f"no bad case for {sorted(missing)}"


def _fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """(dotted key, field) of `model` and of the sections nested in it."""
    for name, info in model.model_fields.items():
        yield prefix + name, info
        for t in (info.annotation, *typing.get_args(info.annotation)):
            if isinstance(t, type) and issubclass(t, BaseModel):
                yield from _fields(t, f"{prefix}{name}.")


def _past_bounds() -> dict[str, tuple[str, float, float]]:
    """For every numeric bound of `SentinelConfig` (read from the model): a value just past it,
    with the bound it breaks."""
    cases = {}
    for key, info in _fields(SentinelConfig):
        step = 1 if int in (info.annotation, *typing.get_args(info.annotation)) else 0.5
        for bound in info.metadata:
            if isinstance(bound, at.Ge | at.Gt | at.Le | at.Lt):
                limit = getattr(bound, type(bound).__name__.lower())  # Ge(ge=2).ge
                value = {at.Ge: limit - step, at.Gt: limit, at.Le: limit + step,
                         at.Lt: limit}[type(bound)]
                cases[f"{key} {type(bound).__name__.lower()} {limit:g}"] = (key, value, limit)
    return cases


PAST_BOUNDS = _past_bounds()


@pytest.mark.parametrize("name", list(PAST_BOUNDS))
def test_every_bounded_key_refuses_a_value_past_its_bound(name: str) -> None:
    key, value, limit = PAST_BOUNDS[name]
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, [f"{key}={value}"])
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert f"config key '{key}'" in message and f"{limit:g}" in message, message


def test_bounds_are_found() -> None:
    assert {"batch.group_size ge 2", "grpo.epsilon_low lt 1", "env.faults.rate le 1",
            "rollout.temperature gt 0"} <= set(PAST_BOUNDS)
    # the sanity caps on counts (issue #42)
    assert {"rounds le 10000", "batch.steps_per_round le 10000", "batch.tasks_per_step le 4096",
            "batch.group_size le 1024", "eval.num_tasks le 100000", "eval.samples le 1024",
            "sft.steps le 100000", "sft.num_examples le 100000"} <= set(PAST_BOUNDS)


@pytest.mark.parametrize("name", ["arith", "sentinel.tasks.arith:ArithFamily"])
def test_good_family_names_still_load(name: str) -> None:
    cfg = load_config(QUICKSTART, [f"families.0.type={name}"])
    assert cfg.families[0].type == name
    assert cfg.families[0].build().config.max_operands == 4


def test_unknown_generator_type_fails_the_cli(tmp_path: Path) -> None:
    """Generator types resolve (through entry points) when the config is loaded, before torch is
    imported: `sentinel loop` exits 2 with one `error:` line naming the key and the type."""
    run = subprocess.run(
        [sys.executable, "-m", "sentinel", "loop", "--config", str(QUICKSTART),
         "--run-dir", str(tmp_path / "run"), "--set", "generators.0.type=no_such_generator"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr
    assert "generators.0.type" in lines[0]
    assert "unknown generator 'no_such_generator'" in lines[0]
    assert not (tmp_path / "run" / "sentinel.duckdb").exists()  # failed before the store


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                    reason="vLLM is installed here: the vllm backend is available")
def test_vllm_backend_without_vllm_says_how_to_install_it() -> None:
    """Where vLLM is absent, `rollout.backend: vllm` fails at load, naming the key and the two
    ways to get it (the GPU extra, the CPU environment)."""
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, ["rollout.backend=vllm"])
    text = str(err.value)
    assert "rollout.backend" in text and "sentinel-rl[vllm]" in text
    assert "make vllm-cpu-env" in text
