"""The hf training backend for `gradian train`."""
