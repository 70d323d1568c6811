"""Hostile files written in code: each kind puts one bad thing where a command expects a user file."""

from __future__ import annotations

import io
import os
import random
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

Writer = Callable[[Path], None]


def _bytes(data: bytes) -> Writer:
    return lambda path: path.write_bytes(data)


def _text(text: str) -> Writer:
    return lambda path: path.write_text(text, encoding="utf-8")


def _directory(path: Path) -> None:
    path.mkdir()


def _fifo(path: Path) -> None:
    os.mkfifo(path)  # reading it would block forever


def _link(target: str) -> Writer:
    return lambda path: path.symlink_to(target)


def _loop(path: Path) -> None:
    path.symlink_to(path.name)


def _sparse(path: Path) -> None:
    with open(path, "wb") as handle:  # 5 GiB on the size check, no blocks on disk
        handle.truncate(5 * 1024**3)


def _random(path: Path) -> None:
    path.write_bytes(random.Random(14).randbytes(4096))


_LAUGHS = "".join(f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]\n" for i in range(1, 31))

# Every kind of bad file the corpus puts in each slot.
FILE_KINDS: dict[str, Writer] = {
    "empty": _bytes(b""),
    "whitespace": _bytes(b" \n\t\n"),
    "nul_bytes": _bytes(b"\x00" * 64),
    "not_utf8": _bytes(b'{"a": "\xff\xfe"}\n'),
    "bom_only": _bytes(b"\xef\xbb\xbf"),
    "deep_array": _text("[" * 100_000 + "]" * 100_000),
    "deep_object": _text('{"a":' * 100_000 + "1" + "}" * 100_000),
    "deep_500": _text('{"a":' * 500 + "1" + "}" * 500),
    "lone_surrogate": _text('{"messages": [{"role": "user", "content": "\\ud800"}], "\\udfff": 1}\n'),
    "truncated": _text('{"a": [1, 2'),
    "json_null": _text("null"),
    "json_string": _text('"hello"'),
    "json_ints": _text("[1, 2, 3]"),
    "huge_float": _text('{"a": 1e999999}'),
    "huge_int": _text('{"a": ' + "9" * 5000 + "}"),
    "yaml_python_tag": _text('!!python/object/apply:os.system ["echo pwned"]\n'),
    "yaml_deep": _text("a: " + "[" * 100_000 + "\n"),
    "yaml_laughs": _text("l0: &l0 [x, x]\n" + _LAUGHS),
    "random_binary": _random,
    "directory": _directory,
    "fifo": _fifo,
    "dev_zero": _link("/dev/zero"),
    "symlink_loop": _loop,
    "dangling_link": _link("no-such-target"),
    "oversized_sparse": _sparse,
}


# Pickles are written opcode by opcode: pickle.dumps itself recurses without end on these shapes.
_SELF_LIST = b"]q\x00(K\x01h\x00e"  # a = [1, a]
_DEEP_LIST = b"]" * 100_000 + b"a" * 99_999  # [[[...]]] 100,000 deep
# a = [1]; then 40 times a = [a, a]: 430 bytes that expand to 2**40 objects
_DOUBLING = b"]K\x01aq\x000" + b"](h\x00h\x00eq\x000" * 40 + b"h\x00"


def _string(text: str) -> bytes:
    return b"X" + struct.pack("<I", len(text)) + text.encode()


def _top(value: bytes) -> Writer:
    return _bytes(b"\x80\x02" + value + b".")


def _training_args(value: bytes) -> Writer:
    """A TrainingArguments as transformers pickles it, with one extra field holding ``value``."""
    head = b"\x80\x02ctransformers.training_args\nTrainingArguments\n)\x81}("
    fields = (_string("learning_rate") + b"G" + struct.pack(">d", 2e-4) + _string("output_dir") + _string("out")
              + _string("hostile"))
    return _bytes(head + fields + value + b"ub.")


def _zip_bomb(path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", b"\x00" * (80 * 1024**2))  # inflates past the pickle cap
    path.write_bytes(buffer.getvalue())


# training_args.bin kinds: the unpickler must neither loop, recurse without end nor expand 2**40 objects.
PICKLE_KINDS: dict[str, Writer] = {
    "self_list": _top(_SELF_LIST),
    "deep_list": _top(_DEEP_LIST),
    "doubling_40": _top(_DOUBLING),
    "args_self_list": _training_args(_SELF_LIST),
    "args_deep_list": _training_args(_DEEP_LIST),
    "args_doubling_40": _training_args(_DOUBLING),
    "truncated_pickle": lambda path: path.write_bytes(b"\x80\x02ctransformers.training_args\nTrainingArguments\n)\x81}("),
    "zip_bomb": _zip_bomb,
    "unhashable_set": _bytes(b"\x80\x02c__builtin__\nset\n]]a\x85R."),
}
