"""Pages of a writable memory map handed back once written, so a shard being built does not sit in RSS.

A shard of exact gradients is assembled in a scratch file mapped shared (over a gigabyte for a 256-row shard of
a 135M model). Its written pages live in the page cache either way; dropping them from this process's mapping
(``MADV_DONTNEED`` on a shared file mapping keeps their contents: a later read maps them in again) keeps the
build's resident memory at the model and one batch instead of the model and the whole shard.
"""

from __future__ import annotations

import mmap
from typing import BinaryIO

import numpy as np

# Rows copied out of a mapping at once when it is written to a file.
SLAB_BYTES = 64 << 20


def release_pages(array: np.ndarray) -> None:
    """Drop the resident pages of a shared memory map from this process (no-op for in-memory arrays)."""
    mapping = getattr(array, "_mmap", None) if isinstance(array, np.memmap) else None
    if mapping is not None and not mapping.closed and hasattr(mapping, "madvise"):
        mapping.madvise(mmap.MADV_DONTNEED)


def write_mapped_npy(handle: BinaryIO, array: np.memmap) -> None:
    """Write a memory-mapped array as a ``.npy`` file slab by slab, releasing each slab's pages after it."""
    np.lib.format.write_array_header_1_0(handle, np.lib.format.header_data_from_array_1_0(array))
    rows = max(1, SLAB_BYTES // max(array[:1].nbytes, 1))
    for start in range(0, array.shape[0], rows):
        np.ascontiguousarray(array[start:start + rows]).tofile(handle)
        release_pages(array)
