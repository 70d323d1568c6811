"""Check where a command will write before it loads a model, so a bad --out costs seconds, not the whole run."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from gradian.errors import ConfigError, GradianError


def check_output_dir(path: Path, option: str, *, error: type[GradianError] = ConfigError,
                     beside: bool = False) -> None:
    """Refuse a directory ``option`` cannot create or write: a file, a path under a file, a read-only place.

    ``beside``: the command also writes next to ``path`` (a ``.partial`` build renamed onto it), so its parent
    must be writable too.
    """
    path = Path(path).expanduser()
    if path.is_symlink() and not path.exists():
        raise error(f"{option} {path} is a symlink to nothing (dangling, or a loop)",
                    f"remove the link or pass another {option}")
    if path.exists() and not path.is_dir():
        raise error(f"{option} {path} is a file, not a directory", f"pass a directory path to {option}")
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise error(f"{option} {path} is inside {existing}, which is a file",
                    f"pass a directory path to {option}")
    places = [existing]
    if beside and path.exists():
        places.append(_nearest_existing(path.parent))
    for place in places:
        reason = _write_probe(place)
        if reason:
            raise error(f"{option} {path} cannot be written: {place} is {reason}",
                        f"pass a directory you can write to as {option}")


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (symlinks followed)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _write_probe(directory: Path) -> str | None:
    """Why a file cannot be created in ``directory`` (None when it can): the real test, which also holds for root."""
    try:
        handle, name = tempfile.mkstemp(prefix=".gradian-write-probe-", dir=directory)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            return "full (no space left on the device)"
        if exc.errno == errno.EROFS:
            return "on a read-only file system"
        return f"not writable ({exc.strerror or type(exc).__name__})"
    os.close(handle)
    os.unlink(name)
    return None
