"""`gradian diagnose`: the audit context and runner, findings rendering and plots (run dirs are read by gradian.runs).

The checks themselves are plugins (gradian-checks registers the built-in ones, docs/checks.md); this package only
loads the inputs, runs whatever checks are registered, and renders what they find.
"""
