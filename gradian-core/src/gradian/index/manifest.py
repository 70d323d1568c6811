"""The index manifest (``manifest.json``) and the index id.

The manifest is everything needed to read an index and to reproduce it: blocks and widths, storage
dtype and codec, projection, seed, damping, loss reduction, the hashes of the inputs, library
versions and a sha256 per shard. The index id hashes exactly the inputs that change the stored
numbers, so an identical rebuild finds the cached index and a reordered dataset does not.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from gradian.errors import GradientIndexError
from gradian.index.stats import StatBlock
from gradian.user_files import absent, load_json

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
EXAMPLES_NAME = "examples.jsonl"
STATS_NAME = "stats.npy"
# Libraries whose versions enter the index id: a different torch or peft can change the numbers.
ID_LIBRARIES = ("torch", "transformers", "peft", "gradian-core")


@dataclass(frozen=True)
class BlockInfo:
    """One stored parameter block: a LoRA module's A or B matrix and where it sits in a row."""

    module: str
    matrix: str  # "A" or "B"
    shape: tuple[int, ...]  # the parameter's shape (r x d_in or d_out x r)
    stored_shape: tuple[int, ...]  # equal to shape when exact, the sketch's shape when projected
    offset: int

    @property
    def width(self) -> int:
        """Numbers stored for this matrix in every row."""
        return math.prod(self.stored_shape)

    @property
    def name(self) -> str:
        """``<module>.lora_A`` / ``<module>.lora_B``."""
        return f"{self.module}.lora_{self.matrix}"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for the manifest."""
        return {"module": self.module, "matrix": self.matrix, "shape": list(self.shape),
                "stored_shape": list(self.stored_shape), "offset": self.offset, "width": self.width}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BlockInfo:
        """Inverse of to_dict."""
        return cls(str(data["module"]), str(data["matrix"]), tuple(int(s) for s in data["shape"]),
                   tuple(int(s) for s in data["stored_shape"]), int(data["offset"]))


@dataclass(frozen=True)
class ShardInfo:
    """One finished shard: its rows and the sha256 of its data and statistics files."""

    number: int
    file: str
    start: int
    rows: int
    bytes: int  # size of the data file, checked on open (a truncated shard fails fast)
    sha256: str
    stats_file: str
    stats_sha256: str

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for the manifest."""
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardInfo:
        """Inverse of to_dict."""
        return cls(int(data["number"]), str(data["file"]), int(data["start"]), int(data["rows"]), int(data["bytes"]),
                   str(data["sha256"]), str(data["stats_file"]), str(data["stats_sha256"]))


@dataclass(frozen=True)
class Manifest:
    """What an index directory holds and how it was made; written last, as ``manifest.json``."""

    index_id: str
    dim: int
    num_examples: int
    storage_dtype: str
    codec: str
    blocks: tuple[BlockInfo, ...]
    stat_blocks: tuple[StatBlock, ...]
    shards: tuple[ShardInfo, ...]
    spec: Mapping[str, Any]  # everything the index id hashes
    sources: Mapping[str, Any]  # where the inputs came from and build settings that do not change the numbers
    files: Mapping[str, str]  # examples / stats file name -> sha256
    totals: Mapping[str, int]
    build: Mapping[str, Any] = field(default_factory=dict)  # timestamps and timings: not part of the id
    format_version: int = FORMAT_VERSION

    @property
    def projection(self) -> Mapping[str, Any] | None:
        """The projection spec, or None for exact gradients."""
        return self.spec["grads"].get("projection")

    def to_dict(self) -> dict[str, Any]:
        """The JSON document written to manifest.json."""
        return {
            "format_version": self.format_version,
            "index_id": self.index_id,
            "dim": self.dim,
            "num_examples": self.num_examples,
            "storage_dtype": self.storage_dtype,
            "codec": self.codec,
            "blocks": [b.to_dict() for b in self.blocks],
            "stat_blocks": [b.to_dict() for b in self.stat_blocks],
            "shards": [s.to_dict() for s in self.shards],
            "spec": json.loads(json.dumps(self.spec)),
            "sources": json.loads(json.dumps(self.sources)),
            "files": dict(self.files),
            "totals": dict(self.totals),
            "build": dict(self.build),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "manifest.json") -> Manifest:
        """Parse a manifest document, refusing other format versions."""
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise GradientIndexError(
                f"{where} is index format version {version}; this gradian reads version {FORMAT_VERSION}",
                "rebuild the index with this gradian (gradian index), or read it with the gradian that wrote it",
            )
        try:
            return cls(
                index_id=str(data["index_id"]),
                dim=int(data["dim"]),
                num_examples=int(data["num_examples"]),
                storage_dtype=str(data["storage_dtype"]),
                codec=str(data["codec"]),
                blocks=tuple(BlockInfo.from_dict(b) for b in data["blocks"]),
                stat_blocks=tuple(StatBlock.from_dict(b) for b in data["stat_blocks"]),
                shards=tuple(ShardInfo.from_dict(s) for s in data["shards"]),
                spec=data["spec"],
                sources=dict(data.get("sources", {})),
                files=dict(data["files"]),
                totals=dict(data["totals"]),
                build=dict(data.get("build", {})),
                format_version=FORMAT_VERSION,
            )
        except (KeyError, TypeError, ValueError) as error:
            raise GradientIndexError(f"{where} is damaged: {type(error).__name__} {error}",
                                     "rebuild the index with gradian index") from None


def read_manifest(directory: Path) -> Manifest:
    """The manifest of an index directory, with a clear error when it is not one."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not directory.is_dir():
        reason = "is a file, not an index directory" if directory.exists() else absent(directory)
        raise GradientIndexError(f"index directory {directory} {reason}", "build one with gradian index")
    if not path.is_file():
        raise GradientIndexError(f"{directory} is not a gradient index (no {MANIFEST_NAME})",
                                 "build one with gradian index, or pass the directory it wrote")
    data = load_json(path, MANIFEST_NAME, GradientIndexError, hint="rebuild the index with gradian index")
    if not isinstance(data, dict):
        raise GradientIndexError(f"{path} is not a JSON object", "rebuild the index with gradian index")
    return Manifest.from_dict(data, where=str(path))


def canonical_json(data: Any) -> str:
    """Sorted, compact JSON: the form that is hashed."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def compute_index_id(spec: Mapping[str, Any]) -> str:
    """The index id: a hash of checkpoint, base model, dataset, gradient spec, seed, damping, libraries."""
    return hashlib.sha256(canonical_json(spec).encode("utf-8")).hexdigest()[:20]


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that can change stored gradients."""
    found = {}
    for name in (*ID_LIBRARIES, "numpy"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


