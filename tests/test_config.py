"""Run configuration: loading, `--set` overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel.config import (
    ConfigError,
    SentinelConfig,
    apply_override,
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
    assert [f.name for f in cfg.families] == ["arith"]
    # The family section is valid for the family's own config model.
    from sentinel.tasks import load_family

    assert load_family("arith", cfg.families[0].config).config.max_operands >= 2
    assert cfg.rollout.temperature == cfg.grpo.temperature
    # Every generator named in it loads; the embedded teacher's config is checked here, its
    # training (a minute) in tests/test_teacher.py.
    from generators import load_generator
    from generators.teacher import TeacherConfig

    names = [TeacherConfig.model_validate(spec).type if spec.get("model") == "tiny"
             else load_generator(spec).name for spec in cfg.generators]
    assert names == ["mutate", "decompose", "escalate", "teacher"]


def test_defaults_without_a_file() -> None:
    cfg = load_config()
    assert cfg.families[0].name == "arith"
    assert cfg.generators == [{"type": "mutate"}]
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
        "families.0.config.max_value=50",
        "grpo.temperature=1.0",
        "rollout.temperature=1",
        "policy.model=/models/x",
    ])
    assert cfg.rounds == 2
    assert cfg.grpo.lr == pytest.approx(1e-5)
    assert cfg.eval.greedy is False
    assert cfg.env.faults.rate == 0.25
    assert cfg.policy.tiny.hidden_size == 64
    assert cfg.generators == [{"type": "mutate", "per_failure": 3}]
    assert cfg.families[0].config["max_value"] == 50
    assert cfg.grpo.temperature == cfg.rollout.temperature == 1.0
    assert cfg.policy.model == "/models/x"


def test_override_creates_missing_sections() -> None:
    cfg = load_config(None, ["eval.families=[{name: arith, weight: 2}]"])
    assert cfg.eval.families is not None and cfg.eval.families[0].weight == 2.0
    cfg = load_config(None, ["families.0.name=arith"], data={"families": [{"name": "x"}]})
    assert cfg.families[0].name == "arith"


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
        (["batch.group_size=1"], ["config key 'batch.group_size'", "at least 2"]),
        (["curriculum.replay_fraction=0.8"],
         ["config key 'curriculum'", "mined_fraction + replay_fraction"]),
        (["rollout.temperature=0.5", "grpo.temperature=0.7"],
         ["grpo.temperature (0.7)", "rollout.temperature (0.5)"]),
        (["families=[]"], ["config key 'families'", "at least one task family"]),
        (["generators.0={per_failure: 2}"], ["config key 'generators'", "entry 0", "'type'"]),
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


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == SentinelConfig()


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)
