"""Read a pickle (plain, or torch.save's zip archive) into plain data without executing anything.

``training_args.bin`` is ``torch.save(TrainingArguments)``: a pickle that names classes from
transformers (and trl, unsloth, ...). A normal unpickler imports those modules and calls whatever the
pickle says to call, which is how a malicious file runs code. This one never imports a module and never
calls a global: every global the pickle names becomes a :class:`PickledObject`, a plain dict that only
remembers the dotted name it stood for, the arguments it would have been called with and the state
it would have received. Nothing the file says is ever executed.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

from gradian.errors import RunDirError
from gradian.user_files import read_bytes

# training_args.bin is a few KiB; a pickle past this is not one, and reading it whole would only cost memory.
PICKLE_LIMIT = 64 * 1024**2
# A TrainingArguments is ~150 fields, a few levels deep; these caps are far above any real one.
MAX_NODES = 100_000
MAX_DEPTH = 50

# torch's legacy (pre-1.6, non-zip) format starts with this magic number, then protocol and sys info.
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


class PickleTooComplexError(pickle.UnpicklingError):
    """A pickle whose objects refer to themselves, nest too deep or expand past the node cap."""


class PickledObject(dict):
    """Stands in for an instance of a class the pickle named; its state lives in the dict itself."""

    qualname = "?"
    args: tuple[Any, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Called by REDUCE (``cls(*args)``): remember the arguments, run nothing.
        super().__init__()
        self.args = tuple(args) + tuple(kwargs.items())

    def __setstate__(self, state: Any) -> None:
        """BUILD: keep the state as dict items (a (dict, slots) pair is merged)."""
        if isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
            for part in state:
                self.update(part or {})
        elif isinstance(state, dict):
            self.update(state)
        else:
            self["__state__"] = state

    def __reduce__(self) -> Any:  # never re-pickled as the original class
        return (dict, (dict(self),))

    def __repr__(self) -> str:
        return f"<{self.qualname} {dict.__repr__(self)}>"


_stub_classes: dict[str, type[PickledObject]] = {}


def _stub_class(module: str, name: str) -> type[PickledObject]:
    """A PickledObject subclass named after the global; ``cls.__new__`` (NEWOBJ) then builds a dict."""
    qualname = f"{module}.{name}"
    if qualname not in _stub_classes:
        _stub_classes[qualname] = type(name, (PickledObject,), {"qualname": qualname, "__module__": "pickled." + module})
    return _stub_classes[qualname]


def _safe_reconstructor(cls: Any, base: Any, state: Any = None) -> Any:
    """copyreg._reconstructor without the call to ``base.__new__``: an empty stub of ``cls``."""
    return cls() if isinstance(cls, type) and issubclass(cls, PickledObject) else PickledObject()


# Pure data constructors that run no user code; everything else becomes a stub.
_SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("collections", "OrderedDict"): dict,
    ("copyreg", "_reconstructor"): _safe_reconstructor,
}


class RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler whose ``find_class`` imports nothing and whose persistent ids load no storage."""

    def find_class(self, module: str, name: str) -> Any:
        """Every global becomes an inert stub class (a handful of pure-data builtins excepted)."""
        return _SAFE_GLOBALS.get((module, name)) or _stub_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        """torch tensors' storages are referenced by persistent id; they are never read."""
        return PickledObject("persistent", repr(pid)[:80])


def loads_restricted(data: bytes) -> Any:
    """Unpickle bytes with :class:`RestrictedUnpickler`; the torch legacy header is skipped."""
    stream = io.BytesIO(data)
    obj = RestrictedUnpickler(stream).load()
    if obj == TORCH_LEGACY_MAGIC:  # legacy torch.save: magic, protocol version, sys info, then the object
        RestrictedUnpickler(stream).load()
        RestrictedUnpickler(stream).load()
        obj = RestrictedUnpickler(stream).load()
    return obj


def load_restricted(path: Path) -> Any:
    """Read a pickle file, or the ``data.pkl`` inside torch.save's zip archive, without executing it."""
    path = Path(path)
    data = read_bytes(path, "pickle", RunDirError, limit=PICKLE_LIMIT)  # a regular file of bounded size
    if zipfile.is_zipfile(io.BytesIO(data)):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = [n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            if not names:
                raise pickle.UnpicklingError("zip archive without a data.pkl (not written by torch.save)")
            if archive.getinfo(names[0]).file_size > PICKLE_LIMIT:  # a zip bomb inflates past any real one
                raise PickleTooComplexError(f"data.pkl inflates to over {PICKLE_LIMIT // 1024**2} MiB")
            return loads_restricted(archive.read(names[0]))
    return loads_restricted(data)


def to_plain(obj: Any, *, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> Any:
    """Turn stubs into plain Python data: enum-like ``Cls('value')`` into its value, objects into dicts.

    A pickle's memo lets 430 bytes describe a structure that refers to itself or expands to 2**40 objects,
    so the walk tracks the ids on its path and counts every object it expands; past either cap it raises
    PickleTooComplexError instead of looping, recursing without end or filling memory.
    """
    return _Plainer(max_nodes, max_depth).plain(obj, 0)


class _Plainer:
    """One to_plain walk: the ids on the current path (cycles) and the objects left to expand (size)."""

    def __init__(self, max_nodes: int, max_depth: int) -> None:
        self.left = max_nodes
        self.max_nodes = max_nodes
        self.max_depth = max_depth
        self.on_path: set[int] = set()

    def plain(self, obj: Any, depth: int) -> Any:
        self.left -= 1
        if self.left < 0:
            raise PickleTooComplexError(f"expands to more than {self.max_nodes:,} objects")
        if not isinstance(obj, (dict, list, tuple, set, frozenset)):  # PickledObject is a dict
            return obj.decode("latin-1") if isinstance(obj, bytes) else obj
        if depth >= self.max_depth:
            raise PickleTooComplexError(f"is nested more than {self.max_depth} levels deep")
        if id(obj) in self.on_path:
            raise PickleTooComplexError("holds an object that contains itself")
        self.on_path.add(id(obj))
        try:
            return self._container(obj, depth + 1)
        finally:
            self.on_path.discard(id(obj))

    def _container(self, obj: Any, depth: int) -> Any:
        if isinstance(obj, PickledObject):
            if not len(obj) and len(obj.args) == 1 and not isinstance(obj.args[0], PickledObject):
                return self.plain(obj.args[0], depth)  # enum members and similar single-value wrappers
            return {str(k): self.plain(v, depth) for k, v in obj.items()}
        if isinstance(obj, dict):
            return {str(k) if not isinstance(k, (int, float, str)) else k: self.plain(v, depth) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.plain(v, depth) for v in obj]
        return sorted((self.plain(v, depth) for v in obj), key=repr)


def class_name(obj: Any) -> str:
    """The dotted class name a stub stood for (``type(obj).__name__`` for plain data)."""
    return obj.qualname if isinstance(obj, PickledObject) else type(obj).__name__
