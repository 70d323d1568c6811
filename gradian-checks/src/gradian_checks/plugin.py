"""Entry point of gradian-checks: yields the built-in audit check records and the diagnose config section."""

from __future__ import annotations

import gradian

# "module:attr" of each family's tuple of AuditCheck records, imported when checks are collected.
CHECK_FAMILIES: tuple[str, ...] = (
    "gradian_checks.data_schema:CHECKS",
    "gradian_checks.data_duplicates:CHECKS",
    "gradian_checks.data_tokens:CHECKS",
    "gradian_checks.config:CHECKS",
    "gradian_checks.fidelity:CHECKS",
    "gradian_checks.dynamics:CHECKS",
)
# "module:attr" of each config section this distribution owns (its checks read them as config.<name>).
CONFIG_SECTIONS: tuple[str, ...] = ("gradian_checks.settings:SECTION",)


@gradian.hookimpl
def gradian_audit_checks():
    """The built-in audit checks, family by family."""
    from gradian.records import load_object

    return [check for target in CHECK_FAMILIES for check in load_object(target)]


@gradian.hookimpl
def gradian_config_sections():
    """The diagnose section: the thresholds the built-in checks read."""
    from gradian.records import load_object

    return [load_object(target) for target in CONFIG_SECTIONS]
