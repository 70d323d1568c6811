"""Training run directories as trainers leave them: the run-log readers (picked by sniff confidence or --run-format),
their checkpoints, and the chat template and loss mask the run trained with (training_format)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gradian.errors import RunDirError
from gradian.plugins import get_plugins
from gradian.records import RunArtifact, RunLogReaderSpec
from gradian.runs.run_config import load_run_config, read_run_with_config
from gradian.user_files import absent


def _confidence(reader: RunLogReaderSpec, path: Path) -> float:
    try:
        return float(reader.sniff(path))
    except Exception:  # a third-party sniff that crashes does not claim the directory
        return 0.0


def check_run_dir(path: Path) -> None:
    """RunDirError unless ``path`` is an existing directory."""
    if not path.exists():
        raise RunDirError(f"run directory {path} {absent(path)}", "pass the output_dir your trainer wrote to --run")
    if not path.is_dir():
        raise RunDirError(f"--run {path} is a file, not a directory", f"pass the directory that holds it: --run {path.parent}")


def select_reader(path: Path, readers: Mapping[str, RunLogReaderSpec], run_format: str | None = None) -> RunLogReaderSpec:
    """The reader named by ``run_format``, else the one whose sniff is most confident (ties: by name)."""
    path = Path(path)
    check_run_dir(path)
    if run_format is not None:
        if run_format not in readers:
            raise RunDirError(f"unknown --run-format {run_format!r}", f"use one of: {', '.join(sorted(readers))}")
        return readers[run_format]
    scored = sorted(((_confidence(r, path), name) for name, r in readers.items()), key=lambda s: (-s[0], s[1]))
    if not scored or scored[0][0] <= 0.0:
        looked = "; ".join(f"{name}: {', '.join(readers[name].looks_for) or 'its own files'}" for name in sorted(readers))
        raise RunDirError(
            f"no run-log reader recognises {path} (looked for {looked})",
            "point --run at your trainer's output_dir, or write run.json + metrics.jsonl (docs/run-format.md)",
        )
    return readers[scored[0][1]]


def read_run(path: Path, run_format: str | None = None, readers: Mapping[str, RunLogReaderSpec] | None = None,
             run_config: Path | None = None) -> RunArtifact:
    """Read a run directory into a RunArtifact with the selected reader, or the one of ``run_config``'s trainer."""
    if run_config is not None:
        config = load_run_config(run_config)
        check_run_dir(Path(path))
        return read_run_with_config(Path(path), config, run_format)
    if readers is None:
        readers = get_plugins().run_log_readers()
    reader = select_reader(Path(path), readers, run_format)
    artifact = reader.read(Path(path))
    if not isinstance(artifact, RunArtifact):
        raise RunDirError(f"run-log reader {reader.name!r} returned {type(artifact).__name__}, not a RunArtifact",
                          "report this to the plugin's authors")
    return artifact
