"""The `gradian` command line: app.py wires one module per command."""
