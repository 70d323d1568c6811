"""Base models: resolve a ``--base-model`` name to a local directory and load it, never touching the network.

A name is the embedded alias (``smollm2-135m-instruct``), a local directory with ``config.json``,
or a Hugging Face id already in the local HF cache. Everything is loaded with
``local_files_only=True``, so a missing model is an immediate error instead of a hang on a
machine without network, and ``trust_remote_code`` is off unless the caller passes it.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from gradian.errors import ModelError
from gradian.model import embedded
from gradian.model.adapter_dir import inspect_adapter_dir
from gradian.model.placement import resolve_placement
from gradian.model.quantized import refuse_quantized_base
from gradian.user_files import absent

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Hugging Face repo ids: "name" or "namespace/name" of letters, digits, "-", "_" and ".".
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?$")
_NAME_HINT = (
    "pass a directory written by save_pretrained (with config.json), an id already in the local "
    f"Hugging Face cache, or the embedded model: --base-model {embedded.EMBEDDED_ALIAS}"
)

logger = logging.getLogger(__name__)


def resolve_base_model(name: str | os.PathLike[str], *, progress: bool = True) -> Path:
    """The local directory a base-model name refers to; ModelError when there is none."""
    text = os.fspath(name).strip()
    if not text:
        raise ModelError("the base model name is empty", _NAME_HINT)
    if embedded.is_embedded_alias(text):
        return embedded.ensure_cached(progress=progress)
    path = Path(text).expanduser()
    if path.exists():
        return _model_directory(path)
    if _looks_like_path(text) or path.is_symlink():  # a link that leads nowhere is a path, not a hub id
        raise ModelError(f"base model directory {text} {absent(path)}", _NAME_HINT)
    snapshot = hub_cache_snapshot(text)
    if snapshot is not None:
        return snapshot
    if embedded.is_embedded_hub_id(text):
        return embedded.ensure_cached(progress=progress)  # the same model, from the embedded GGUF
    raise ModelError(
        f"base model {text!r} is neither a local directory nor in the local Hugging Face cache "
        f"({_hub_cache_root()}); Gradian never downloads",
        _NAME_HINT,
    )


def base_model_named_by(adapter: str | os.PathLike[str]) -> str | None:
    """The base model an adapter's adapter_config.json names (base_model_name_or_path), or None."""
    # allow_pickle only lets the check pass a .bin adapter; loading it is still refused later unless allowed.
    named = inspect_adapter_dir(adapter, allow_pickle=True, warn=False).trained_on
    return named.strip() if isinstance(named, str) and named.strip() else None


def base_model_for(base_model: str | None, adapter: str | os.PathLike[str], command: str) -> str:
    """``--base-model`` when given, else the base the adapter names when it is on this machine; ModelError if not."""
    if base_model is not None and str(base_model).strip():
        return str(base_model)
    named = base_model_named_by(adapter)
    if named is None:
        raise ModelError(f"gradian {command} needs --base-model: the adapter's adapter_config.json names no base model",
                         "pass --base-model, the base model the adapter was trained from")
    try:
        resolve_base_model(named)
    except ModelError as error:
        raise ModelError(
            f"no --base-model given, and the base model the adapter names ({named}, adapter_config.json "
            f"base_model_name_or_path) is not on this machine: {error.message}",
            "pass --base-model with a local copy of that base model (a directory with config.json, or an id in "
            "the local Hugging Face cache)",
        ) from None
    return named


def local_base_model_named_by(adapter: str | os.PathLike[str]) -> str | None:
    """The base model an adapter names when it resolves on this machine, else None (for commands where it is optional)."""
    try:
        named = base_model_named_by(adapter)
        if named is not None:
            resolve_base_model(named, progress=False)
        return named
    except ModelError:
        return None


def _model_directory(path: Path) -> Path:
    """An existing path must be a model directory with config.json."""
    if not path.is_dir():
        raise ModelError(f"base model {path} is a file, not a model directory", _NAME_HINT)
    if not (path / "config.json").is_file():
        raise ModelError(
            f"base model directory {path} has no config.json",
            "point --base-model at the directory save_pretrained wrote (the one holding config.json)",
        )
    return path.resolve()


def _looks_like_path(text: str) -> bool:
    """Names that can only be paths: absolute, home- or dot-relative, or more than one slash deep."""
    return text.startswith(("/", "~", ".")) or "\\" in text or not _HUB_ID.match(text)


def _hub_cache_root() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def hub_cache_snapshot(repo_id: str) -> Path | None:
    """The snapshot dir of ``repo_id`` in the local HF cache (main revision), or None; never networked."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def load_tokenizer(name: str | os.PathLike[str], *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of a base model, with a pad token guaranteed (in memory only)."""
    return _load_tokenizer_from(resolve_base_model(name), trust_remote_code=trust_remote_code)


def load_base_model(
    name: str | os.PathLike[str],
    *,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    device: str = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base model (eval mode, on ``device``, in ``dtype``; either may be ``auto``) and its tokenizer."""
    from transformers import AutoModelForCausalLM

    placement = resolve_placement(device, dtype)  # a bad device or dtype fails before the model is read
    path = resolve_base_model(name)
    refuse_quantized_base(path, os.fspath(name))  # a 4-bit checkpoint: name the unquantized base instead
    tokenizer = _load_tokenizer_from(path, trust_remote_code=trust_remote_code)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=placement.torch_dtype, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, KeyError, ImportError) as error:
        raise _load_error("model", path, error) from error
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id  # silences generate()'s warning
    model.to(placement.torch_device)
    model.eval()
    return model, tokenizer


def _load_tokenizer_from(path: Path, *, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, ImportError) as error:
        raise _load_error("tokenizer", path, error) from error
    ensure_pad_token(tokenizer, source=str(path))
    return tokenizer


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase, *, source: str = "the tokenizer") -> None:
    """Give a tokenizer without a pad token its eos token for padding; the files on disk stay untouched."""
    if tokenizer.pad_token is not None:
        return
    if tokenizer.eos_token is None:
        raise ModelError(
            f"the tokenizer of {source} has neither a pad token nor an eos token, so batches cannot be padded",
            "set pad_token in the model's tokenizer_config.json",
        )
    tokenizer.pad_token = tokenizer.eos_token
    logger.info("%s has no pad token; padding with its eos token %r (in memory only)", source, tokenizer.eos_token)


def _load_error(what: str, path: Path, error: BaseException) -> ModelError:
    """One line from a transformers load failure, with the fix when it is a known one."""
    detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if "trust_remote_code" in str(error):
        return ModelError(
            f"the {what} at {path} ships its own Python code, which Gradian does not run by default",
            "pass --trust-remote-code if you trust that code",
        )
    return ModelError(f"could not load the {what} at {path}: {detail}",
                      "check that the directory is complete (weights, tokenizer files) and readable")
