"""Read a PEFT adapter dir without torch: adapter_config.json and the safetensors header (JSON).

Tensor values are read only when a check asks for them, straight from the file with numpy.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradian.errors import ModelError
from gradian.file_names import ADAPTER_CONFIG, ADAPTER_PICKLE, ADAPTER_SAFETENSORS
from gradian.user_files import absent, load_json

# safetensors dtype -> (numpy dtype name, bytes per element); BF16 is widened to float32 by hand.
DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2),
    "I64": ("<i8", 8), "I32": ("<i4", 4), "I16": ("<i2", 2), "I8": ("i1", 1), "U8": ("u1", 1), "BOOL": ("?", 1),
}
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file: dtype, shape and byte range in the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True)
class AdapterInfo:
    """A PEFT adapter dir as diagnose sees it: its config and its tensors' headers."""

    path: Path
    config: Mapping[str, Any]
    weights: Path
    tensors: Mapping[str, TensorInfo] = field(default_factory=dict)
    data_offset: int = 0

    def lora_b_names(self) -> list[str]:
        """Names of the LoRA B matrices."""
        return sorted(name for name in self.tensors if ".lora_B." in name or name.endswith("lora_B.weight"))

    def tensor(self, name: str, data: np.memmap | None = None) -> np.ndarray:
        """One tensor's values as a float64 numpy array, read from the file (``data``: an open memmap of it)."""
        if data is None:
            data = np.memmap(self.weights, dtype=np.uint8, mode="r")
        info = self.tensors[name]
        dtype, itemsize = DTYPES[info.dtype]
        values = np.frombuffer(data, dtype=dtype, count=(info.end - info.start) // itemsize,
                               offset=self.data_offset + info.start)  # a view of the mapped file, no copy
        if info.dtype == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        return values.astype(np.float64).reshape(info.shape)

    def norms(self, names: list[str]) -> dict[str, float]:
        """Frobenius norms of several tensors, reading the file once."""
        data = np.memmap(self.weights, dtype=np.uint8, mode="r")
        norms = {}
        for name in names:
            values = self.tensor(name, data).ravel()
            # Elementwise, not BLAS dot: small vectors, and BLAS threads only contend on a busy machine.
            norms[name] = float(np.sqrt(np.square(values).sum()))
        return norms

    def norm(self, name: str) -> float:
        """Frobenius norm of one tensor."""
        return self.norms([name])[name]


def read_safetensors_header(path: Path) -> tuple[dict[str, TensorInfo], int]:
    """Tensor headers of a safetensors file and where its data starts; a corrupt header is a ModelError."""
    hint = "the adapter weights are truncated or not safetensors; save the adapter again with save_pretrained()"
    size = path.stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise ModelError(f"{path}: corrupt safetensors header (file is {size} bytes)", hint)
        (length,) = struct.unpack("<Q", prefix)
        if length > min(size - 8, MAX_HEADER_BYTES):
            raise ModelError(f"{path}: corrupt safetensors header (header length {length} exceeds the file)", hint)
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ModelError(f"{path}: corrupt safetensors header ({type(error).__name__})", hint) from None
    if not isinstance(header, dict):
        raise ModelError(f"{path}: corrupt safetensors header (not a JSON object)", hint)
    data_size = size - 8 - length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
            itemsize = DTYPES[dtype][1]
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{path}: corrupt safetensors header (entry {name!r})", hint) from None
        if not (0 <= start <= end <= data_size) or end - start != math.prod(shape) * itemsize:
            raise ModelError(f"{path}: corrupt safetensors header ({name!r} points outside the file)", hint)
        tensors[name] = TensorInfo(name, dtype, shape, int(start), int(end))
    return tensors, 8 + length


def read_adapter(path: Path) -> AdapterInfo:
    """Read an adapter dir's config and weight headers; missing or corrupt files are ModelErrors."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ModelError(f"--adapter {path} is a file, not an adapter directory",
                         "pass the directory peft's save_pretrained() wrote to --adapter")
    if not path.is_dir():
        raise ModelError(f"adapter directory {path} {absent(path)}", "pass the directory peft's save_pretrained() wrote to --adapter")
    config_path = path / ADAPTER_CONFIG
    if not config_path.exists() and not config_path.is_symlink():
        raise ModelError(f"{path} has no {ADAPTER_CONFIG}", "--adapter takes a PEFT adapter directory")
    config = load_json(config_path, ADAPTER_CONFIG, ModelError, hint="restore adapter_config.json from a checkpoint")
    if not isinstance(config, dict):
        raise ModelError(f"{config_path}:1: not a JSON object", "adapter_config.json is the object peft writes")
    weights = path / ADAPTER_SAFETENSORS
    if not weights.is_file():
        if (path / ADAPTER_PICKLE).is_file():
            raise ModelError(f"{path} has only {ADAPTER_PICKLE} (a pickle); diagnose reads safetensors only",
                             "re-save the adapter with save_pretrained(safe_serialization=True)")
        raise ModelError(f"{path} has no {ADAPTER_SAFETENSORS}", "the adapter weights are missing; save the adapter again")
    tensors, offset = read_safetensors_header(weights)
    return AdapterInfo(path=path, config=config, weights=weights, tensors=tensors, data_offset=offset)
