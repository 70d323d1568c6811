"""Where Gradian keeps what it can rebuild: converted models and other per-user caches."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "GRADIAN_CACHE_DIR"


def cache_dir() -> Path:
    """The user cache dir: $GRADIAN_CACHE_DIR, else $XDG_CACHE_HOME/gradian, else ~/.cache/gradian."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    if xdg and Path(xdg).expanduser().is_absolute():
        return Path(xdg).expanduser() / "gradian"
    return Path.home() / ".cache" / "gradian"


def index_cache_dir() -> Path:
    """Where indexes built without --out go (checkpoint indexes always): ``<cache dir>/indexes``."""
    return cache_dir() / "indexes"
