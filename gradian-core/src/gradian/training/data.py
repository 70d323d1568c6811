"""The training set every backend trains on: examples encoded by ``gradian.data.encode`` (THE mask), padded by one collator."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gradian.data import encode, load_dataset
from gradian.data.examples import Example, example_id
from gradian.data.loss_mask import concrete_encoding
from gradian.errors import DatasetError, TrainingError
from gradian.records import TrainJob

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100


@dataclass(frozen=True)
class EncodedExample:
    """One training example as token ids and labels (-100 outside the supervised tokens)."""

    id: str
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]

    @property
    def supervised_tokens(self) -> int:
        """How many tokens the loss trains on (the first label never counts: nothing predicts it)."""
        return sum(1 for label in self.labels[1:] if label != IGNORE_INDEX)


@dataclass(frozen=True)
class EncodedSet:
    """The encoded examples a job trains on, in dataset order, and what was left out and why."""

    examples: tuple[EncodedExample, ...]
    dropped_ids: tuple[str, ...] = ()  # removed on request (job.drop_ids)
    unsupervised_ids: tuple[str, ...] = ()  # no supervised token after encode(): nothing to train on

    def __len__(self) -> int:
        return len(self.examples)

    def notes(self) -> tuple[str, ...]:
        """One line per thing a user should know about what was trained on."""
        notes = []
        if self.dropped_ids:
            notes.append(f"dropped {len(self.dropped_ids)} examples as asked")
        if self.unsupervised_ids:
            shown = ", ".join(self.unsupervised_ids[:3]) + (", ..." if len(self.unsupervised_ids) > 3 else "")
            notes.append(
                f"skipped {len(self.unsupervised_ids)} examples with no supervised token after encoding ({shown}); "
                "gradian diagnose reports them as all_labels_masked"
            )
        return tuple(notes)


def training_examples(job: TrainJob) -> tuple[list[Example], tuple[str, ...]]:
    """The job's examples in order (dataset minus drop_ids, then extra datasets) and the ids dropped."""
    examples = list(load_dataset(job.dataset))
    for extra in job.extra_datasets:
        # Positions continue across files, as if the extras were appended to the dataset: each file's own ids
        # restart at ex-000000, so the same row in two files (or one file passed twice) would share an id.
        examples.extend(_renumbered(load_dataset(extra), offset=len(examples)))
    known = {example.id for example in examples}
    unknown = sorted(set(job.drop_ids) - known)
    if unknown:
        shown = ", ".join(unknown[:3]) + (", ..." if len(unknown) > 3 else "")
        raise DatasetError(
            f"{len(unknown)} ids to drop are not in {job.dataset}: {shown}",
            "ids embed the position and content hash (ex-000123-1a2b3c4d); take them from a report on this exact dataset",
        )
    kept = [example for example in examples if example.id not in job.drop_ids]
    dropped = tuple(example.id for example in examples if example.id in job.drop_ids)
    if not kept:
        raise TrainingError(f"nothing left to train on in {job.dataset}", "drop fewer examples")
    return kept, dropped


def check_training_data(job: TrainJob) -> int:
    """Read and validate the job's data before any model loads; refuse data that has nothing to learn.

    Returns how many examples the job trains on. Every row is parsed (a bad row is refused with file:line), the
    ids to drop are checked, and a dataset whose every supervised turn is empty (or that has no supervised turn
    at all) is refused: trained on, it teaches the model only to end its turn at once.
    """
    examples, _ = training_examples(job)
    if any(_has_an_answer(example) for example in examples):
        return len(examples)
    supervised = sum(1 for example in examples if example.text is not None
                     or any(message.supervised for message in example.messages))
    where = job.dataset if not job.extra_datasets else f"{job.dataset} (and {len(job.extra_datasets)} more files)"
    if supervised:
        raise DatasetError(
            f"every assistant turn in {where} is empty ({len(examples)} examples): training would teach the model "
            "only to end its turn at once",
            f"write the answers, or list the rows with gradian diagnose --dataset {job.dataset}")
    raise DatasetError(
        f"no example in {where} has an assistant turn to train on ({len(examples)} examples; turns with "
        "weight 0 are not trained on)",
        f"end each conversation with the assistant's answer, or list the rows with gradian diagnose --dataset {job.dataset}")


def _has_an_answer(example: Example) -> bool:
    """Whether the example supervises some text: a non-blank text row, or a non-blank supervised assistant turn."""
    if example.text is not None:
        return bool(example.text.strip())
    return any(message.supervised and message.content.strip() for message in example.messages)


def _renumbered(examples: Sequence[Example], offset: int) -> list[Example]:
    """The examples with positions (and the ids that embed them) shifted by ``offset``."""
    return [dataclasses.replace(example, index=offset + position, id=example_id(offset + position, example.content_sha256))
            for position, example in enumerate(examples)]


def encode_training_set(job: TrainJob, tokenizer: PreTrainedTokenizerBase) -> EncodedSet:
    """Load, filter and encode the job's examples with gradian's own encode() at train.max_seq_length.

    The loss mask and string-pair rendering are ``grads.loss_mask`` / ``string_pairs`` made concrete (``auto`` without
    a run: assistant turns, template), so verify's and inject's retraining, whose config comes from the report, train
    on the tokens the attributed run trained on.
    """
    examples, dropped = training_examples(job)
    max_len = job.config.train.max_seq_length
    encoding = concrete_encoding(job.config.grads)
    encoded, unsupervised = [], []
    for example in examples:
        result = encode(example, tokenizer, max_len, **encoding)
        item = EncodedExample(example.id, _ints(result.input_ids), _ints(result.labels))
        if len(item.input_ids) != len(item.labels):
            raise TrainingError(f"{example.id}: encode() returned {len(item.input_ids)} ids and {len(item.labels)} labels")
        if item.supervised_tokens == 0:
            unsupervised.append(example.id)  # contributes no loss; a batch of only these would divide by zero
            continue
        encoded.append(item)
    if not encoded:
        raise TrainingError(
            f"no example in {job.dataset} has a supervised token after encoding at train.max_seq_length={max_len}",
            "run gradian diagnose on the dataset, or raise train.max_seq_length",
        )
    return EncodedSet(tuple(encoded), dropped, tuple(unsupervised))


def _ints(values: Any) -> tuple[int, ...]:
    if hasattr(values, "tolist"):
        values = values.tolist()
    return tuple(int(v) for v in values)


class EncodedDataset:
    """A map-style dataset of ``{"input_ids", "labels"}`` rows, what transformers.Trainer's DataLoader reads."""

    def __init__(self, encoded: EncodedSet | Sequence[EncodedExample]) -> None:
        self.examples = tuple(encoded.examples if isinstance(encoded, EncodedSet) else encoded)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        example = self.examples[index]
        return {"input_ids": list(example.input_ids), "labels": list(example.labels)}


@dataclass(frozen=True)
class PaddingCollator:
    """Right-pads a batch: input_ids with the pad id, labels with -100, and an attention mask of the real tokens."""

    pad_token_id: int

    def __call__(self, rows: Sequence[dict[str, Sequence[int]]]) -> dict[str, torch.Tensor]:
        import torch

        width = max(len(row["input_ids"]) for row in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            input_ids[i, :n] = torch.tensor(list(row["input_ids"]), dtype=torch.long)
            labels[i, :n] = torch.tensor(list(row["labels"]), dtype=torch.long)
            attention_mask[i, :n] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
