"""The diagnose section is gradian-checks' own: declared by its plugin, read as config.diagnose, named by no core
module, and a clear one-line error when gradian-checks is not loaded."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import pytest

from gradian.cli.app import main
from gradian.config import GradianConfig, load_config, section_owner
from gradian.counterfactual.check_config import layered_config
from gradian.errors import ConfigError
from gradian.plugins import reset_plugins
from gradian.records import Evidence
from gradian_checks.registry import CheckFamily, Hit
from gradian_checks.settings import DiagnoseConfig

CORE_SRC = Path(__file__).resolve().parents[2] / "gradian-core" / "src" / "gradian"


def test_the_diagnose_section_comes_from_gradian_checks():
    config = load_config(None, ["diagnose.lr_warn=1e-4"])
    assert isinstance(config.diagnose, DiagnoseConfig) and config.diagnose.lr_warn == 1e-4
    assert GradianConfig().diagnose == DiagnoseConfig()
    assert section_owner("diagnose") == "gradian-checks"


def test_config_list_names_gradian_checks_as_the_owner_of_every_diagnose_key(capsys):
    assert main(["config", "--list", "--format", "json"]) == 0
    keys = json.loads(capsys.readouterr().out)["keys"]
    owners = {k["owner"] for k in keys if k["key"].startswith("diagnose.")}
    assert owners == {"gradian-checks"}
    assert {k["key"] for k in keys if k["key"].startswith("diagnose.")} == {
        f"diagnose.{f.name}" for f in dataclasses.fields(DiagnoseConfig)}


def test_no_core_module_names_the_diagnose_settings_or_a_threshold():
    config_py = (CORE_SRC / "config.py").read_text(encoding="utf-8")
    for field in dataclasses.fields(DiagnoseConfig):
        assert field.name not in config_py, field.name
    for path in CORE_SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "DiagnoseConfig" not in text and ".thresholds" not in text and "config.diagnose" not in text, path


@pytest.mark.parametrize("alias", ["diagnostics", "audit"])
def test_the_names_other_tools_use_point_at_diagnose(alias):
    with pytest.raises(ConfigError) as caught:
        load_config(None, [f"{alias}.lr_warn=1e-4"])
    assert "did you mean diagnose.lr_warn?" in caught.value.one_line()


def test_a_diagnose_section_without_gradian_checks_is_one_line_naming_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIAN_DISABLE_PLUGIN_AUTOLOAD", "1")  # the built-ins alone: as if gradian-checks were absent
    path = tmp_path / "gradian.yaml"
    path.write_text("diagnose:\n  lr_warn: 1.0e-4\n", encoding="utf-8")
    for argv in (["config", "--config", str(path)], ["config", "--set", "diagnose.lr_warn=1e-4"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "belongs to gradian-checks, which is not installed" in err
        assert "pip install gradian-checks" in err
    assert "diagnose" not in GradianConfig().to_dict()


def test_a_report_config_keeps_working_where_gradian_checks_is_not_loaded(monkeypatch):
    written = GradianConfig().to_dict()  # what a report holds when gradian-checks was installed
    monkeypatch.setenv("GRADIAN_DISABLE_PLUGIN_AUTOLOAD", "1")
    reset_plugins()  # the next use loads the built-ins alone
    config = layered_config(written, overrides=["train.seed=3"])
    assert config.train.seed == 3 and "diagnose" not in config.to_dict()


def test_a_finding_keeps_diagnose_max_evidence_items_and_counts_the_rest():
    family = CheckFamily("data")

    @family.check("every_row", "warning", "one item per row", "fix it", needs={"dataset"})
    def every_row(ctx):
        yield Hit("all 30 rows", tuple(Evidence(f"row {i}") for i in range(30)))

    ctx = types.SimpleNamespace(config=load_config(None, ["diagnose.max_evidence=5"]))
    finding = next(iter(family.checks[0].run(ctx)))
    assert len(finding.evidence) == 6 and finding.evidence[-1].text == "... and 25 more"
    assert finding.evidence[-1].values == {"omitted": 25}
