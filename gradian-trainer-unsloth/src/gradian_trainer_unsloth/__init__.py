"""The unsloth training backend for `gradian train`."""
