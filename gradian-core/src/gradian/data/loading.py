"""Load a training or eval dataset into Examples; every bad row is an error with file:line, none is dropped."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from gradian.atomic_files import atomic_file
from gradian.data.examples import FORMATS, Example, Fields, content_sha256, example_id
from gradian.data.formats import RowFormatError, parse_row
from gradian.data.readers import read_source, supported_hint
from gradian.errors import DatasetError


class DatasetRowError(DatasetError):
    """One bad row: where it is (``path:line``), what is wrong, and how to fix it."""

    def __init__(self, location: str, reason: str, hint: str = "") -> None:
        super().__init__(f"{location}: {reason}", hint)
        self.location = location
        self.reason = reason


@dataclass(frozen=True)
class Dataset(Sequence[Example]):
    """The examples of one dataset path, in file order, with the hash of the bytes they came from."""

    path: Path
    sha256: str
    examples: tuple[Example, ...]
    format: str  # one of FORMATS, or "mixed" when rows differ

    def __len__(self) -> int:
        return len(self.examples)

    @overload
    def __getitem__(self, index: int) -> Example: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Example, ...]: ...

    def __getitem__(self, index: int | slice) -> Example | tuple[Example, ...]:
        return self.examples[index]

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)

    @property
    def ids(self) -> tuple[str, ...]:
        """Every example id, in order."""
        return tuple(example.id for example in self.examples)


@dataclass(frozen=True)
class DatasetScan:
    """Every row of a dataset path checked: the valid examples and one error per bad row (for diagnose)."""

    path: Path
    sha256: str
    examples: tuple[Example, ...]
    problems: tuple[DatasetRowError, ...]
    rows: int

    def raise_first(self) -> None:
        """Raise the first bad row's error (saying how many more there are), if any."""
        if self.problems:
            first = self.problems[0]
            more = len(self.problems) - 1
            suffix = f" ({more} more bad row{'s' if more > 1 else ''})" if more else ""
            raise DatasetRowError(first.location, first.reason + suffix, first.hint)


def _check_expected_format(expected_format: str | None) -> None:
    if expected_format is not None and expected_format not in FORMATS:
        raise DatasetError(f"unknown dataset format {expected_format!r}", f"formats are {', '.join(FORMATS)}")


def scan_dataset(path: Path | str, *, expected_format: str | None = None, what: str = "dataset",
                 flag: str = "--dataset") -> DatasetScan:
    """Read and validate every row, collecting each bad row's error instead of stopping at the first.

    An error about the file as a whole names it as ``what``, with what its ``flag`` accepts.
    """
    _check_expected_format(expected_format)
    source = read_source(path, what, flag)
    if not source.rows:
        raise DatasetError(f"{source.path}: the {what} has no rows", f"{supported_hint(flag)}, with at least one row")
    examples: list[Example] = []
    problems: list[DatasetRowError] = []
    for position, raw in enumerate(source.rows):
        location = f"{source.path}:{raw.line}"
        try:
            if raw.error is not None:
                raise raw.error
            parsed = parse_row(raw.value)
        except RowFormatError as exc:
            problems.append(DatasetRowError(location, exc.reason, exc.hint))
            continue
        if expected_format is not None and parsed.format != expected_format:
            problems.append(DatasetRowError(
                location, f"row is in format {parsed.format!r}, but the file was declared {expected_format!r}",
                "convert the row, or declare the format the file is in"))
            continue
        # The position counts every row, bad ones too, so fixing a row never renumbers the others.
        examples.append(Example(
            id=example_id(position, content_sha256(parsed.messages, parsed.text)),
            index=position,
            messages=parsed.messages,
            format=parsed.format,
            text=parsed.text,
            fields=Fields(parsed.fields),
            location=location,
            plain_pair=parsed.plain_pair,
        ))
    return DatasetScan(source.path, source.sha256, tuple(examples), tuple(problems), len(source.rows))


def load_dataset(path: Path | str, *, expected_format: str | None = None) -> Dataset:
    """Load a training dataset; raise DatasetError (file:line, reason, hint) on the first bad row."""
    scan = scan_dataset(path, expected_format=expected_format)
    scan.raise_first()
    formats = {example.format for example in scan.examples}
    return Dataset(scan.path, scan.sha256, scan.examples, formats.pop() if len(formats) == 1 else "mixed")


def eval_item_problem(example: Example) -> tuple[str, str] | None:
    """Why an example cannot be an eval item (reason, hint), or None when it has a prompt and a wanted answer."""
    if example.text is not None:
        return ("plain text row: an eval item needs a prompt and the answer you wanted",
                "write eval items as prompt/completion, messages ending with the assistant answer, or Alpaca rows")
    if not example.messages or example.messages[-1].role != "assistant":
        return ("eval item does not end with the wanted answer (an assistant turn)",
                "end each eval conversation with the assistant answer you wanted")
    if not example.answer or not example.answer.strip():
        return ("eval item's wanted answer is empty", "give the answer you wanted the model to produce")
    if not any(message.role == "user" for message in example.prompt_messages):
        return ("eval item has no prompt (no user turn before the answer)", "add the question as a user turn")
    return None


def scan_eval_dataset(path: Path | str) -> DatasetScan:
    """scan_dataset for --eval-dataset: an error about the file as a whole names the eval set and its flag."""
    return scan_dataset(path, what="eval dataset", flag="--eval-dataset")


def load_eval_dataset(path: Path | str, *, expected_format: str | None = None) -> Dataset:
    """Load an eval set: every item must have a prompt and a wanted answer; bad items raise with file:line."""
    _check_expected_format(expected_format)
    scan = scan_eval_dataset(path)
    problems = list(scan.problems)
    for example in scan.examples:
        if expected_format is not None and example.format != expected_format:
            problems.append(DatasetRowError(
                example.location, f"eval set row is in format {example.format!r}, not the declared {expected_format!r}",
                "write the eval set in the declared format, or declare the format it is in"))
        elif (problem := eval_item_problem(example)) is not None:
            problems.append(DatasetRowError(example.location, *problem))
    problems.sort(key=lambda error: int(error.location.rsplit(":", 1)[1]))  # report the first bad row in the file
    DatasetScan(scan.path, scan.sha256, scan.examples, tuple(problems), scan.rows).raise_first()
    formats = {example.format for example in scan.examples}
    return Dataset(scan.path, scan.sha256, scan.examples, formats.pop() if len(formats) == 1 else "mixed")


def example_row(example: Example) -> dict[str, Any]:
    """The example as a JSON row in the messages (or text) format, with its fields, for write_jsonl."""
    row: dict[str, Any]
    if example.text is not None:
        row = {"text": example.text}
    else:
        turns = []
        for message in example.messages:
            turn: dict[str, Any] = {"role": message.role, "content": message.content}
            if message.weight != 1:
                turn["weight"] = message.weight
            turns.append(turn)
        row = {"messages": turns}
    row.update((key, value) for key, value in example.fields.items() if key not in row)
    return row


def write_jsonl(examples: Iterable[Example], path: Path | str) -> Path:
    """Write examples as JSON Lines (messages / text format, fields kept), atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w", encoding="utf-8") as out:
        for example in examples:
            out.write(json.dumps(example_row(example), ensure_ascii=False) + "\n")
    return path
