"""Files written whole or not at all (a temp file next to the target, renamed onto it), and streamed sha256.

Every file Gradian writes goes through here: a reader never sees half a report, shard or dataset, and an
interrupted write leaves only a hidden ``.<name>.*.tmp`` that the next write replaces.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar


class _Digest(Protocol):
    """A hashlib object: what update_with_file feeds."""

    def update(self, data: bytes, /) -> None: ...


DigestT = TypeVar("DigestT", bound=_Digest)

# mkstemp makes 0600; what Gradian writes (reports, shards, exported datasets) is meant to be read by others
FILE_MODE = 0o644
HASH_BLOCK = 1 << 23


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """A temp path next to ``path`` to write to, renamed onto ``path`` when the block ends without error."""
    path = Path(path)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        yield Path(temp)
        os.chmod(temp, FILE_MODE)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_file(path: Path | str, mode: str = "wb", **open_kwargs: Any) -> Iterator[IO[Any]]:
    """An open handle on a temp file next to ``path``, flushed to disk and renamed onto it when the block ends."""
    with atomic_path(path) as temp, temp.open(mode, **open_kwargs) as out:
        yield out
        out.flush()
        os.fsync(out.fileno())


def write_atomic(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path``, never half-written."""
    with atomic_file(path) as out:
        out.write(data)


def write_text_atomic(path: Path | str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``, never half-written."""
    write_atomic(path, text.encode("utf-8"))


def write_with(path: Path | str, write: Callable[[Path], None]) -> None:
    """Call ``write(temp_path)`` next to ``path`` and rename the result into place (numpy, safetensors, parquet)."""
    with atomic_path(path) as temp:
        write(temp)


def update_with_file(digest: DigestT, path: Path | str, block: int = HASH_BLOCK) -> DigestT:
    """Feed a file's bytes to ``digest`` in blocks, so a big shard never sits in memory whole; returns the digest."""
    with open(path, "rb") as handle:
        while chunk := handle.read(block):
            digest.update(chunk)
    return digest


def sha256_file(path: Path | str, block: int = HASH_BLOCK) -> str:
    """Hex sha256 of a file."""
    return update_with_file(hashlib.sha256(), path, block).hexdigest()
