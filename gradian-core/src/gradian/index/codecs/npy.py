"""The built-in ``npy`` storage codec: one ``.npy`` file per shard, read back memory-mapped."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from gradian.records import CodecSpec

if TYPE_CHECKING:
    import numpy as np

# numpy is imported inside the functions: listing plugins loads this module and should stay light.


def write_npy(path: Path, array: np.ndarray) -> None:
    """Write ``array`` to ``path`` as a ``.npy`` file and flush it to disk (the caller renames it into place)."""
    import numpy as np

    from gradian.index.mapped import write_mapped_npy

    # A file handle, not a path: np.save appends ".npy" to path names that lack it (temp names do).
    with open(path, "wb") as handle:
        if isinstance(array, np.memmap) and array.ndim >= 1:
            write_mapped_npy(handle, array)  # the same bytes as np.save, without the whole map becoming resident
        else:
            np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
        handle.flush()
        os.fsync(handle.fileno())


def read_npy(path: Path) -> np.memmap:
    """Open a ``.npy`` shard memory-mapped and read-only; nothing is loaded until rows are touched."""
    import numpy as np

    return np.load(path, mmap_mode="r", allow_pickle=False)


NPY_CODEC = CodecSpec(
    name="npy",
    summary="one .npy file per shard, memory-mapped on read",
    suffix=".npy",
    write=write_npy,
    read=read_npy,
)
