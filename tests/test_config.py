"""Run configuration: loading, `--set` overrides, and errors that name the key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from sentinel.config import (
    ANY,
    REMOVED,
    ConfigError,
    SentinelConfig,
    apply_override,
    drop_removed,
    load_config,
    parse_override,
)

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def test_quickstart_loads() -> None:
    cfg = load_config(QUICKSTART)
    assert isinstance(cfg, SentinelConfig)
    assert cfg.rounds >= 1
    assert cfg.policy.model == "tiny"
    assert [f.type for f in cfg.families] == ["arith"]
    # The entry is the family's own typed config; `build` makes the family from it.
    assert cfg.families[0].build().config.max_operands == 4
    assert not hasattr(cfg.grpo, "temperature")  # one temperature: rollout.temperature
    assert cfg.grpo_trainer_config().temperature == cfg.rollout.temperature == 1.0
    # Every generator entry is its generator's own config model; the embedded teacher's is
    # checked here, its training (a minute) in tests/test_teacher.py.
    from generators import load_generator
    from generators.teacher import TeacherConfig

    assert isinstance(cfg.generators[3], TeacherConfig) and cfg.generators[3].model == "tiny"
    names = [load_generator(spec).name for spec in cfg.generators[:3]]
    assert names == ["mutate", "decompose", "escalate"]


def test_defaults_without_a_file() -> None:
    cfg = load_config()
    assert cfg.families[0].type == "arith"
    assert [g.model_dump() for g in cfg.generators] == [
        {"type": "mutate", "max_candidates": 32, "per_failure": 2}]
    assert cfg.batch.group_size == 8


def test_overrides_nested_and_typed() -> None:
    cfg = load_config(QUICKSTART, [
        "rounds=2",
        "grpo.lr=1e-5",
        "eval.greedy=false",
        "env.faults.rate=0.25",
        "policy.tiny.hidden_size=64",
        "generators=[{type: mutate}]",
        "generators.0.per_failure=3",
        "families.0.max_value=50",
        "rollout.temperature=1",
        "policy.model=/models/x",
    ])
    assert cfg.rounds == 2
    assert cfg.grpo.lr == pytest.approx(1e-5)
    assert cfg.eval.greedy is False
    assert cfg.env.faults.rate == 0.25
    assert cfg.policy.tiny.hidden_size == 64
    assert cfg.generators[0].model_dump() == {"type": "mutate", "max_candidates": 32,
                                              "per_failure": 3}
    assert cfg.families[0].max_value == 50
    assert cfg.grpo_trainer_config().temperature == cfg.rollout.temperature == 1.0
    assert cfg.policy.model == "/models/x"


def test_override_creates_missing_sections() -> None:
    cfg = load_config(None, ["eval.families=[{type: arith, weight: 2}]"])
    assert cfg.eval.families is not None and cfg.eval.families[0].weight == 2.0
    cfg = load_config(None, ["families.0.type=arith"], data={"families": [{"type": "x"}]})
    assert cfg.families[0].type == "arith"


def test_parse_override_types_values_as_yaml() -> None:
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=0.5") == (["a"], 0.5)
    assert parse_override("a=null") == (["a"], None)
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    assert parse_override("a='3'") == (["a"], "3")
    assert parse_override("a=") == (["a"], "")
    assert parse_override(" a.b =x=y") == (["a", "b"], "x=y")
    with pytest.raises(ConfigError, match=r"expects key\.path=value"):
        parse_override("novalue")
    with pytest.raises(ConfigError, match=r"expects key\.path=value"):
        parse_override("=3")
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_override("a=[1, 2")


def test_apply_override_errors() -> None:
    data = {"generators": [{"type": "mutate"}], "seed": 0}
    with pytest.raises(ConfigError, match=r"generators\.5\.type: no list index 5"):
        apply_override(data, ["generators", "5", "type"], "x")
    with pytest.raises(ConfigError, match="no list index x"):
        apply_override(data, ["generators", "x"], "x")
    with pytest.raises(ConfigError, match="seed is not a mapping"):
        apply_override(data, ["seed", "x"], 1)
    apply_override(data, ["generators", "0"], {"type": "other"})
    assert data["generators"] == [{"type": "other"}]


@pytest.mark.parametrize("item", ["seed.x.y=1", "policy.model.a.b=1"])
def test_override_through_a_scalar_is_a_config_error(item: str) -> None:
    with pytest.raises(ConfigError):
        load_config(QUICKSTART, [item])


def test_load_config_does_not_mutate_callers_data() -> None:
    data = {"grpo": {"lr": 1.0e-4}}
    cfg = load_config(data=data, overrides=["grpo.lr=2.0e-4"])
    assert cfg.grpo.lr == 2.0e-4
    assert data == {"grpo": {"lr": 1.0e-4}}


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["bogus=1"], ["unknown config key 'bogus'"]),
        (["grpo.lrr=1"], ["unknown config key 'grpo.lrr'"]),
        (["env.faults.rat=0.1"], ["unknown config key 'env.faults.rat'"]),
        (["rounds=abc"], ["config key 'rounds'", "valid integer", "'abc'"]),
        (["rounds=-1"], ["config key 'rounds'", "-1"]),
        (["batch.group_size=1"],
         ["config key 'batch.group_size'", "GRPO compares samples within a group"]),
        (["curriculum.replay_fraction=0.8"],
         ["config key 'curriculum'", "mined_fraction + replay_fraction"]),
        (["rollout.temperature=0.5", "grpo.temperature=0.7"],
         ["grpo.temperature (0.7) is not a key any more", "rollout.temperature (now 0.5)"]),
        (["families=[]"], ["config key 'families'", "at least one task family"]),
        (["generators.0={per_failure: 2}"], ["config key 'generators.0.type'", "'type'"]),
        (["policy.dtype=int8"], ["config key 'policy.dtype'", "'int8'"]),
        (["families.0.weight=0"], ["config key 'families.0.weight'"]),
        (["env.faults.rate=2"], ["config key 'env.faults.rate'"]),
    ],
)
def test_errors_name_the_key(overrides: list[str], fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, overrides)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message


def test_several_errors_are_all_reported() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, ["grpo.lrr=1", "batch.group_size=1"])
    message = str(info.value)
    assert "'grpo.lrr'" in message and "'batch.group_size'" in message
    assert len(message.splitlines()) == 2


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_config(missing)
    assert str(missing) in str(info.value)


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("rounds: [1, 2\nseed: 0\n")
    with pytest.raises(ConfigError, match="is not valid YAML") as info:
        load_config(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("text", ["- rounds: 2\n", "just a string\n", "42\n"])
def test_non_mapping_top_level(tmp_path: Path, text: str) -> None:
    path = tmp_path / "list.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="mapping of keys to values at the top level"):
        load_config(path)


def test_empty_file_is_an_error_not_a_default_run(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(ConfigError, match=r"empty\.yaml is empty"):
        load_config(path)
    assert load_config(data={}) == SentinelConfig()  # no file at all: the defaults


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_dumped_config_holds_every_default_and_loads_again() -> None:
    """`runs.config` is `model_dump(mode="json")`: typed family and generator entries put every
    option there, defaults included (arith's `ops` and `max_intermediate` were once missing)."""
    cfg = load_config(QUICKSTART)
    dumped = cfg.model_dump(mode="json")
    arith = dumped["families"][0]
    assert arith["type"] == "arith" and arith["ops"] == "+-*/" and arith["max_intermediate"] == 1000
    assert dumped["generators"][0] == {"type": "mutate", "max_candidates": 32, "per_failure": 2}
    assert "temperature" not in dumped["grpo"] and dumped["rollout"]["temperature"] == 1.0
    assert load_config(data=dumped) == cfg


def test_old_keys_are_read_with_a_warning_naming_the_new_one() -> None:
    """Configs stored by older runs (`sentinel loop --resume`) still load."""
    old = {"families": [{"name": "arith", "weight": 2, "config": {"max_value": 50}}],
           "generation": {"budget": 5, "probe_budget": 6},
           "rollout": {"temperature": 0.9}, "grpo": {"temperature": 0.9, "lr": 1e-4}}
    with pytest.warns(FutureWarning) as record:
        cfg = load_config(data=old)
    said = " | ".join(str(w.message) for w in record)
    for new in ("`type`", "generation.max_candidates", "generation.max_probed",
                "rollout.temperature is the one temperature"):
        assert new in said
    assert (cfg.families[0].type, cfg.families[0].weight, cfg.families[0].max_value) == (
        "arith", 2.0, 50)
    assert (cfg.generation.max_candidates, cfg.generation.max_probed) == (5, 6)
    assert cfg.grpo.lr == 1e-4 and cfg.grpo_trainer_config().temperature == 0.9


def test_a_config_stored_before_knobs_were_removed_still_loads() -> None:
    """`runs.config` of a run made before the removals (docs/architecture.md, "Admitting knobs by
    result"; the demo's, every default filled in) holds each removed key at its off value: it
    loads (`sentinel loop --resume`), the removed keys dropped with one warning naming them,
    everything else exactly as stored."""
    stored = json.loads((ROOT / "tests" / "data" / "config_stored_before_removals.json")
                        .read_text())
    with pytest.warns(FutureWarning, match="removed from Sentinel") as record:
        cfg = load_config(data=stored)
    assert len(record) == 1
    kept, dropped = drop_removed(stored)
    assert set(dropped) == set(REMOVED) | {"repair"}, "the fixture holds every removed key"
    assert all(key in str(record[0].message) for key in dropped)
    assert cfg.model_dump(mode="json") == kept


@pytest.mark.parametrize("key", sorted(k for k, (off, _) in REMOVED.items() if off is not ANY))
def test_a_removed_knob_turned_on_is_an_error_naming_it_and_its_result(key: str) -> None:
    """Set to anything but the value that left it off, a removed key is refused, in a new config
    as in a stored one: the behaviour it asks for is gone."""
    off, result = REMOVED[key]
    on = "on" if off is None else 1
    for data, overrides in (({}, [f"{key}={json.dumps(on)}"]),
                            (drop_removed(SentinelConfig().model_dump(mode="json"))[0], [])):
        if not overrides:
            *parents, last = key.split(".")
            node = data
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = on
        with pytest.raises(ConfigError) as info:
            load_config(data=data, overrides=overrides)
        message = str(info.value)
        assert key in message and result in message and "docs/results.md" in message, message


def _undescribed(model: type[BaseModel], path: str, seen: set[type]) -> list[str]:
    """Dotted keys of `model` (and every model nested in it) whose field has no description."""
    if model in seen:
        return []
    seen.add(model)
    missing = []
    for name, field in model.model_fields.items():
        key = f"{path}{name}"
        if not field.description:
            missing.append(key)
        for inner in _models_in(field.annotation):
            missing += _undescribed(inner, f"{key}.", seen)
    return missing


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through list[...], X | None, Annotated, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def test_every_config_field_has_a_description() -> None:
    """Every field of the run config tree, the built-in family entries and generator configs
    included, says what it is (the source of truth docs/configuration.md is checked against)."""
    from generators.registry import BUILTIN
    from sentinel.bench import BenchConfig
    from sentinel.tasks import FAMILIES, family_entry_model

    seen: set[type] = set()
    missing = _undescribed(BenchConfig, "", seen)
    for name in FAMILIES:
        missing += _undescribed(family_entry_model(name), f"families[{name}].", seen)
    for name, cls in BUILTIN.items():
        missing += _undescribed(cls.config_model, f"generators[{name}].", seen)
    assert len(seen) > 20  # the walk reached the nested sections and entries
    assert not missing, f"config fields without a description: {missing}"


@pytest.mark.parametrize("code", [
    "import sentinel.config",
    "from sentinel.config import load_config; load_config('configs/quickstart.yaml')",
    "import sentinel.cli",
])
def test_loading_a_config_imports_neither_torch_nor_transformers(code: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\n"
         "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
         "assert not heavy, heavy"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr


def test_help_imports_neither_torch_nor_transformers() -> None:
    run = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom sentinel.cli import app\n"
         "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
         "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
         "assert not heavy, heavy"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "loop" in run.stdout


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    """Each config in configs/ loads; one that samples with vLLM loads here with the hf backend
    when vLLM is absent (the vllm environment loads it as it is, tests/test_vllm_backend.py)."""
    from sentinel.bench import load_bench_config
    from sentinel.rollout.vllm_backend import vllm_missing_reason

    if path.name.startswith("bench_"):
        load_bench_config(path)
        return
    overrides = []
    if "backend: vllm" in path.read_text() and vllm_missing_reason():
        overrides = ["rollout.backend=hf"]
    cfg = load_config(path, overrides)
    assert cfg.rounds >= 1
