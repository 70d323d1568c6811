"""A plugin owns its config section: declared through gradian_config_sections, set from YAML and --set, listed with
its owner, refused in one line when its key or value is wrong or its name is taken."""

from __future__ import annotations

import dataclasses
import json
import types
from dataclasses import dataclass

import pytest

import gradian
from gradian.cli.app import main
from gradian.config import GradianConfig, build_config, load_config, option, section_owner
from gradian.errors import ConfigError, PluginError
from gradian.plugins import get_plugins
from gradian.records import ConfigSection


@dataclass(frozen=True)
class ToxicitySettings:
    """Thresholds of a third party's toxicity check."""

    max_share: float = option(0.01, "share of toxic rows above which toxicity warns", min=0.0, max=1.0)
    lexicon: str = option("default", "word list the check matches", choices=("default", "strict"))


def register_section(section: ConfigSection, distribution: str = "gradian-checks-toxicity") -> None:
    """Register a plugin declaring ``section`` in this process's plugin manager, as an installed one would be."""
    plugin = types.SimpleNamespace(gradian_config_sections=gradian.hookimpl(lambda: [section]))
    get_plugins().register(plugin, "toxicity", distribution, "1.0")


@pytest.fixture
def toxicity():
    register_section(ConfigSection(name="toxicity", summary="Thresholds of the toxicity check.",
                                   settings=ToxicitySettings, aliases=("toxic",)))


def test_a_plugin_section_has_its_defaults_and_is_read_like_a_core_section(toxicity):
    config = GradianConfig()
    assert config.toxicity == ToxicitySettings() and config.toxicity.max_share == 0.01
    assert config.to_dict()["toxicity"] == {"max_share": 0.01, "lexicon": "default"}
    assert list(config.to_dict())[:4] == ["grads", "evaluation", "attribution", "train"]  # the core's first
    assert section_owner("toxicity") == "gradian-checks-toxicity" and section_owner("grads") == "gradian-core"


def test_a_plugin_key_is_set_from_yaml_and_set(toxicity, tmp_path):
    path = tmp_path / "gradian.yaml"
    path.write_text("toxicity:\n  lexicon: strict\n  max_share: 0.5\n", encoding="utf-8")
    config = load_config(path, ["toxicity.max_share=0.2"])
    assert (config.toxicity.lexicon, config.toxicity.max_share) == ("strict", 0.2)
    assert build_config(config.to_dict()) == config
    assert config.section_hash("toxicity") != GradianConfig().section_hash("toxicity")
    replaced = config.replace(toxicity=dataclasses.replace(config.toxicity, lexicon="default"))
    assert replaced.toxicity.lexicon == "default" and replaced.toxicity.max_share == 0.2


@pytest.mark.parametrize(("override", "needle"), [
    ("toxicity.max_share=2", "toxicity.max_share must be a number in [0.0, 1.0]"),
    ("toxicity.lexicon=loose", "toxicity.lexicon must be one of default, strict"),
    ("toxicity.max_shar=0.1", "did you mean toxicity.max_share?"),
    ("toxic.max_share=0.1", "did you mean toxicity.max_share?"),  # the alias the plugin declared
])
def test_a_bad_plugin_key_or_value_is_one_line_naming_it(toxicity, override, needle):
    with pytest.raises(ConfigError) as caught:
        load_config(None, [override])
    assert needle in caught.value.one_line()


def test_config_list_shows_the_plugin_keys_with_their_owner(toxicity, capsys):
    assert main(["config", "--list", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    keys = {k["key"]: k for k in listed["keys"]}
    assert keys["toxicity.max_share"]["owner"] == "gradian-checks-toxicity"
    assert keys["toxicity.lexicon"]["allowed"] == "one of default, strict"
    assert keys["grads.batch_size"]["owner"] == "gradian-core"
    assert {"section": "toxicity", "owner": "gradian-checks-toxicity",
            "summary": "Thresholds of the toxicity check."} in listed["sections"]
    assert main(["config", "--list"]) == 0
    text = capsys.readouterr().out
    assert "[toxicity] from gradian-checks-toxicity: Thresholds of the toxicity check." in text
    assert "toxicity.max_share = 0.01  [a number in [0.0, 1.0]]" in text
    assert main(["config", "--list", "--format", "md"]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("| key | default | allowed | help | owner |")
    assert "| toxicity.lexicon | 'default' | one of default, strict | word list the check matches | gradian-checks-toxicity |" in markdown


def test_the_cli_sets_a_plugin_key_and_refuses_a_bad_one_in_one_line(toxicity, capsys):
    assert main(["config", "--format", "json", "--set", "toxicity.lexicon=strict"]) == 0
    assert json.loads(capsys.readouterr().out)["toxicity"] == {"max_share": 0.01, "lexicon": "strict"}
    assert main(["config", "--set", "toxicity.max_share=lots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "toxicity.max_share must be a number in [0.0, 1.0]" in err


def test_a_section_named_like_a_core_section_is_refused_naming_both_distributions():
    @dataclass(frozen=True)
    class Grads:
        batch_size: int = option(8, "a look-alike")

    register_section(ConfigSection(name="grads", summary="clash", settings=Grads), "gradian-grads-fake")
    with pytest.raises(PluginError) as caught:
        GradianConfig()
    assert "gradian-core" in caught.value.one_line() and "gradian-grads-fake" in caught.value.one_line()


def test_a_malformed_section_fails_its_plugin_alone():
    @dataclass
    class NotFrozen:
        limit: int = option(1, "mutable settings")

    def bad():
        yield ConfigSection(name="broken", summary="not frozen", settings=NotFrozen)

    get_plugins().register(types.SimpleNamespace(gradian_config_sections=gradian.hookimpl(bad)), "broken", "gradian-broken")
    config = GradianConfig()  # the config still builds, without the broken section
    assert "broken" not in config.to_dict()
    failure = next(info for info in get_plugins().infos() if info.status == "failed")
    assert failure.distribution == "gradian-broken" and "not a frozen dataclass" in failure.error
