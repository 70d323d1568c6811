"""The config a check runs with: a base (the report's own config), a run's train section, --config, --set."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gradian.config import GradianConfig, build_config, load_config, parse_override, sections
from gradian.errors import ConfigError, RunDirError
from gradian.training.output import CONFIG_FILE
from gradian.user_files import load_yaml


def layered_config(base: Mapping[str, Any] | None = None, *, train_section: Mapping[str, Any] | None = None,
                   config_path: Path | None = None, overrides: Sequence[str] = ()) -> GradianConfig:
    """``base`` sections, then ``train_section`` as the train section, then the YAML file's keys, then ``--set``."""
    # A report written where a plugin not loaded here was installed holds its section: irrelevant to a retrain, so left out
    # rather than refused. The user's own file and --set still name every section they set.
    declared = sections()
    data: dict[str, Any] = {name: dict(values) for name, values in copy.deepcopy(dict(base or {})).items()
                            if isinstance(values, dict) and name in declared}
    if train_section is not None:
        data["train"] = dict(train_section)
    if config_path is not None:
        load_config(config_path)  # its own one-line errors: missing file, bad YAML, unknown key, bad value
        document = load_yaml(Path(config_path), "config file", ConfigError) or {}
        for name, values in document.items():
            data.setdefault(name, {}).update(values or {})
    for text in overrides:  # an unknown section or key is build_config's error, naming it
        section, name, value = parse_override(text)
        data.setdefault(section, {})[name] = value
    return build_config(data)


def run_train_section(run_dir: Path | None) -> tuple[dict[str, Any] | None, Path | None]:
    """The train section `gradian train` recorded in a run dir (gradian-train.yaml), and its path; else (None, None)."""
    if run_dir is None:
        return None, None
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None, None
    try:
        document = load_yaml(path, "gradian train config", RunDirError)
    except RunDirError:
        return None, None  # not ours to repair: the report's config stands
    section = document.get("train") if isinstance(document, dict) else None
    return (dict(section), path) if isinstance(section, dict) else (None, None)
