"""The pipelines a command runs end to end, over the engine (attribution, index, evaluation, query, report)."""
