"""Every audit check fires on an input built to trigger it and stays quiet on a healthy input or a near miss."""

from __future__ import annotations

from typing import Any

import pytest

from gradian.config import load_config
from gradian.diagnose.runner import diagnose
from gradian.plugins import get_plugins
from tests.checks.check_cases import FIRE, FIRE_VARIANTS, QUIET, CaseEnv, healthy


def _run(env: CaseEnv, check_id: str, inputs: dict[str, Any]):
    inputs = dict(inputs)
    config = load_config(None, inputs.pop("set", ()))
    report = diagnose(config=config, select=[check_id], **inputs)
    assert check_id in report.ran, f"{check_id} did not run: skipped {report.skipped}, failed {report.failed}"
    assert not report.failed, report.failed
    return [f for f in report.findings if f.check_id == check_id]


def test_every_registered_check_has_a_firing_and_a_quiet_case():
    checks = get_plugins().audit_checks()
    assert len(checks) == 44
    assert set(FIRE) == set(checks)
    assert {key.split("/")[0] for key in FIRE_VARIANTS} <= set(checks)
    assert set(QUIET) <= set(checks)


@pytest.mark.parametrize("case", sorted(FIRE) + sorted(FIRE_VARIANTS))
def test_check_fires(case, case_env):
    check_id = case.split("/")[0]
    build, severity = FIRE[case] if case in FIRE else FIRE_VARIANTS[case]
    findings = _run(case_env, check_id, build(case_env))
    assert findings, f"{check_id} stayed quiet on its firing input"
    assert {f.severity for f in findings} == {severity}
    for finding in findings:
        assert finding.message and finding.fix
    # Evidence points somewhere a user can look (a file:line, an example id, a step, or a value).
    assert any(e.location or e.example_ids or e.steps or e.values for f in findings for e in f.evidence)


@pytest.mark.parametrize("check_id", sorted(FIRE))
def test_check_stays_quiet(check_id, case_env):
    build = QUIET.get(check_id, healthy)
    assert _run(case_env, check_id, build(case_env)) == []
