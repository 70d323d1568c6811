"""A dataset minus some rows, written in the container it was read from, never touching the original.

JSON Lines: the kept lines are copied byte for byte (a leading BOM and CRLF line ends too; blank lines, which
hold no row, are left out). A JSON document: the kept rows re-serialized as a JSON array (the loader reads it
back to the same rows). Parquet: the kept rows of the original table, schema unchanged (pyarrow). A
``datasets`` save_to_disk directory: ``Dataset.select`` saved to a new directory.
"""

from __future__ import annotations

import codecs
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gradian.atomic_files import atomic_path, write_atomic
from gradian.data.readers import RawSource, read_source
from gradian.errors import DatasetError

# Output names each input container may be written to; the output is always the input's own container.
OUT_SUFFIXES = {"jsonl": (".jsonl", ".ndjson", ".json"), "json": (".json",), "parquet": (".parquet",), "arrow": ("",)}
HOW_COPIED = {"jsonl": "lines copied byte for byte", "json": "rows re-serialized as a JSON array",
              "parquet": "rows taken from the original table", "arrow": "rows selected with datasets"}


@dataclass(frozen=True)
class SubsetWritten:
    """What ``write_subset`` wrote: where, in which container, how many rows, and how they were copied."""

    path: Path
    kind: str  # jsonl | json | parquet | arrow, the input's own
    rows: int
    how: str


def check_out_path(kind: str, source: Path, out: Path) -> None:
    """Refuse an output that would be the input itself, or a name that says another container."""
    same = out.absolute() == source.absolute() or (out.exists() and os.path.samefile(out, source))
    if same:
        raise DatasetError(f"--out {out} is the training dataset itself",
                           "gradian never modifies your dataset; pass a new file name for --out")
    allowed = OUT_SUFFIXES[kind]
    suffix = out.suffix.lower() if kind != "arrow" else ""
    if suffix not in allowed:
        want = "a directory name without a suffix" if kind == "arrow" else " or ".join(f"*{s}" for s in allowed)
        raise DatasetError(f"--out {out} names another format than the dataset's ({kind})",
                           f"the output keeps the input's own format: name it {want}")


def write_subset(path: Path | str, keep: Sequence[int], out: Path | str, *, sha256: str) -> SubsetWritten:
    """Write the rows at positions ``keep`` of the dataset at ``path`` to ``out``, in the same container.

    ``sha256`` is the hash the positions were computed on: a file that changed since is refused.
    """
    source = read_source(path)
    out = Path(out)
    if source.sha256 != sha256:
        raise DatasetError(f"{source.path} changed while it was being exported", "run gradian export again")
    check_out_path(source.kind, source.path, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    writers = {"jsonl": _write_jsonl, "json": _write_json, "parquet": _write_parquet, "arrow": _write_arrow}
    writers[source.kind](source, list(keep), out)
    return SubsetWritten(out, source.kind, len(keep), HOW_COPIED[source.kind])


def _write_jsonl(source: RawSource, keep: list[int], out: Path) -> None:
    data = source.path.read_bytes()
    bom = codecs.BOM_UTF8 if data.startswith(codecs.BOM_UTF8) else b""
    lines = data[len(bom):].split(b"\n")  # the reader's own split, so RawRow.line indexes it
    body = b"".join(lines[source.rows[position].line - 1] + b"\n" for position in keep)
    write_atomic(out, bom + body)


def _write_json(source: RawSource, keep: list[int], out: Path) -> None:
    rows = [source.rows[position].value for position in keep]
    write_atomic(out, (json.dumps(rows, ensure_ascii=False, indent=2) + "\n").encode("utf-8"))


def _write_parquet(source: RawSource, keep: list[int], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as parquet

    table = parquet.read_table(source.path).take(pa.array(keep, type=pa.int64()))  # RawRow.line is row + 1
    with atomic_path(out) as temp:
        parquet.write_table(table, str(temp))


def _write_arrow(source: RawSource, keep: list[int], out: Path) -> None:
    import datasets

    loaded = datasets.load_from_disk(str(source.path))
    if isinstance(loaded, datasets.DatasetDict):  # the reader accepts exactly one split
        loaded = loaded[next(iter(loaded))]
    temp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        loaded.select(keep).save_to_disk(str(temp))
        old = None
        if out.exists():  # --overwrite: move the old one aside first, so out is never half-replaced
            old = out.parent / f".{out.name}.old"
            os.replace(out, old)
        os.replace(temp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
