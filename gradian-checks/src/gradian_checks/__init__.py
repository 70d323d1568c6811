"""Gradian's built-in audit checks (CHECKS.md), registered through the gradian_audit_checks hook."""
