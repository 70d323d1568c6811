"""``--run-config FILE``: the axolotl or LLaMA-Factory config a run was trained with, kept outside its run dir.

axolotl and LLaMA-Factory take their config from a YAML the user keeps anywhere (``configs/lora.yml``) and write
only the Trainer files into ``output_dir``; without that YAML, ``sample_packing``, ``train_on_inputs`` and
``cutoff_len`` are lost. The file given here is read with the run dir, by the reader of the trainer it belongs to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradian.errors import RunDirError
from gradian.records import RunArtifact
from gradian.runs import axolotl, llamafactory
from gradian.user_files import parse_json, parse_yaml, read_text

_NAMED = {"axolotl": "an axolotl", "llamafactory": "a LLaMA-Factory"}
_HINT = "pass the axolotl YAML or LLaMA-Factory training_args.yaml the run was trained with to --run-config"


@dataclass(frozen=True)
class RunConfigFile:
    """A training config given with --run-config: its path, its contents and the reader it belongs to."""

    path: Path
    data: Mapping[str, Any]
    reader: str  # "axolotl" or "llamafactory"


def _text(path: Path) -> str:
    """The file's text; RunDirError when it is missing, a directory, not a regular file, unreadable or not UTF-8."""
    return read_text(path, "--run-config", RunDirError, hint=_HINT)


def _parse(path: Path, text: str) -> Any:
    """YAML (JSON for a .json file, as LLaMA-Factory also accepts); RunDirError naming file:line when broken."""
    if path.suffix.lower() == ".json":
        return parse_json(text, path, "--run-config", RunDirError, hint=_HINT)
    return parse_yaml(text, path, "--run-config", RunDirError, hint=_HINT)


def _reader_of(data: Any) -> str | None:
    """Which trainer wrote this config, by the keys only that trainer's configs have."""
    if axolotl.looks_like_axolotl(data):
        return "axolotl"
    if llamafactory.looks_like_llamafactory(data):
        return "llamafactory"
    return None


def load_run_config(path: Path | str) -> RunConfigFile:
    """Read and recognise a --run-config file; RunDirError (one line, a hint) when it is not a usable config."""
    path = Path(path)
    data = _parse(path, _text(path))
    reader = _reader_of(data)
    if reader is None:
        raise RunDirError(
            f"--run-config {path} is neither an axolotl config (base_model with keys such as sequence_len, "
            "sample_packing, micro_batch_size) nor a LLaMA-Factory one (keys such as stage, finetuning_type, "
            "cutoff_len, lora_rank)", _HINT)
    return RunConfigFile(path=path, data=data, reader=reader)


def read_run_with_config(run_dir: Path, config: RunConfigFile, run_format: str | None = None) -> RunArtifact:
    """Read ``run_dir`` with the reader of ``config``'s trainer, taking the config from the file."""
    if run_format is not None and run_format != config.reader:
        raise RunDirError(f"--run-config {config.path} is {_NAMED[config.reader]} config, but --run-format is {run_format}",
                          f"drop --run-format, or pass --run-format {config.reader}")
    if config.reader == "axolotl":
        return axolotl.read_with_config(run_dir, config.data, config.path, 1)
    return llamafactory.read_with_config(run_dir, (config.data, config.path))
