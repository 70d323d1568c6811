"""Errors a user can cause: one line that says what is wrong, and a hint that says how to fix it."""

from __future__ import annotations


class GradianError(Exception):
    """A problem with the user's input or environment; the CLI prints it on one line and exits 2."""

    exit_code = 2

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        """The message and the hint as the single line the CLI prints."""
        text = " ".join(self.message.split())
        if self.hint:
            text += f" (hint: {' '.join(self.hint.split())})"
        return text


class ConfigError(GradianError):
    """An unknown config key, a wrong type or an out-of-range value."""


class DatasetError(GradianError):
    """A dataset file or row that cannot be read as any supported format."""


class ModelError(GradianError):
    """A base model, adapter or tokenizer that cannot be found or loaded."""


class DeviceError(ModelError):
    """A device or dtype this machine cannot run a model on (--device, --dtype)."""


class PluginError(GradianError):
    """Two plugins that clash, or a plugin asked for that is not installed."""


class RunDirError(GradianError):
    """A run directory that no reader understands, or whose files are broken."""


class GradientIndexError(GradianError):
    """A gradient index that is missing, corrupt, or built from other inputs."""


class EvaluationError(GradianError):
    """An eval set or metric that cannot produce a capability measurement."""


class TrainingError(GradianError):
    """A training backend that is unavailable or a training job that cannot run."""


class ReportError(GradianError):
    """A report directory or report.json that cannot be read: missing, not JSON, a newer schema, a field missing."""
