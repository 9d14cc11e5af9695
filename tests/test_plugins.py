"""The one plugin resolver (`sentinel.plugins.resolve`): the lookup order and the one error, for
every kind that uses it (task families, generators, loggers, tool-call parsers)."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

import sentinel.plugins
from generators import GeneratorLoadError, generator_class
from sentinel.env.parser import HermesParser, parser_class
from sentinel.loggers import ConsoleLogger, logger_class
from sentinel.plugins import PluginError, resolve
from sentinel.tasks import family_class
from sentinel.tasks.arith import ArithFamily


class Outer:
    class Inner:
        def parse(self, text: str) -> None:
            return None


def test_doctests_pass() -> None:
    assert doctest.testmod(sentinel.plugins).failed == 0


def test_builtin_then_entry_point_then_module_class(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plug.py").write_text("class Parser:\n    def parse(self, text):\n        pass\n")
    (tmp_path / "boom.py").write_text("raise RuntimeError('plugin bug at import')\n")
    dist = tmp_path / "plug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plug\nVersion: 0.1\n")
    # An entry point may shadow nothing built in: `hermes` stays the built-in.
    (dist / "entry_points.txt").write_text(
        "[sentinel.parsers]\nmine = plug:Parser\nhermes = plug:Parser\nboom = boom:Parser\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert parser_class("hermes") is HermesParser
    assert parser_class("mine").__module__ == "plug"
    assert parser_class("tests.test_plugins:Outer.Inner") is Outer.Inner  # nested attribute
    with pytest.raises(PluginError, match=r"tool-call parser 'boom': entry point 'boom:Parser' "
                       r"of group 'sentinel\.parsers' failed to load: RuntimeError: plugin bug"):
        parser_class("boom")
    with pytest.raises(PluginError, match=r"unknown tool-call parser 'xml'.*entry points of "
                       r"'sentinel\.parsers': boom, hermes, mine"):
        parser_class("xml")


@pytest.mark.parametrize(("find", "name", "message"), [
    (family_class, "json:JSONDecoder", "task family 'json:JSONDecoder': JSONDecoder is not a "
                                       "TaskFamily subclass"),
    (generator_class, "tests.test_plugins:Outer", "class Outer has no generate()"),
    (logger_class, "tests.no_such_module:Logger", "logger 'tests.no_such_module:Logger': "
                                                  "importing 'tests.no_such_module' failed: "
                                                  "ModuleNotFoundError"),
    (parser_class, "tests.test_plugins:Nope", "'tests.test_plugins' has no 'Nope'"),
    (parser_class, "tests.test_plugins:pytest", "is a module, not a class"),
    (family_class, "", "must be a non-empty string"),
])
def test_one_error_names_the_kind_the_name_and_the_problem(find, name, message) -> None:
    with pytest.raises(PluginError) as info:
        find(name)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError) and info.value.name == name


def test_kinds_resolve_their_builtins() -> None:
    assert family_class("arith") is ArithFamily
    assert logger_class("console") is ConsoleLogger  # a `module:Class` string in the table
    assert GeneratorLoadError is PluginError  # the old name of the one error
    assert resolve("x", "a", {"a": dict}, "sentinel.nothing") is dict
