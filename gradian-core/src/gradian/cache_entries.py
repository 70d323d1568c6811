"""What the cache dir holds (gradient indexes, converted models, half-built dirs, demo work dirs) and their removal.

Each entry is one directory Gradian wrote under ``cache_dir()``. Anything else found there is listed as ``other``
and never removed, symlinks are never followed, and a removed entry is first renamed out of the way, so a reader
never sees half an index and an interrupted removal leaves a dir the next listing shows as half-built.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gradian.attribution.kronecker_eigen import dead_partials
from gradian.cache import cache_dir
from gradian.errors import GradianError, GradientIndexError
from gradian.index.manifest import MANIFEST_NAME, Manifest, read_manifest
from gradian.model.embedded import PROVENANCE_FILE, is_complete

INDEXES, MODELS, DEMO = "indexes", "models", "demo"
KINDS = ("index", "model", "partial", "demo", "other")
# What a demo work dir holds (gradian/demo/run.py DemoPaths); a dir with anything else is not one of ours.
DEMO_PARTS = frozenset({"scenario", "train", "index", "report"})
_REMOVING = ".removing-"
_AGE = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[a-zA-Z]*)\s*$")
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
AGE_HINT = "give a number and a unit, one of s, m, h, d, w: --older-than 7d, 12h or 30m"


@dataclass(frozen=True)
class IndexSummary:
    """What an index's manifest says about it: its shape and what it was built from."""

    index_id: str
    num_examples: int
    dim: int
    projected: bool
    storage_dtype: str
    created_at: str | None
    base_model: str | None
    adapter: str | None
    dataset: str | None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for ``--format json``."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class CacheEntry:
    """One directory (or stray file) in the cache dir, its size, its age and what it is."""

    kind: str  # one of KINDS
    path: Path
    id: str  # the index id of an index or half-built index, else the dir name (the path in the cache dir for other)
    size_bytes: int
    newest_mtime: float  # newest mtime of the entry and everything in it, in seconds since the epoch
    note: str = ""  # what it holds, for entries that are not indexes
    built_from: str = ""  # what it was made from, for entries that are not indexes (an index has its summary)
    index: IndexSummary | None = None

    @property
    def removable(self) -> bool:
        """Whether prune may delete it: every kind Gradian recognises as its own."""
        return self.kind != "other"

    @property
    def timestamp(self) -> float:
        """What its age is measured from: the manifest's created time for an index, else the newest mtime."""
        created = _epoch(self.index.created_at) if self.index is not None else None
        return created if created is not None else self.newest_mtime

    def age_seconds(self, now: float | None = None) -> float:
        """Seconds since ``timestamp``."""
        return max(0.0, (time.time() if now is None else now) - self.timestamp)

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        """Plain dict for ``--format json``."""
        return {"kind": self.kind, "id": self.id, "path": str(self.path), "size_bytes": self.size_bytes,
                "newest_mtime": _iso(self.newest_mtime), "age_seconds": round(self.age_seconds(now)),
                "removable": self.removable, "note": self.note, "built_from": self.built_from,
                "index": self.index.to_dict() if self.index is not None else None}


def list_entries(root: Path | None = None) -> list[CacheEntry]:
    """Every entry under the cache dir (``cache_dir()`` by default), in path order."""
    if root is None:
        root = cache_dir()
    root = Path(root)
    if not root.is_dir():
        return []
    readers = {INDEXES: _index_entries, MODELS: _model_entries, DEMO: _demo_entries}
    entries: list[CacheEntry] = []
    for child in sorted(root.iterdir()):
        reader = readers.get(child.name)
        if reader is None or child.is_symlink() or not child.is_dir():
            entries.append(_entry("other", child, root))
        else:
            entries.extend(reader(child, root))
    return entries


def parse_age(text: str) -> float:
    """Seconds in an age like ``7d``, ``12h``, ``30m``; GradianError for anything else."""
    match = _AGE.match(text)
    if match is None:
        raise GradianError(f"--older-than {text!r} is not an age", AGE_HINT)
    unit = match["unit"].lower()
    if unit not in AGE_UNITS:
        what = f"has an unknown unit {match['unit']!r}" if unit else "has no unit"
        raise GradianError(f"--older-than {text!r} {what}", AGE_HINT)
    return float(match["number"]) * AGE_UNITS[unit]


def select_entries(entries: Sequence[CacheEntry], *, older_than: float | None = None, ids: Sequence[str] = (),
                   partial: bool = False, everything: bool = False, now: float | None = None) -> list[CacheEntry]:
    """The removable entries a prune asks for: the union of --id, --partial and --all, then --older-than."""
    if older_than is None and not ids and not partial and not everything:
        raise GradianError("gradian cache prune needs something to select",
                           "pass --older-than AGE, --id ID_PREFIX, --partial or --all (add --dry-run to see first)")
    removable = [entry for entry in entries if entry.removable]
    if everything or (not ids and not partial):
        chosen = list(removable)  # --all, or --older-than alone: every entry, filtered by age below
    else:
        chosen = [entry for entry in removable if partial and entry.kind == "partial"]
        for prefix in ids:
            chosen += [entry for entry in match_id(removable, prefix) if entry not in chosen]
    if older_than is not None:
        chosen = [entry for entry in chosen if entry.age_seconds(now) > older_than]
    return sorted(chosen, key=lambda entry: str(entry.path))


def match_id(entries: Sequence[CacheEntry], prefix: str) -> list[CacheEntry]:
    """The entries whose id starts with ``prefix``; GradianError when none or more than one id does."""
    text = prefix.strip()
    found = [entry for entry in entries if text and entry.id.startswith(text)]
    exact = [entry for entry in found if entry.id == text]
    ids = sorted({entry.id for entry in (exact or found)})
    if not ids:
        raise GradianError(f"--id {prefix!r} matches no cache entry Gradian can remove",
                           "`gradian cache list` shows the ids")
    if len(ids) > 1:
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        raise GradianError(f"--id {prefix!r} is ambiguous: it matches {len(ids)} entries ({shown})",
                           "give more characters of the id")
    return exact or found


def remove_entries(entries: Iterable[CacheEntry], root: Path) -> tuple[list[CacheEntry], list[tuple[CacheEntry, str]]]:
    """Delete entries (each renamed out of the way first); the removed ones, and the ones that failed with why."""
    root = Path(root).resolve()
    removed: list[CacheEntry] = []
    failed: list[tuple[CacheEntry, str]] = []
    for entry in entries:
        if any(entry.path.is_relative_to(gone.path) for gone in removed):
            removed.append(entry)  # inside an entry already removed: a fit in a removed index
            continue
        try:
            _remove(entry, root)
        except OSError as error:
            failed.append((entry, error.strerror or str(error)))
        else:
            removed.append(entry)
    return removed, failed


def _remove(entry: CacheEntry, root: Path) -> None:
    path = entry.path
    if not entry.removable:
        raise OSError(f"{path} is not an entry Gradian recognises")
    # Checked again at removal time: a real dir (or a fit's file) whose real parent is inside the cache dir.
    if path.is_symlink() or not (path.is_dir() or path.is_file()) or not path.parent.resolve().is_relative_to(root):
        raise OSError(f"{path} is no longer inside {root}")
    if path.is_file():
        path.unlink()  # one file is gone at once: no half of it for a reader to see
        return
    doomed = path.parent / f".{path.name.lstrip('.')}{_REMOVING}{secrets.token_hex(4)}"
    os.rename(path, doomed)
    shutil.rmtree(doomed)


# --- readers of the three directories Gradian writes -------------------------------------------------


def _index_entries(directory: Path, root: Path) -> list[CacheEntry]:
    """``indexes/<id>`` (finished), ``.<id>.partial`` (a build in progress or killed), leftovers of a swap, and the
    half-written Kronecker fits a killed attribute leaves inside a finished index."""
    entries = []
    for child in sorted(directory.iterdir()):
        name = child.name
        if child.is_symlink() or not child.is_dir():
            entries.append(_entry("other", child, root))
        elif leftover := _leftover_note(name):
            entries.append(_entry("partial", child, root, note=leftover))
        elif name.startswith(".") and name.endswith(".partial"):
            shards = sum(1 for _ in child.glob("shard-*.json"))
            entries.append(_entry("partial", child, root, id=name[1:-len(".partial")],
                                  note=f"half-built index, {shards} shard(s) finished"))
        elif (child / MANIFEST_NAME).is_file():
            try:
                summary = _summary(read_manifest(child))
            except GradientIndexError as error:
                entries.append(_entry("index", child, root, id=name, note=f"unreadable: {error.message}"))
            else:
                fits = [_entry("partial", fit, root, note=f"half-written kronecker fit in index {summary.index_id}, "
                                                         "its process gone")
                        for fit in dead_partials(child)]
                index = _entry("index", child, root, id=summary.index_id, index=summary)
                # The index's size leaves out the fits inside it, listed on their own, so the sizes add up.
                entries.append(dataclasses.replace(index, size_bytes=index.size_bytes - sum(f.size_bytes for f in fits)))
                entries.extend(fits)
        else:
            entries.append(_entry("other", child, root))
    return entries


def _model_entries(directory: Path, root: Path) -> list[CacheEntry]:
    """``models/<name>`` (a converted embedded model) and ``.<name>.tmp`` (a conversion that was killed)."""
    entries = []
    for child in sorted(directory.iterdir()):
        if child.is_symlink() or not child.is_dir():
            entries.append(_entry("other", child, root))
        elif leftover := _leftover_note(child.name):
            entries.append(_entry("partial", child, root, note=leftover))
        elif child.name.startswith(".") and child.name.endswith(".tmp"):
            entries.append(_entry("partial", child, root, note="half-finished model conversion"))
        elif (child / PROVENANCE_FILE).is_file() or (child / "config.json").is_file():
            note, built_from = _model_facts(child / PROVENANCE_FILE)
            if not is_complete(child):
                note += " (incomplete: converted again on next use)"
            entries.append(_entry("model", child, root, note=note, built_from=built_from))
        else:
            entries.append(_entry("other", child, root))
    return entries


def _demo_entries(directory: Path, root: Path) -> list[CacheEntry]:
    """``demo/<scenario>-<seed>``: a `gradian demo` work dir (scenario, adapter, index, report)."""
    entries = []
    for child in sorted(directory.iterdir()):
        parts = {part.name for part in child.iterdir()} if child.is_dir() and not child.is_symlink() else None
        if parts is None or not all(_is_demo_part(part) for part in parts):
            entries.append(_entry("other", child, root))
            continue
        note = "gradian demo work dir"
        if (child / "index" / MANIFEST_NAME).is_file():
            note += " (with its gradient index)"
        entries.append(_entry("demo", child, root, note=note))
    return entries


def _is_demo_part(name: str) -> bool:
    """A part of a demo work dir, or what a killed write of one leaves (``.index.partial``, a temp file)."""
    return name in DEMO_PARTS or (name.startswith(".") and name[1:].split(".")[0] in DEMO_PARTS)


def _leftover_note(name: str) -> str:
    """Why a dot-dir is debris of ours: an interrupted index replace or an interrupted prune; '' when it is not."""
    if not name.startswith("."):
        return ""
    if _REMOVING in name:
        return "left by an interrupted gradian cache prune"
    if re.search(r"\.old-\d+$", name):
        return "old copy left by an interrupted index rebuild"
    return ""


def _summary(manifest: Manifest) -> IndexSummary:
    sources = manifest.sources
    return IndexSummary(
        index_id=manifest.index_id, num_examples=manifest.num_examples, dim=manifest.dim,
        projected=manifest.projection is not None, storage_dtype=manifest.storage_dtype,
        created_at=manifest.build.get("created_at"), base_model=sources.get("base_model"),
        adapter=sources.get("adapter"), dataset=sources.get("dataset"),
    )


def _model_facts(provenance: Path) -> tuple[str, str]:
    """(what it holds, what it was converted from), from the provenance file the conversion writes."""
    try:
        data = json.loads(provenance.read_text(encoding="utf-8"))
        return f"converted model {data['hub_id']}, {data['dtype']}", str(data["gguf_file"])
    except (OSError, ValueError, KeyError, TypeError):
        return "converted model", ""


def _entry(kind: str, path: Path, root: Path, *, id: str | None = None, note: str = "", built_from: str = "",
           index: IndexSummary | None = None) -> CacheEntry:
    size, newest = _usage(path)
    # Other entries are named by where they are, since nothing else says what they are.
    name = id or (path.relative_to(root).as_posix() if kind == "other" else path.name)
    return CacheEntry(kind=kind, path=path, id=name, size_bytes=size,
                      newest_mtime=newest, note=note, built_from=built_from, index=index)


def _usage(path: Path) -> tuple[int, float]:
    """Total bytes of the files under ``path`` and the newest mtime there, never following a symlink."""
    try:
        top = path.lstat()
    except OSError:
        return 0, 0.0
    if path.is_symlink() or not path.is_dir():
        return top.st_size, top.st_mtime
    size, newest = 0, top.st_mtime
    for folder, dirs, files in os.walk(path, followlinks=False):
        for names, counted in ((dirs, False), (files, True)):
            for name in names:
                try:
                    info = os.lstat(os.path.join(folder, name))
                except OSError:
                    continue  # removed while we walked
                newest = max(newest, info.st_mtime)
                size += info.st_size if counted else 0
    return size, newest


def _epoch(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds")
