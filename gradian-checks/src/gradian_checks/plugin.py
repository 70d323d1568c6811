"""Entry point of gradian-checks: yields the built-in audit check records."""

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


@gradian.hookimpl
def gradian_audit_checks():
    """The built-in audit checks, family by family."""
    from gradian.records import load_object

    return [check for target in CHECK_FAMILIES for check in load_object(target)]
