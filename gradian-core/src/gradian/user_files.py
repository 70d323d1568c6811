"""Read a file the user pointed at without trusting it: regular files only, bounded size and depth, named in every error.

Every reader of user JSON / YAML / JSON Lines goes through here, so a device (/dev/zero), a FIFO, a symlink loop,
a file nested 100,000 deep or a lone UTF-16 surrogate becomes one line that names the file, never a traceback,
a hang or an unbounded read.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from gradian.errors import GradianError

# Config-like files (adapter_config.json, trainer_state.json, manifests, reports, --config) are kilobytes;
# 256 MiB leaves room for a trainer_state.json of millions of steps while refusing runaway inputs.
DOCUMENT_LIMIT = 256 * 1024**2
# Datasets are read into memory whole (several copies while parsing), so the cap is what a workstation can hold
# several times over; GRADIAN_MAX_DATASET_BYTES raises it for the rare larger one.
DATASET_LIMIT = int(os.environ.get("GRADIAN_MAX_DATASET_BYTES", 4 * 1024**3))
# Real configs and rows nest a handful of levels; 100 keeps every later recursive walk (json.dumps, to_plain,
# deepcopy) far from Python's recursion limit, wherever on the stack it runs.
DEPTH_LIMIT = 100
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def absent(path: Path | str) -> str:
    """Why ``path`` cannot be opened, to follow its name: a symlink loop, a dangling link, or plain absence."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symlink loop"
        if os.path.islink(path):
            return f"is a symlink to {os.readlink(path)}, which does not exist"
        if exc.errno == errno.ENOTDIR:
            return "does not exist (a part of the path is a file)"
        if exc.errno not in (errno.ENOENT,):
            return f"cannot be read ({exc.strerror})"
        return "does not exist"
    return "exists"


def check_regular_file(path: Path, what: str, error: type[GradianError] = GradianError, *,
                       limit: int = DOCUMENT_LIMIT, hint: str = "") -> int:
    """The size of ``path``; ``error`` when it is missing, a loop, a directory, a device/FIFO, unreadable or too big."""
    try:
        info = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(f"{what} {path} is a symlink loop", "point the link at a real file") from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise error(f"{what} {path} does not exist", hint or "check the path") from None
        raise error(f"{what} {path} cannot be read ({exc.strerror})", "check the file's permissions") from None
    if stat.S_ISDIR(info.st_mode):
        raise error(f"{what} {path} is a directory, not a file", hint or "pass the file inside it")
    if not stat.S_ISREG(info.st_mode):
        # /dev/zero or a FIFO never ends: reading it would fill memory or block forever.
        raise error(f"{what} {path} is not a regular file (a device, FIFO or socket)", "pass a regular file")
    if info.st_size > limit:
        raise error(f"{what} {path} is {info.st_size / 1024**2:.0f} MiB, over the {limit / 1024**2:.0f} MiB limit",
                    hint or "is this the right file?")
    return info.st_size


def read_bytes(path: Path, what: str, error: type[GradianError] = GradianError, *,
               limit: int = DOCUMENT_LIMIT, hint: str = "") -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ``error`` naming the file otherwise."""
    check_regular_file(path, what, error, limit=limit, hint=hint)
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)  # the file may have grown since stat
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({exc.strerror})", "check the file's permissions") from None
    if len(data) > limit:
        raise error(f"{what} {path} is over the {limit / 1024**2:.0f} MiB limit", hint or "is this the right file?")
    return data


def read_text(path: Path, what: str, error: type[GradianError] = GradianError, *,
              limit: int = DOCUMENT_LIMIT, hint: str = "") -> str:
    """The UTF-8 text of a regular file (a BOM is dropped); ``error`` naming the file and line when not UTF-8."""
    data = read_bytes(path, what, error, limit=limit, hint=hint)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error(f"{path}:{line}: {what} is not UTF-8 text (byte 0x{data[exc.start]:02x})",
                    hint or "re-save the file as UTF-8") from None


def value_problem(value: Any, text: str = "", depth_limit: int = DEPTH_LIMIT) -> str | None:
    """Why a parsed JSON/YAML value is unsafe to use (too deep, a lone surrogate), or None; ``text`` is its source."""
    # Cheap pre-checks on the source text keep the walk off the common path: a value can only be deep if its
    # text has that many brackets, and a lone surrogate can only come from a \\uD8xx-\\uDFxx escape.
    walk_depth = not text or text.count("[") + text.count("{") >= depth_limit
    walk_strings = not text or _SURROGATE_ESCAPE.search(text) is not None
    if not (walk_depth or walk_strings):
        return None
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen: set[int] = set()
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if walk_strings and not _encodable(item):
                return "holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair)"
            continue
        if not isinstance(item, (dict, list, tuple)):
            continue
        if depth > depth_limit:
            return f"is nested more than {depth_limit} levels deep"
        if id(item) in seen:  # YAML aliases share one object; walk it once
            continue
        seen.add(id(item))
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_json(text: str, path: Path, what: str, error: type[GradianError] = GradianError, *, hint: str = "") -> Any:
    """Parse JSON text from ``path``; ``error`` naming file:line when invalid, too deep or holding a lone surrogate."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})",
                    hint or f"fix {path.name} or restore it") from None
    except RecursionError:
        raise error(f"{path}: nested too deep to read", "is this the right file?") from None
    except ValueError as exc:  # an integer past Python's 4300-digit conversion limit
        raise error(f"{path}: {' '.join(str(exc).split())}", "is this the right file?") from None
    problem = value_problem(value, text)
    if problem:
        raise error(f"{path}: the {what} {problem}", "is this the right file?")
    return value


def parse_yaml(text: str, path: Path, what: str, error: type[GradianError] = GradianError, *, hint: str = "") -> Any:
    """Parse plain YAML (no tags that build objects); ``error`` naming file:line when invalid, too deep or tagged."""
    try:
        value = yaml.safe_load(text)
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        tag = f" {exc.problem.split()[-1]}" if exc.problem and "tag" in exc.problem else ""
        tag = tag.replace("'", "").replace("tag:yaml.org,2002:", "!!")
        raise error(f"{where}: {what} uses a YAML tag{tag} that builds a Python object, which gradian never loads",
                    "write plain YAML values (strings, numbers, lists, mappings)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise error(f"{where}: not valid YAML", hint or "fix the YAML syntax at that line") from None
    except RecursionError:
        raise error(f"{path}: nested too deep to read", "is this the right file?") from None
    except ValueError as exc:  # an integer past Python's 4300-digit conversion limit
        raise error(f"{path}: {' '.join(str(exc).split())}", "is this the right file?") from None
    problem = value_problem(value)
    if problem:
        raise error(f"{path}: the {what} {problem}", "is this the right file?")
    return value


def load_json(path: Path, what: str, error: type[GradianError] = GradianError, *,
              limit: int = DOCUMENT_LIMIT, hint: str = "") -> Any:
    """Read and parse a JSON file the user supplied, with every guard of this module."""
    path = Path(path)
    return parse_json(read_text(path, what, error, limit=limit, hint=hint), path, what, error, hint=hint)


def load_yaml(path: Path, what: str, error: type[GradianError] = GradianError, *,
              limit: int = DOCUMENT_LIMIT, hint: str = "") -> Any:
    """Read and parse a YAML file the user supplied, with every guard of this module."""
    path = Path(path)
    return parse_yaml(read_text(path, what, error, limit=limit, hint=hint), path, what, error, hint=hint)
