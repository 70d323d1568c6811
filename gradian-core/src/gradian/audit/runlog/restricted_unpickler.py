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

# torch's legacy (pre-1.6, non-zip) format starts with this magic number, then protocol and sys info.
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


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
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            if not names:
                raise pickle.UnpicklingError("zip archive without a data.pkl (not written by torch.save)")
            return loads_restricted(archive.read(names[0]))
    return loads_restricted(path.read_bytes())


def to_plain(obj: Any) -> Any:
    """Turn stubs into plain Python data: enum-like ``Cls('value')`` into its value, objects into dicts."""
    if isinstance(obj, PickledObject):
        if not len(obj) and len(obj.args) == 1 and not isinstance(obj.args[0], PickledObject):
            return to_plain(obj.args[0])  # enum members and similar single-value wrappers
        plain = {str(k): to_plain(v) for k, v in obj.items()}
        return plain
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, (int, float, str)) else k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((to_plain(v) for v in obj), key=repr)
    if isinstance(obj, bytes):
        return obj.decode("latin-1")
    return obj


def class_name(obj: Any) -> str:
    """The dotted class name a stub stood for (``type(obj).__name__`` for plain data)."""
    return obj.qualname if isinstance(obj, PickledObject) else type(obj).__name__
