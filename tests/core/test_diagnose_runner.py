"""The diagnose runner: needs gate the checks, a crashing check is reported (not fatal), findings kept as given."""

from __future__ import annotations

import json
import types

import pytest

import gradian
from gradian.config import load_config
from gradian.diagnose.findings import to_json
from gradian.diagnose.runner import diagnose, exit_code, resolve_selection
from gradian.errors import ConfigError, ModelError
from gradian.plugins import load_plugins
from gradian.records import AuditCheck, Evidence, Finding


def plugin_with(*checks):
    plugins = load_plugins(autoload=False)
    plugins.register(types.SimpleNamespace(gradian_audit_checks=gradian.hookimpl(lambda: list(checks))), "test-checks", "test-dist")
    return plugins


def check(check_id, run, needs=("dataset",), family="data", severity="warning"):
    return AuditCheck(id=check_id, family=family, severity=severity, summary=check_id, fix="fix it", needs=frozenset(needs), run=run)


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "completion": f"a{i}"}) + "\n" for i in range(30)))
    return path


def many_findings(ctx):
    yield Finding("many", "warning", "one per row", "fix", tuple(Evidence(f"row {e.index}", location=e.location) for e in ctx.examples))


def crash(ctx):
    raise ZeroDivisionError("bug in a check")


def user_error(ctx):
    raise ModelError("the model does not load", "pass another --base-model")


def test_a_crashing_check_is_reported_and_the_others_still_run(dataset):
    report = diagnose(dataset=dataset, plugins=plugin_with(check("crashes", crash), check("many", many_findings)))
    assert [f.id for f in report.failed] == ["crashes"] and "ZeroDivisionError: bug in a check" in report.failed[0].error
    assert report.ran == ("many",)
    assert exit_code(report, "error") == 1 and exit_code(report, "never") == 0


def test_a_user_error_inside_a_check_is_a_user_error(dataset):
    with pytest.raises(ModelError):
        diagnose(dataset=dataset, plugins=plugin_with(check("raises", user_error)))


def test_unmet_needs_skip_with_the_flag_to_pass(dataset):
    plugins = plugin_with(check("many", many_findings), check("logs", many_findings, needs=("run_logs",), family="dynamics"))
    report = diagnose(dataset=dataset, plugins=plugins)
    assert report.ran == ("many",)
    assert [(s.id, s.missing) for s in report.skipped] == [("logs", ("run_logs",))]
    assert "--run" in report.skipped[0].reason()


def test_a_plugins_evidence_is_reported_as_it_gave_it(dataset):
    # Capping is the plugin's own setting (gradian-checks' diagnose.max_evidence, tests/checks/test_settings.py).
    config = load_config(None, ["diagnose.max_evidence=5"])
    finding = diagnose(dataset=dataset, config=config, plugins=plugin_with(check("many", many_findings))).findings[0]
    assert len(finding.evidence) == 30


def test_selection_by_id_family_and_comma_lists():
    checks = {c.id: c for c in (check("a", crash), check("b", crash, family="config"), check("c", crash, family="config"))}
    assert [c.id for c in resolve_selection(checks, ["config"])] == ["b", "c"]
    assert [c.id for c in resolve_selection(checks, ["a,b"], ["b"])] == ["a"]
    assert [c.id for c in resolve_selection(checks, [], ["data"])] == ["b", "c"]
    with pytest.raises(ConfigError, match="neither a check id nor a family"):
        resolve_selection(checks, ["dynamic"])


def test_exit_codes_follow_the_worst_severity(dataset):
    def info(ctx):
        yield Finding("info_only", "info", "fyi", "nothing")

    report = diagnose(dataset=dataset, plugins=plugin_with(check("info_only", info, severity="info")))
    assert exit_code(report, "warning") == 0 and exit_code(report, "error") == 0
    report = diagnose(dataset=dataset, plugins=plugin_with(check("many", many_findings)))
    assert exit_code(report, "warning") == 1 and exit_code(report, "error") == 0


def test_reports_are_deterministic(tmp_path):
    from tests.checks.run_fixtures import faulty_rows, write_jsonl

    path = write_jsonl(tmp_path / "faulty.jsonl", faulty_rows())

    def stable():
        data = to_json(diagnose(dataset=path))
        data["summary"].pop("seconds")
        data.pop("timings")
        return data

    assert stable() == stable()
