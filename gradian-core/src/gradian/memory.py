"""Freed memory handed back to the system between the stages of a long command.

A gradient capture allocates and frees about a gigabyte of activations per batch; glibc keeps freed heap pages for
reuse, so without this a later, smaller stage (scoring, span drill-down) would run on top of the index build's
high-water mark. Only freed pages are returned: nothing live moves.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import sys


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc, whose malloc_trim returns freed heap pages; None on other C libraries and systems."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def release_freed_memory() -> None:
    """Collect garbage, then return the C heap's free pages to the system (glibc only; a no-op elsewhere)."""
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
