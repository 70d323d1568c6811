"""The trl training backend for `gradian train`."""
