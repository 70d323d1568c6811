"""Gradian's built-in audit checks (docs/checks.md), registered through the gradian_audit_checks hook."""
