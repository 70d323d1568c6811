"""docs/checks.md is the registered checks as they are: regenerate it when a check changes."""

from __future__ import annotations

from pathlib import Path

from gradian.diagnose.catalog import checks_markdown
from gradian.plugins import load_plugins

DOC = Path(__file__).resolve().parents[2] / "docs" / "checks.md"


def test_docs_checks_md_is_current():
    plugins = load_plugins()
    assert DOC.read_text(encoding="utf-8") == checks_markdown(plugins), (
        "docs/checks.md is out of date: run `.venv/bin/python -m gradian.diagnose.catalog > docs/checks.md`")


def test_every_check_and_reader_is_listed_once():
    plugins = load_plugins()
    text = checks_markdown(plugins)
    for check_id in plugins.audit_checks():
        assert text.count(f"| `{check_id}` |") == 1, check_id
    for name in plugins.run_log_readers():
        assert text.count(f"| `{name}` |") == 1, name
    assert f"runs {len(plugins.audit_checks())} checks" in text
