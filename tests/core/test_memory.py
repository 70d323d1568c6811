"""release_freed_memory: freed heap pages go back to the system; live data is untouched."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from gradian.memory import _libc, release_freed_memory


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux") or _libc() is None, reason="glibc's malloc_trim only")
def test_freed_heap_pages_between_live_blocks_are_returned_and_live_blocks_keep_their_values():
    # 64 KiB blocks come from the heap (below glibc's mmap threshold); keeping every tenth alive leaves the
    # freed ones in the middle of the heap, where free() alone never returns them.
    blocks = [np.full(8192, i, dtype=np.float64) for i in range(4000)]
    kept = blocks[::10]
    del blocks
    before = _rss_mb()
    release_freed_memory()
    after = _rss_mb()
    assert before - after > 100, (before, after)  # ~225 MB were freed in the middle of the heap
    assert all(block[0] == 10 * i and block[-1] == 10 * i for i, block in enumerate(kept))
