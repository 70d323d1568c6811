"""Reading a gradient index: memory-mapped shards, checksums, chunked float32 rows, statistics.

Nothing here loads the whole index: shards are opened through their codec (memory-mapped for
``npy``) and rows are decoded to float32 one chunk at a time, straight from the mapping into the
chunk. Callers size chunks in bytes (``rows_per_chunk``): exact gradients of a real model are
megabytes per row, so a row count that suits a projected index would not fit in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from gradian.atomic_files import sha256_file, write_text_atomic, write_with
from gradian.errors import ConfigError, GradientIndexError
from gradian.index.codecs.npy import write_npy
from gradian.index.dtypes import decode_rows_into, storage_numpy_dtype
from gradian.index.manifest import (
    EXAMPLES_NAME,
    STATS_NAME,
    BlockInfo,
    Manifest,
    ShardInfo,
    read_manifest,
)
from gradian.index.stats import BlockMomentAccumulator, PreconditionerStats, legacy_block_vector
from gradian.plugins import get_plugins
from gradian.records import CodecSpec

if TYPE_CHECKING:
    from gradian.grads.whitening import Whitening

# attribution.chunk_mb's default: float32 rows decoded at a time when scoring, sketching or gathering statistics.
DEFAULT_CHUNK_BYTES = 256 << 20
# Block second-moment matrices, computed on demand (only the block preconditioner reads them) and cached here.
BLOCK_STATS_NAME = "block-stats.npy"
BLOCK_STATS_RECORD = "block-stats.json"
WHITENING_NAME = "whitening.safetensors"  # a projected index's scales applied before the sketch


def rows_per_chunk(chunk_bytes: int, dim: int) -> int:
    """Rows whose float32 copy fits ``chunk_bytes`` (at least one, however wide a row is)."""
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be positive")
    return max(1, int(chunk_bytes) // (max(int(dim), 1) * 4))


def get_codec(name: str) -> CodecSpec:
    """The storage codec registered under ``name``, or an error listing the installed ones."""
    codecs = get_plugins().storage_codecs()
    if name not in codecs:
        raise ConfigError(f"no storage codec named {name!r} is installed",
                          f"grads.codec must be one of {', '.join(sorted(codecs)) or '(none installed)'}")
    return codecs[name]


class ExampleRow(NamedTuple):
    """What the index knows about one example besides its gradient (a tuple: a million are made per open)."""

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
        text = (self.path / EXAMPLES_NAME).read_text(encoding="utf-8")
        # One JSON array parse: about twice as fast as a json.loads per line at a million rows.
        records = json.loads("[" + ",".join(line for line in text.splitlines() if line) + "]")
        return tuple(ExampleRow(data["id"], int(data["num_tokens"]), int(data["num_supervised"]), bool(data["truncated"]))
                     for data in records)

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
        """Per-coordinate statistics over the whole index (float64): count, sum, sum of squares; no block matrices."""
        return PreconditionerStats.from_vector(self._stats_vector(), self.dim, self.manifest.stat_blocks)

    def block_stats(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> PreconditionerStats:
        """``stats()`` plus every narrow block's second-moment matrix (what the block preconditioner needs).

        An index built before matrices were made on demand carries them in its stats file; otherwise they come
        from the cache next to the index, or from one streamed pass over it (``chunk_bytes`` of rows at a time),
        cached there for the next run when the directory is writable.
        """
        vector = self._stats_vector()
        stats = PreconditionerStats.from_vector(vector, self.dim, self.manifest.stat_blocks)
        legacy = legacy_block_vector(vector, self.dim)
        if legacy is not None:
            return stats.with_block_vector(legacy)
        accumulator = BlockMomentAccumulator(self.manifest.stat_blocks)
        if not accumulator.blocks:  # every block is too wide: there is nothing to compute
            return stats.with_block_vector(np.array([float(stats.count)]))
        cached = self._cached_block_vector()
        if cached is not None:
            try:
                return stats.with_block_vector(cached)
            except GradientIndexError:
                pass  # a cache of other rows or blocks: computed again below
        for _, chunk in self.iter_chunks(rows_per_chunk(chunk_bytes, self.dim)):
            accumulator.add(chunk)
        vector = accumulator.to_vector()
        self._cache_block_vector(vector)
        return stats.with_block_vector(vector)

    def whitening(self) -> Whitening | None:
        """The scaling applied before the sketch (``gradian.grads.whitening.Whitening``), or None when unscaled."""
        return self._whitening

    @cached_property
    def _whitening(self) -> Whitening | None:
        """Read and checked once: the query capture and the preconditioner both ask for it."""
        if self.manifest.spec["grads"].get("whitening") is None:
            return None
        path = self.path / WHITENING_NAME
        self._check_checksum(path, self.manifest.files.get(WHITENING_NAME, ""), WHITENING_NAME)
        return read_whitening(self.path, len(self.manifest.blocks))

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

    def iter_chunks(self, rows: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(row offset, float32 rows)`` chunks of at most ``rows`` rows, in order (see ``rows_per_chunk``)."""
        if rows < 1:
            raise ValueError("a chunk must hold at least one row")
        stop = self.num_examples if stop is None else min(stop, self.num_examples)
        position = start
        while position < stop:
            end = min(position + rows, stop)
            yield position, self.rows_between(position, end)
            position = end

    def rows_between(self, start: int, end: int) -> np.ndarray:
        """Rows ``start:end`` as a new float32 array (may span shards), decoded straight from the shards' mappings."""
        out = np.empty((max(end - start, 0), self.dim), dtype=np.float32)
        position = start
        while position < end:
            number = int(np.searchsorted(self._starts, position, side="right") - 1)
            info = self.manifest.shards[number]
            upto = min(end, info.start + info.rows)
            shard = self.shard(number)
            decode_rows_into(shard[position - info.start : upto - info.start], self.storage_dtype,
                             out[position - start : upto - start])
            del shard  # unmapped now: the pages just read stop counting toward this process's memory
            position = upto
        return out

    def rows(self, indices: Sequence[int]) -> np.ndarray:
        """The float32 rows at the given positions, in the order given."""
        out = np.zeros((len(indices), self.dim), dtype=np.float32)
        for slot, row in enumerate(indices):
            if not 0 <= row < self.num_examples:
                raise IndexError(f"row {row} is outside an index of {self.num_examples} examples")
            out[slot] = self.rows_between(int(row), int(row) + 1)[0]
        return out

    def verify_files(self) -> None:
        """Check every file the manifest lists against its checksum (reading, not computing, anything)."""
        for number, info in enumerate(self.manifest.shards):
            self._check_checksum(self.path / info.file, info.sha256, info.file)
            self._verified.add(number)
            self._check_checksum(self.path / info.stats_file, info.stats_sha256, info.stats_file)
        for name in (STATS_NAME, EXAMPLES_NAME):
            self._check_checksum(self.path / name, self.manifest.files.get(name, ""), name)

    def verify(self) -> None:
        """Check every file against its checksum, then open every shard and the statistics; raises naming the first
        bad file."""
        self.verify_files()
        for number in range(len(self.manifest.shards)):
            self.shard(number)  # its shape against the manifest (the checksum was just checked)
        self.stats()

    def describe(self) -> dict[str, Any]:
        """The manifest as a plain dict (what show-index prints)."""
        return self.manifest.to_dict()

    # --- statistics files ---------------------------------------------------------------------

    def _stats_vector(self) -> np.ndarray:
        """stats.npy, checked and memory-mapped (a legacy file's block matrices are read only when asked for)."""
        path = self.path / STATS_NAME
        self._check_checksum(path, self.manifest.files.get(STATS_NAME, ""), STATS_NAME)
        return np.load(path, mmap_mode="r", allow_pickle=False)

    def _cached_block_vector(self) -> np.ndarray | None:
        """The cached block matrices when their record names this index and their checksum holds; else None."""
        try:
            record = json.loads((self.path / BLOCK_STATS_RECORD).read_text(encoding="utf-8"))
            path = self.path / BLOCK_STATS_NAME
            if record.get("index_id") != self.index_id or sha256_file(path) != record.get("sha256"):
                return None
            return np.load(path, allow_pickle=False)
        except (OSError, ValueError, AttributeError):
            return None

    def _cache_block_vector(self, vector: np.ndarray) -> None:
        """Keep the block matrices next to the index; a read-only index directory just goes without."""
        try:
            write_with(self.path / BLOCK_STATS_NAME, lambda temp: write_npy(temp, vector))
            record = {"index_id": self.index_id, "sha256": sha256_file(self.path / BLOCK_STATS_NAME)}
            write_text_atomic(self.path / BLOCK_STATS_RECORD, json.dumps(record, sort_keys=True) + "\n")
        except OSError:
            pass

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

    def _check_shape(self, info: ShardInfo, array: np.ndarray) -> None:
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


def read_whitening(directory: Path, matrices: int) -> Whitening:
    """The whitening file of an index (or build) directory, holding the scales of ``matrices`` LoRA matrices."""
    from gradian.grads.whitening import Whitening  # imports torch: opening and scoring an index does not

    path = Path(directory) / WHITENING_NAME
    try:
        return Whitening.load(path, matrices)
    except (OSError, ValueError) as error:
        raise GradientIndexError(f"the gradient scales {path} cannot be read ({error})",
                                 "rebuild the index with gradian index (delete the directory first)") from None


def open_index(path: Path, *, verify: bool = True) -> Index:
    """Open an index directory for reading."""
    return Index.open(path, verify=verify)
