"""The plugin manager: built-ins, entry points, broken plugins, duplicates, and `gradian plugins`."""

from __future__ import annotations

import ast
import inspect
import json
import re
import tomllib
from pathlib import Path

import pytest

from gradian import hookspecs
from gradian.cli.app import main
from gradian.errors import PluginError
from gradian.plugins import RECORD_HOOKS, load_plugins
from tests.support.fake_dist import write_distribution

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = ["gradian-core", "gradian-checks", "gradian-trainer-hf", "gradian-trainer-trl", "gradian-trainer-unsloth"]

TRAINER_PLUGIN = """
import gradian
from gradian.records import TrainerSpec

@gradian.hookimpl
def gradian_trainers():
    yield TrainerSpec(name={name!r}, summary="test backend", load="json:loads")
"""


def test_all_five_distributions_are_loaded():
    plugins = load_plugins()
    loaded = {info.distribution for info in plugins.infos() if info.status == "loaded"}
    assert set(DISTRIBUTIONS) <= loaded
    assert {"hf", "trl", "unsloth"} <= set(plugins.trainers())


def test_each_registration_hook_is_called_once_until_a_plugin_is_added():
    from types import SimpleNamespace

    import gradian
    from gradian.records import TrainerSpec

    calls = []

    @gradian.hookimpl
    def gradian_trainers():
        calls.append(1)
        yield TrainerSpec(name="counted", summary="test backend", load="json:loads")

    plugins = load_plugins(autoload=False)
    plugins.register(SimpleNamespace(gradian_trainers=gradian_trainers), "counted", "test-dist")
    assert "counted" in plugins.trainers() and "counted" in plugins.trainers()
    assert len(calls) == 1  # the hookspecs promise one call per plugin set, however often a getter is used
    plugins.trainers().pop("counted")  # a caller changing its copy changes nothing for the next
    assert "counted" in plugins.trainers()
    plugins.register(SimpleNamespace(), "another", "test-dist")
    plugins.trainers()
    assert len(calls) == 2  # a new plugin may add records: collected again


def test_builtins_load_when_autoload_is_disabled(monkeypatch):
    monkeypatch.setenv("GRADIAN_DISABLE_PLUGIN_AUTOLOAD", "1")
    plugins = load_plugins()
    assert [info.name for info in plugins.infos()] == ["core"]
    assert plugins.trainers() == {}


def test_entry_point_from_an_outside_distribution_is_discovered(tmp_path, monkeypatch):
    write_distribution(tmp_path, "gradian-trainer-fake", {"trainer-fake": "fake_trainer_plugin"},
                       {"fake_trainer_plugin": TRAINER_PLUGIN.format(name="fake")})
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = load_plugins()
    assert "fake" in plugins.trainers()
    assert plugins.distribution_of("gradian_trainers", "fake") == "gradian-trainer-fake"
    info = next(i for i in plugins.infos() if i.name == "trainer-fake")
    assert (info.distribution, info.version, info.hooks) == ("gradian-trainer-fake", "9.9.9", ("gradian_trainers",))


def test_a_plugin_that_fails_to_import_is_recorded_not_fatal(tmp_path, monkeypatch):
    write_distribution(tmp_path, "gradian-broken", {"broken": "broken_plugin"},
                       {"broken_plugin": "raise RuntimeError('boom at import')\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = load_plugins()
    failed = [i for i in plugins.infos() if i.status == "failed"]
    assert [(f.name, f.distribution) for f in failed] == [("broken", "gradian-broken")]
    assert "boom at import" in failed[0].error
    assert "hf" in plugins.trainers()  # the others still work


def test_a_hook_that_raises_or_yields_the_wrong_type_is_recorded(tmp_path, monkeypatch):
    source = (
        "import gradian\n"
        "@gradian.hookimpl\ndef gradian_trainers():\n    yield 'not a TrainerSpec'\n"
        "@gradian.hookimpl\ndef gradian_storage_codecs():\n    raise ValueError('codec hook broke')\n"
    )
    write_distribution(tmp_path, "gradian-sloppy", {"sloppy": "sloppy_plugin"}, {"sloppy_plugin": source})
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = load_plugins()
    assert "hf" in plugins.trainers()
    plugins.storage_codecs()
    errors = sorted(i.error for i in plugins.infos() if i.status == "failed")
    assert any("not TrainerSpec" in e for e in errors) and any("codec hook broke" in e for e in errors)


def test_two_plugins_registering_the_same_name_is_an_error_naming_both(tmp_path, monkeypatch):
    write_distribution(tmp_path, "gradian-trainer-impostor", {"trainer-impostor": "impostor_plugin"},
                       {"impostor_plugin": TRAINER_PLUGIN.format(name="hf")})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError) as caught:
        load_plugins().trainers()
    assert "gradian-trainer-hf" in caught.value.message and "gradian-trainer-impostor" in caught.value.message


def test_two_plugins_with_the_same_plugin_name_is_an_error(tmp_path, monkeypatch):
    write_distribution(tmp_path, "gradian-copycat", {"trainer-hf": "copycat_plugin"},
                       {"copycat_plugin": TRAINER_PLUGIN.format(name="copy")})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="gradian-copycat"):
        load_plugins()


def test_gradian_plugins_json_lists_every_distribution_and_its_records(capsys):
    assert main(["plugins", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["distribution"] for row in rows} >= set(DISTRIBUTIONS)
    hf = next(row for row in rows if row["name"] == "trainer-hf")
    assert hf["records"] == {"gradian_trainers": ["hf"]} and hf["status"] == "loaded"


def test_gradian_plugins_table(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for name in ("core", "checks", "trainer-hf", "trainer-trl"):
        assert name in out


def test_every_distribution_shares_one_version_and_registers_an_entry_point():
    versions = {}
    for dist in DISTRIBUTIONS:
        project = tomllib.loads((ROOT / dist / "pyproject.toml").read_text())["project"]
        versions[dist] = project["version"]
        entry_points = project["entry-points"]["gradian"]
        assert len(entry_points) == 1, dist
        for dep in project["dependencies"]:
            if dep.startswith("gradian-core"):
                assert dep == f"gradian-core=={project['version']}"
    import gradian

    assert set(versions.values()) == {gradian.__version__}


def test_core_dependencies_are_exactly_the_design_card():
    deps = tomllib.loads((ROOT / "gradian-core" / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[ ]", d)[0] for d in deps}
    assert names == {"torch", "transformers", "peft", "pluggy", "typer", "numpy", "pyyaml", "importlib-metadata"}


def test_every_hook_is_named_typed_documented_with_an_example():
    specs = [f for name, f in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("gradian_")]
    assert {f.__name__ for f in specs} == set(RECORD_HOOKS)
    for spec in specs:
        assert re.fullmatch(r"gradian_[a-z_]+s", spec.__name__)
        assert "Iterable[" in str(inspect.signature(spec).return_annotation)
        assert spec.__doc__ and "Example::" in spec.__doc__ and "@gradian.hookimpl" in spec.__doc__


@pytest.mark.parametrize("hook_name", sorted(RECORD_HOOKS))
def test_every_hookspec_example_registers_a_record_that_gradian_collects(hook_name):
    import textwrap
    from types import ModuleType

    import gradian
    doc = getattr(hookspecs, hook_name).__doc__
    example = textwrap.dedent(doc.split("Example::", 1)[1])
    module = ModuleType(f"example_{hook_name}")
    # the example's own names for what a real plugin would define next to it
    module.__dict__.update(gradian=gradian, **{cls.__name__: cls for cls, _ in RECORD_HOOKS.values()},
                           read_my_loop=lambda path: None, check_lr=lambda ctx: (),
                           write_npy=lambda path, array: None, open_npy_memmap=lambda path: None)
    # dont_inherit: the example runs as plugin code would, not under this file's `from __future__ import annotations`
    exec(compile(example, f"<{hook_name} example>", "exec", dont_inherit=True), module.__dict__)
    plugins = load_plugins(autoload=False)
    before = set(plugins.collect(hook_name, *RECORD_HOOKS[hook_name]))
    plugins.register(module, "example", "example-dist")
    collected = plugins.collect(hook_name, *RECORD_HOOKS[hook_name])
    assert not plugins.failures and len(set(collected) - before) == 1


def test_hooks_are_declared_only_in_hookspecs_and_called_only_in_plugins():
    src = ROOT / "gradian-core" / "src" / "gradian"
    for path in src.rglob("*.py"):
        text = path.read_text()
        if path.name != "hookspecs.py":
            assert "HookspecMarker" not in text and "@hookspec" not in text, path
        if path.name != "plugins.py":
            assert ".hook.gradian_" not in text and "pm.hook" not in text, path


def test_plugin_entry_modules_import_only_stdlib_and_gradian():
    import sys

    allowed = set(sys.stdlib_module_names) | {"gradian", "__future__"}
    for dist in DISTRIBUTIONS[1:]:
        package = dist.replace("-", "_")
        tree = ast.parse((ROOT / dist / "src" / package / "plugin.py").read_text())
        top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        for node in top_level:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                assert name.split(".")[0] in allowed, f"{dist} plugin imports {name} at top level"
