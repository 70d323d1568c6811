"""`gradian diagnose`: run-log readers (runlog/), the audit context and runner, and findings rendering.

The checks themselves are plugins (gradian-checks registers the built-in 44); this package only
loads the inputs, runs whatever checks are registered, and renders what they find.
"""
