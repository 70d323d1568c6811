"""What the run that trained an adapter trained on: its tokenizer and chat template, and its loss mask.

The tokenizer (and with it the chat template) is the first found of: the adapter dir, the run's checkpoints
(newest first), the base model. ``tokenizer_config.json`` marks a saved tokenizer; a ``chat_template.jinja`` (or
a ``chat_template`` in a ``tokenizer_config.json``) saved without the rest of the tokenizer replaces only the
template. The run is the one the adapter sits in: the adapter dir itself (``save_model`` writes the adapter next
to ``training_args.bin``), the parent of a ``checkpoint-N`` adapter, or ``gradian train``'s sibling ``run/``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gradian.data.loss_mask import LossMaskChoice, resolve_loss_mask, resolve_pair_rendering
from gradian.errors import RunDirError
from gradian.file_names import TRAINER_STATE, TRAINING_ARGS
from gradian.runs import read_run
from gradian.runs.hf_trainer import checkpoints

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from gradian.config import GradianConfig
    from gradian.data.examples import Example
    from gradian.records import RunArtifact

logger = logging.getLogger(__name__)

TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class TokenizerChoice:
    """Where the tokenizer and its chat template come from (``template_source`` None: the tokenizer's own)."""

    tokenizer_source: str
    template_source: str | None = None

    @property
    def description(self) -> str:
        """One line naming the sources, for findings and the index manifest."""
        if self.template_source is None:
            return f"tokenizer and chat template from {self.tokenizer_source}"
        return f"tokenizer from {self.tokenizer_source}, chat template from {self.template_source}"


def run_dir_of_adapter(adapter_dir: Path | str | None) -> Path | None:
    """The training run an adapter dir belongs to, when its layout shows one."""
    if adapter_dir is None:
        return None
    adapter_dir = Path(adapter_dir)
    candidates = [adapter_dir]
    if _CHECKPOINT.match(adapter_dir.name):
        candidates.append(adapter_dir.parent)
    candidates.append(adapter_dir.parent / "run")  # gradian train: out/adapter beside out/run
    markers = (TRAINER_STATE, TRAINING_ARGS, "training_args.yaml", "trainer_log.jsonl", "run.json")
    for candidate in candidates:
        if candidate.is_dir() and any((candidate / name).is_file() for name in markers):
            return candidate
    return None


def read_run_of_adapter(adapter_dir: Path | str | None) -> RunArtifact | None:
    """The RunArtifact of the run an adapter belongs to, or None (no run there, or one no reader understands)."""
    run_dir = run_dir_of_adapter(adapter_dir)
    if run_dir is None:
        return None
    try:
        return read_run(run_dir)
    except RunDirError as error:  # auto then falls back to the default mask; diagnose --run reports the error
        logger.info("not following the run at %s: %s", run_dir, error.one_line())
        return None


def run_formats(examples: Iterable[Example]) -> set[str]:
    """The row formats of a dataset (TRL's mask depends on whether its rows are prompt/completion)."""
    return {getattr(example, "format", "messages") for example in examples}


def loss_mask_for(setting: str, run: RunArtifact | None, examples: Sequence[Example]) -> LossMaskChoice:
    """``grads.loss_mask`` made concrete: ``auto`` follows ``run`` (a RunArtifact or None)."""
    if run is None:
        return resolve_loss_mask(setting)
    source = run.sources.get("loss_mask") or run.sources.get("framework")
    return resolve_loss_mask(setting, run.config, run_formats(examples), source)


def with_loss_mask(config: GradianConfig, run: RunArtifact | None,
                   examples: Sequence[Example]) -> tuple[GradianConfig, LossMaskChoice]:
    """``config`` with ``grads.loss_mask`` and ``grads.string_pairs`` made concrete from ``run``, and the mask choice."""
    choice = loss_mask_for(config.grads.loss_mask, run, examples)
    pairs = resolve_pair_rendering(config.grads.string_pairs, run.config if run is not None else None)
    return config.replace(grads=dataclasses.replace(config.grads, loss_mask=choice.mode, string_pairs=pairs)), choice


def checkpoint_dirs(run_dir: Path | None) -> list[Path]:
    """A run's checkpoint-N dirs, newest first."""
    if run_dir is None or not run_dir.is_dir():
        return []
    return list(reversed(checkpoints(run_dir)))


def tokenizer_dirs(adapter_dir: Path | str | None, run_dir: Path | str | None = None) -> list[Path]:
    """Where a saved tokenizer is looked for, in order: the adapter dir, the run dir, its checkpoints (newest first)."""
    dirs: list[Path] = []
    run = Path(run_dir) if run_dir is not None else run_dir_of_adapter(adapter_dir)
    for candidate in ([Path(adapter_dir)] if adapter_dir is not None else []) + ([run] if run else []) \
            + checkpoint_dirs(run):
        if candidate not in dirs and candidate.is_dir():
            dirs.append(candidate)
    return dirs


def saved_template(directory: Path) -> tuple[str, Path] | None:
    """The chat template saved in ``directory`` (chat_template.jinja, else tokenizer_config.json) and its file."""
    jinja = directory / CHAT_TEMPLATE_FILE
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), jinja
    config = directory / TOKENIZER_CONFIG
    try:
        data = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else None
    except (OSError, ValueError):
        return None
    template = data.get("chat_template") if isinstance(data, dict) else None
    return (template, config) if isinstance(template, str) and template else None


def find_saved_tokenizer(dirs: Sequence[Path]) -> Path | None:
    """The first dir holding a whole saved tokenizer (tokenizer_config.json with tokenizer.json)."""
    return next((d for d in dirs if (d / TOKENIZER_CONFIG).is_file() and (d / "tokenizer.json").is_file()), None)


def find_saved_template(dirs: Sequence[Path]) -> tuple[str, Path] | None:
    """The first chat template saved in ``dirs``."""
    return next((found for d in dirs if (found := saved_template(d)) is not None), None)


def apply_saved_files(tokenizer: PreTrainedTokenizerBase, base_source: str, dirs: Sequence[Path],
                      load: Callable[[Path], PreTrainedTokenizerBase]
                      ) -> tuple[PreTrainedTokenizerBase, TokenizerChoice]:
    """The tokenizer the run saved (``load(path)`` loads one), else ``tokenizer``; then the run's chat template."""
    source = base_source
    saved = find_saved_tokenizer(dirs)
    if saved is not None:
        tokenizer, source = load(saved), str(saved)
    template = find_saved_template(dirs)
    if template is None or template[0] == getattr(tokenizer, "chat_template", None):
        return tokenizer, TokenizerChoice(source)
    tokenizer.chat_template = template[0]
    return tokenizer, TokenizerChoice(source, str(template[1]))
