"""Read a dataset path into raw rows with their line numbers: JSONL, JSON, parquet, `datasets` save_to_disk dirs.

Decoding problems of one row (bad UTF-8, invalid JSON on a JSONL line) become that row's error; problems of the
whole source (missing, empty, unreadable JSON document, unknown directory) raise DatasetError at once.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradian.data.formats import RowFormatError, detect_format, json_type
from gradian.errors import DatasetError
from gradian.user_files import DATASET_LIMIT, read_bytes, value_problem


def supported_hint(flag: str = "--dataset") -> str:
    """What the flag that names a data file accepts."""
    return f"{flag} takes a .jsonl / .json / .parquet file or a directory written by datasets' save_to_disk"


DATASETS_MISSING_HINT = "pip install datasets"
_WHITESPACE = " \t\n\r"


@dataclass(frozen=True)
class RawRow:
    """One decoded row (or its decoding error) with its 1-based line (row number in columnar files)."""

    line: int
    value: Any = None
    error: RowFormatError | None = None


@dataclass(frozen=True)
class RawSource:
    """Every raw row of a dataset path, the hash of its bytes, and how it was read."""

    path: Path
    sha256: str
    kind: str  # jsonl | json | parquet | arrow
    rows: tuple[RawRow, ...]


def read_source(path: Path | str, what: str = "dataset", flag: str = "--dataset") -> RawSource:
    """Read every row of a dataset path; raise DatasetError, naming ``what`` and its ``flag``, when the path itself
    cannot be read."""
    path = Path(path)
    hint = supported_hint(flag)
    if not path.exists() and not path.is_symlink():
        raise DatasetError(f"{what} not found: {path}", f"check the path; {hint}")
    if path.is_dir():
        return _read_saved_dir(path, hint)
    # A symlink loop, a device (/dev/zero) or a FIFO is refused here, before a single unbounded read.
    data = read_bytes(path, what, DatasetError, limit=DATASET_LIMIT, hint=hint)
    digest = hashlib.sha256(data).hexdigest()
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return RawSource(path, digest, "parquet", _read_parquet(path, hint))
    if suffix in (".jsonl", ".ndjson"):
        return RawSource(path, digest, "jsonl", _jsonl_rows(data))
    json_rows = _json_document_rows(path, data, what, hint)
    if json_rows is None:  # not one JSON document: read it as JSON Lines (.json files often are)
        return RawSource(path, digest, "jsonl", _jsonl_rows(data))
    return RawSource(path, digest, "json", json_rows)


def _jsonl_rows(data: bytes) -> tuple[RawRow, ...]:
    """One row per non-blank line; a line that is not UTF-8 or not JSON is that row's error."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    rows = []
    for line_number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            rows.append(RawRow(line_number, error=RowFormatError(
                f"line is not UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line)",
                "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")))
            continue
        if not text.strip():  # blank lines hold no row; line numbers still count them
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            rows.append(RawRow(line_number, error=RowFormatError(
                f"invalid JSON: {exc.msg} (column {exc.colno})",
                "each line of a JSON Lines file is one complete JSON object")))
            continue
        except RecursionError:
            rows.append(RawRow(line_number, error=_unsafe_row("is nested too deep to read")))
            continue
        except ValueError:  # an integer past Python's 4300-digit conversion limit
            rows.append(RawRow(line_number, error=_unsafe_row("holds an integer too long to read")))
            continue
        problem = value_problem(value, text)
        rows.append(RawRow(line_number, error=_unsafe_row(problem)) if problem else RawRow(line_number, value=value))
    return tuple(rows)


def _json_document_rows(path: Path, data: bytes, what: str, hint: str) -> tuple[RawRow, ...] | None:
    """Rows of a JSON document (a list of rows, or {"data": [...]}); None when the bytes are not one document."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DatasetError(f"{path}:{line}: file is not UTF-8 (byte 0x{data[exc.start]:02x})",
                           "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
    if not text.strip():
        raise DatasetError(f"{path}: the {what} file is empty", f"{hint}, with at least one row")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # several top-level values: JSON Lines
            return None
        raise DatasetError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg} (column {exc.colno})",
                           "a .json dataset is one JSON array of rows (or {\"data\": [...]}); "
                           "for one row per line use .jsonl") from None
    except RecursionError:
        raise DatasetError(f"{path}: the JSON document is nested too deep to read", hint) from None
    except ValueError:  # an integer past Python's 4300-digit conversion limit
        raise DatasetError(f"{path}: the JSON document holds an integer too long to read", hint) from None
    start = _skip_whitespace(text, 0)
    if isinstance(document, list):
        return _rows_at(text, _array_items(text, start))
    if isinstance(document, dict) and isinstance(document.get("data"), list):
        return _rows_at(text, _data_items(text, start))
    if isinstance(document, dict) and detect_format(document) is not None:
        return _rows_at(text, [(start, document)])  # a single row on its own
    raise DatasetError(f"{path}: the JSON document is {json_type(document)}, not a list of rows",
                       "a .json dataset is a JSON array of rows, or {\"data\": [...]}; JSON Lines holds one row per line")


def _skip_whitespace(text: str, index: int) -> int:
    while index < len(text) and text[index] in _WHITESPACE:
        index += 1
    return index


def _array_items(text: str, start: int) -> list[tuple[int, Any]]:
    """(offset, value) of every element of the (already validated) JSON array starting at ``start``."""
    decoder = json.JSONDecoder()
    items: list[tuple[int, Any]] = []
    index = _skip_whitespace(text, start + 1)
    while text[index] != "]":
        value, end = decoder.raw_decode(text, index)
        items.append((index, value))
        index = _skip_whitespace(text, end)
        if text[index] == ",":
            index = _skip_whitespace(text, index + 1)
    return items


def _data_items(text: str, start: int) -> list[tuple[int, Any]]:
    """Elements of the "data" array inside the (already validated) top-level object at ``start``."""
    decoder = json.JSONDecoder()
    items: list[tuple[int, Any]] = []
    index = _skip_whitespace(text, start + 1)
    while text[index] != "}":
        key, end = decoder.raw_decode(text, index)
        index = _skip_whitespace(text, _skip_whitespace(text, end) + 1)  # past the ':'
        if key == "data" and text[index] == "[":
            items = _array_items(text, index)  # the last "data" wins, as in json.loads
        _, end = decoder.raw_decode(text, index)
        index = _skip_whitespace(text, end)
        if text[index] == ",":
            index = _skip_whitespace(text, index + 1)
    return items


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _rows_at(text: str, items: list[tuple[int, Any]]) -> tuple[RawRow, ...]:
    rows, line, last = [], 1, 0
    checked = value_problem([value for _, value in items], text) is not None  # one cheap pass for the common case
    for offset, value in items:  # offsets increase, so count newlines incrementally
        line += text.count("\n", last, offset)
        last = offset
        problem = value_problem(value) if checked else None
        rows.append(RawRow(line, error=_unsafe_row(problem)) if problem else RawRow(line, value=value))
    return tuple(rows)


def _unsafe_row(problem: str) -> RowFormatError:
    """A row that parsed as JSON but cannot be used: a lone surrogate cannot be encoded, a deep one overflows."""
    return RowFormatError(f"the row {problem}", "fix or drop this row; it did not come from a normal export")


def _read_parquet(path: Path, hint: str) -> tuple[RawRow, ...]:
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise DatasetError(f"{path}: reading parquet needs the 'datasets' package (pyarrow)",
                           DATASETS_MISSING_HINT) from None
    try:
        table = parquet.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise DatasetError(f"{path}: not a readable parquet file ({exc})", hint) from None
    return tuple(RawRow(number, value=row) for number, row in enumerate(table.to_pylist(), start=1))


def directory_sha256(path: Path) -> str:
    """sha256 over every file under a directory, in sorted relative-path order (names and bytes)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        relative = file.relative_to(path).as_posix().encode("utf-8")
        content = file.read_bytes()
        digest.update(len(relative).to_bytes(8, "big") + relative + len(content).to_bytes(8, "big"))
        digest.update(content)
    return digest.hexdigest()


def _read_saved_dir(path: Path, hint: str) -> RawSource:
    """A directory written by datasets' save_to_disk (a Dataset, or a DatasetDict with one split)."""
    if not any((path / marker).exists() for marker in ("dataset_info.json", "state.json", "dataset_dict.json")):
        raise DatasetError(f"{path} is a directory but not one written by datasets' save_to_disk", hint)
    digest = directory_sha256(path)
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"{path}: reading a save_to_disk directory needs the 'datasets' package",
                           DATASETS_MISSING_HINT) from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises FileNotFoundError, ValueError, ArrowInvalid...
        raise DatasetError(f"{path}: datasets could not load this directory ({exc})", hint) from None
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if len(splits) != 1:
            raise DatasetError(f"{path} holds several splits ({', '.join(splits)})",
                               f"pass one split's directory, e.g. {path / splits[0]}")
        loaded = loaded[splits[0]]
    return RawSource(path, digest, "arrow",
                     tuple(RawRow(number, value=row) for number, row in enumerate(loaded, start=1)))
