"""The dataset layer: five row formats normalized to Examples, and ``encode()``, THE loss mask.

Importing this package never imports torch or transformers: a tokenizer is passed in, and ``datasets`` /
``pyarrow`` are imported only to read a save_to_disk directory or a parquet file.
"""

from __future__ import annotations

from gradian.data.encode import IGNORE_INDEX, Encoded, encode, encode_answer, encode_prompt
from gradian.data.examples import FORMATS, ROLES, Example, Message, make_example
from gradian.data.loading import (
    Dataset,
    DatasetRowError,
    DatasetScan,
    load_dataset,
    load_eval_dataset,
    scan_dataset,
    write_jsonl,
)

__all__ = [
    "FORMATS",
    "IGNORE_INDEX",
    "ROLES",
    "Dataset",
    "DatasetRowError",
    "DatasetScan",
    "Encoded",
    "Example",
    "Message",
    "encode",
    "encode_answer",
    "encode_prompt",
    "load_dataset",
    "load_eval_dataset",
    "make_example",
    "scan_dataset",
    "write_jsonl",
]
