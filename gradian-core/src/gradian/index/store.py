"""Reading a gradient index: memory-mapped shards, checksums, chunked float32 rows, statistics.

Nothing here loads the whole index: shards are opened through their codec (memory-mapped for
``npy``) and rows are decoded to float32 one chunk at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from gradian.errors import GradientIndexError
from gradian.index.dtypes import decode_rows, storage_numpy_dtype
from gradian.index.manifest import (
    EXAMPLES_NAME,
    STATS_NAME,
    BlockInfo,
    Manifest,
    ShardInfo,
    read_manifest,
    sha256_file,
)
from gradian.index.stats import PreconditionerStats
from gradian.records import CodecSpec


def get_codec(name: str) -> CodecSpec:
    """The storage codec registered under ``name``, or an error listing the installed ones."""
    from gradian.errors import ConfigError
    from gradian.plugins import get_plugins

    codecs = get_plugins().storage_codecs()
    if name not in codecs:
        raise ConfigError(f"no storage codec named {name!r} is installed",
                          f"grads.codec must be one of {', '.join(sorted(codecs)) or '(none installed)'}")
    return codecs[name]


@dataclass(frozen=True)
class ExampleRow:
    """What the index knows about one example besides its gradient."""

    id: str
    num_tokens: int
    num_supervised: int
    truncated: bool


class Index:
    """A built gradient index, opened read-only; rows are per-example gradients in stored space."""

    def __init__(self, path: Path, manifest: Manifest, *, verify: bool = True, reused: bool = False) -> None:
        self.path = Path(path)
        self.manifest = manifest
        self.verify_checksums = verify
        self.reused = reused  # True when build_index found this index in place and computed nothing
        self._verified: set[int] = set()
        self._starts = np.array([s.start for s in manifest.shards] + [manifest.num_examples], dtype=np.int64)

    @classmethod
    def open(cls, path: Path, *, verify: bool = True) -> Index:
        """Open an index directory; shards are checked against their sha256 the first time they are read."""
        path = Path(path)
        index = cls(path, read_manifest(path), verify=verify)
        index._check_files()
        return index

    # --- what it holds -----------------------------------------------------------------------

    @property
    def index_id(self) -> str:
        """The hash of every input that changes the stored numbers."""
        return self.manifest.index_id

    @property
    def dim(self) -> int:
        """Stored width of one row."""
        return self.manifest.dim

    @property
    def num_examples(self) -> int:
        """Rows in the index (one per training example, in dataset order)."""
        return self.manifest.num_examples

    def __len__(self) -> int:
        return self.manifest.num_examples

    @property
    def storage_dtype(self) -> str:
        """float32, float16 or bfloat16."""
        return self.manifest.storage_dtype

    @property
    def blocks(self) -> tuple[BlockInfo, ...]:
        """Stored parameter blocks in row order."""
        return self.manifest.blocks

    @cached_property
    def examples(self) -> tuple[ExampleRow, ...]:
        """Per-example metadata, in row order."""
        rows = []
        with open(self.path / EXAMPLES_NAME, encoding="utf-8") as handle:
            for line in handle:
                data = json.loads(line)
                rows.append(ExampleRow(data["id"], int(data["num_tokens"]), int(data["num_supervised"]),
                                       bool(data["truncated"])))
        return tuple(rows)

    @cached_property
    def example_ids(self) -> tuple[str, ...]:
        """Example ids in row order."""
        return tuple(row.id for row in self.examples)

    @property
    def ids(self) -> tuple[str, ...]:
        """Example ids in row order (the name scoring's chunk sources use)."""
        return self.example_ids

    @cached_property
    def codec(self) -> CodecSpec:
        """The codec the index was written with."""
        return get_codec(self.manifest.codec)

    def stats(self) -> PreconditionerStats:
        """Preconditioner statistics over the whole index (float64)."""
        path = self.path / STATS_NAME
        self._check_checksum(path, self.manifest.files.get(STATS_NAME, ""), STATS_NAME)
        vector = np.load(path, allow_pickle=False)
        return PreconditionerStats.from_vector(vector, self.dim, self.manifest.stat_blocks)

    def disk_bytes(self) -> int:
        """Bytes the index takes on disk (every file in its directory)."""
        return sum(p.stat().st_size for p in self.path.iterdir() if p.is_file())

    # --- reading rows ------------------------------------------------------------------------

    def shard(self, number: int) -> np.ndarray:
        """One shard in stored dtype, memory-mapped (checked against its checksum on first use)."""
        info = self.manifest.shards[number]
        path = self.path / info.file
        if self.verify_checksums and number not in self._verified:
            self._check_checksum(path, info.sha256, info.file)
            self._verified.add(number)
        try:
            array = self.codec.read(path)
        except (OSError, ValueError) as error:
            raise GradientIndexError(f"shard {info.file} of {self.path} cannot be read: {error}",
                                     "rebuild the index with gradian index") from None
        self._check_shape(info, array)
        return array

    def iter_chunks(self, chunk_size: int = 1024, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(row offset, float32 rows)`` chunks of at most ``chunk_size`` rows, in order."""
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        stop = self.num_examples if stop is None else min(stop, self.num_examples)
        position = start
        while position < stop:
            end = min(position + chunk_size, stop)
            yield position, self.rows_between(position, end)
            position = end

    def rows_between(self, start: int, end: int) -> np.ndarray:
        """Rows ``start:end`` as a new float32 array (may span shards)."""
        parts = []
        position = start
        while position < end:
            number = int(np.searchsorted(self._starts, position, side="right") - 1)
            info = self.manifest.shards[number]
            upto = min(end, info.start + info.rows)
            parts.append(decode_rows(self.shard(number)[position - info.start : upto - info.start], self.storage_dtype))
            position = upto
        if not parts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def rows(self, indices: Sequence[int]) -> np.ndarray:
        """The float32 rows at the given positions, in the order given."""
        out = np.zeros((len(indices), self.dim), dtype=np.float32)
        for slot, row in enumerate(indices):
            if not 0 <= row < self.num_examples:
                raise IndexError(f"row {row} is outside an index of {self.num_examples} examples")
            out[slot] = self.rows_between(int(row), int(row) + 1)[0]
        return out

    def verify(self) -> None:
        """Check every shard and the statistics against their checksums; raises naming the first bad file."""
        for number in range(len(self.manifest.shards)):
            self._verified.discard(number)
            previous, self.verify_checksums = self.verify_checksums, True
            try:
                self.shard(number)
            finally:
                self.verify_checksums = previous
        for info in self.manifest.shards:
            self._check_checksum(self.path / info.stats_file, info.stats_sha256, info.stats_file)
        self.stats()
        self._check_checksum(self.path / EXAMPLES_NAME, self.manifest.files.get(EXAMPLES_NAME, ""), EXAMPLES_NAME)

    def describe(self) -> dict[str, Any]:
        """The manifest as a plain dict (what show-index prints)."""
        return self.manifest.to_dict()

    # --- checks ------------------------------------------------------------------------------

    def _check_files(self) -> None:
        """Cheap checks on open: every file is present and each shard has the size its rows imply."""
        for name in (EXAMPLES_NAME, STATS_NAME):
            if not (self.path / name).is_file():
                raise GradientIndexError(f"{self.path} is missing {name}", "rebuild the index with gradian index")
        for info in self.manifest.shards:
            path = self.path / info.file
            if not path.is_file():
                raise GradientIndexError(f"shard {info.file} of {self.path} is missing", "rebuild the index with gradian index")
            size = path.stat().st_size
            if size != info.bytes:
                state = "truncated" if size < info.bytes else "longer than it was written"
                raise GradientIndexError(f"shard {info.file} of {self.path} is {state} ({size} bytes, expected {info.bytes})",
                                         "rebuild the index with gradian index")

    def _check_shape(self, info: ShardInfo, array: Any) -> None:
        expected = storage_numpy_dtype(self.storage_dtype)
        if tuple(array.shape) != (info.rows, self.dim) or np.dtype(array.dtype) != expected:
            raise GradientIndexError(
                f"shard {info.file} of {self.path} holds {tuple(array.shape)} {array.dtype}, "
                f"expected ({info.rows}, {self.dim}) {expected}",
                "rebuild the index with gradian index",
            )

    def _check_checksum(self, path: Path, expected: str, name: str) -> None:
        if not path.is_file():
            raise GradientIndexError(f"{name} of {self.path} is missing", "rebuild the index with gradian index")
        if sha256_file(path) != expected:
            what = f"shard {name}" if name.startswith("shard-") else name
            raise GradientIndexError(f"{what} of {self.path} does not match its checksum (corrupted or modified)",
                                     "rebuild the index with gradian index (delete the directory first)")


def open_index(path: Path, *, verify: bool = True) -> Index:
    """Open an index directory for reading."""
    return Index.open(path, verify=verify)
