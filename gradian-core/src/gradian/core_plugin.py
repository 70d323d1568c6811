"""Gradian-core's own plugin: the built-in codecs and run-log readers, registered like any other."""

from __future__ import annotations

from gradian.hookspecs import hookimpl
from gradian.records import load_object

# Named as "module:attr" strings, imported only when a hook is called, so loading plugins stays light.
BUILTIN_CODECS: tuple[str, ...] = ("gradian.index.codecs.npy:NPY_CODEC",)
BUILTIN_READERS: tuple[str, ...] = (
    "gradian.runs.hf_trainer:READER",
    "gradian.runs.axolotl:READER",
    "gradian.runs.llamafactory:READER",
    "gradian.runs.plain:READER",
)


@hookimpl
def gradian_storage_codecs():
    """The storage codecs that ship with gradian-core."""
    return [load_object(target) for target in BUILTIN_CODECS]


@hookimpl
def gradian_run_log_readers():
    """The run-log readers that ship with gradian-core."""
    return [load_object(target) for target in BUILTIN_READERS]
