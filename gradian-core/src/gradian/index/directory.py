"""The directories of an index build: the hidden partial directory, finished shards, the final rename.

A build works in ``.<out>.partial`` next to the output. Every file is written to a temp name and renamed
into place, and a small record marks a shard finished only after its data and statistics are; so a build
killed at any point resumes from its finished shards. The output directory appears only when the manifest
is complete, by renaming the partial directory onto it.
"""

from __future__ import annotations

import json
import platform
import shutil
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from gradian.atomic_files import sha256_file, write_text_atomic, write_with
from gradian.errors import GradientIndexError
from gradian.index.codecs.npy import write_npy
from gradian.index.manifest import (
    EXAMPLES_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    STATS_NAME,
    Manifest,
    ShardInfo,
    library_versions,
    read_manifest,
)
from gradian.index.plan import BuildPlan, ExampleMeta
from gradian.index.stats import StatsAccumulator, sum_partials
from gradian.index.store import WHITENING_NAME, Index

BUILD_STATE = "build.json"


def holds_index(out_dir: Path, index_id: str) -> bool:
    """Whether ``out_dir`` holds a finished index with this id (its files are checked when it is opened to reuse)."""
    try:
        return (out_dir / MANIFEST_NAME).is_file() and read_manifest(out_dir).index_id == index_id
    except GradientIndexError:
        return False


def reusable_index(out_dir: Path, index_id: str, say: Callable[[str], None] | None = None) -> Index | None:
    """The index already at ``out_dir`` when it has this id and every file matches its checksum; else None.

    A damaged index of the same inputs (a corrupted shard) is rebuilt, never reported as reused; ``say`` hears why.
    """
    if not holds_index(out_dir, index_id):
        return None  # another index, or none (check_out_dir explains what is wrong with a broken one)
    try:
        index = Index.open(out_dir)
        index.verify_files()
    except GradientIndexError as error:
        if say is not None:
            say(f"the index at {out_dir} is damaged ({error.message}); rebuilding it")
        return None  # damaged: rebuilt and replaced
    index.reused = True
    return index


def check_out_dir(out_dir: Path) -> None:
    """Refuse an output location that holds something other than a gradient index of this format."""
    if out_dir.exists() and not out_dir.is_dir():
        raise GradientIndexError(f"--out {out_dir} is a file, not a directory", "pass a directory path to --out")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not (out_dir / MANIFEST_NAME).is_file():
        raise GradientIndexError(f"--out {out_dir} already exists and is not a gradient index",
                                 "pass a new or empty directory to --out, so nothing of yours is overwritten")
    try:
        data = json.loads((out_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
        version = data.get("format_version") if isinstance(data, dict) else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return  # a damaged index of ours: replaced
    if version != FORMAT_VERSION:
        raise GradientIndexError(
            f"--out {out_dir} holds an index of format version {version}; this gradian writes version {FORMAT_VERSION}",
            "delete that directory or pass another --out",
        )


def refuse_other_inputs(out_dir: Path, dataset_sha256: str | None, adapter: Path | None) -> None:
    """Refuse an --out that holds an index of another dataset or adapter: rebuilding would delete it silently."""
    if not (out_dir / MANIFEST_NAME).is_file():
        return
    try:
        sources = read_manifest(out_dir).sources
    except GradientIndexError:
        return  # a damaged index of ours: check_out_dir and the build replace it
    other = []
    if dataset_sha256 and sources.get("dataset_file_sha256") not in (None, dataset_sha256):
        other.append(f"dataset (it was built from {sources.get('dataset') or '?'})")
    was = sources.get("adapter")
    if adapter is not None and was and Path(was).resolve() != Path(adapter).expanduser().resolve():
        other.append(f"adapter (it was built from {was})")
    if other:
        raise GradientIndexError(f"--out {out_dir} holds an index of another {' and '.join(other)}",
                                 "pass another --out, or --overwrite to replace that index")


def prepare_partial(plan: BuildPlan) -> None:
    """Create or resume the partial directory; a partial build of other inputs is discarded."""
    partial = plan.partial_dir
    state = json.dumps(plan.build_state(), sort_keys=True)
    try:
        if partial.is_dir():
            state_file = partial / BUILD_STATE
            current = state_file.read_text(encoding="utf-8") if state_file.is_file() else None
            if current != state:
                shutil.rmtree(partial)
        partial.mkdir(parents=True, exist_ok=True)
        for leftover in [*partial.glob(".*.tmp"), *partial.glob(".*.scratch")]:
            leftover.unlink(missing_ok=True)  # a killed writer's temp file; never a finished shard
        if not (partial / BUILD_STATE).is_file():
            write_text_atomic(partial / BUILD_STATE, state)
    except OSError as error:
        raise _write_error(plan, f"the build directory {partial}", error) from None


def _write_error(plan: BuildPlan, what: str, error: OSError) -> GradientIndexError:
    reason = error.strerror or str(error) or type(error).__name__
    return GradientIndexError(
        f"could not write {what}: {reason}",
        f"free disk space or pass a writable --out (now {plan.out_dir}); finished shards are kept and the next run "
        "resumes from them",
    )


def shard_names(plan: BuildPlan, number: int) -> tuple[str, str, str]:
    """(data file, statistics file, finished-record file) of one shard."""
    stem = f"shard-{number:05d}"
    return f"{stem}{plan.codec.suffix}", f"stats-{number:05d}.npy", f"{stem}.json"


def finished_shard(plan: BuildPlan, number: int, *, verify: bool = True) -> ShardInfo | None:
    """The record of a finished shard whose files are in place (and match their checksums), else None."""
    data_name, stats_name, record_name = shard_names(plan, number)
    record = plan.partial_dir / record_name
    rows = plan.shard_rows(number)
    try:
        info = ShardInfo.from_dict(json.loads(record.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    if (info.file, info.stats_file, info.start, info.rows) != (data_name, stats_name, rows.start, len(rows)):
        return None
    for name, digest in ((info.file, info.sha256), (info.stats_file, info.stats_sha256)):
        path = plan.partial_dir / name
        if not path.is_file() or (verify and sha256_file(path) != digest):
            return None
    return info


def write_shard(plan: BuildPlan, number: int, stored: np.ndarray, stats: StatsAccumulator) -> ShardInfo:
    """Write a shard's data and statistics atomically, then the record that marks it finished."""
    data_name, stats_name, record_name = shard_names(plan, number)
    partial = plan.partial_dir
    rows = plan.shard_rows(number)
    try:
        write_with(partial / data_name, lambda temp: plan.codec.write(temp, stored))
        write_with(partial / stats_name, lambda temp: write_npy(temp, stats.to_vector()))
        info = ShardInfo(number, data_name, rows.start, len(rows), (partial / data_name).stat().st_size,
                         sha256_file(partial / data_name), stats_name, sha256_file(partial / stats_name))
        write_text_atomic(partial / record_name, json.dumps(info.to_dict(), sort_keys=True))
    except OSError as error:
        raise _write_error(plan, f"shard {data_name} to {partial}", error) from None
    finally:
        if isinstance(stored, np.memmap):
            Path(stored.filename).unlink(missing_ok=True)  # the mapping stays valid until it is released
    return info


# --- the manifest and the final rename -------------------------------------------------------


def finalize(plan: BuildPlan, metas: Sequence[ExampleMeta], timing: dict[str, Any]) -> None:
    """Sum the statistics, write examples, stats and the manifest, and move the index into place."""
    partial = plan.partial_dir
    try:
        shards = []
        for number in range(plan.num_shards):
            # Checked when resumed or just written by its rank; hashing every shard again would read the index twice.
            info = finished_shard(plan, number, verify=False)
            if info is None:
                raise GradientIndexError(f"shard {number} of the build in {partial} is missing or damaged",
                                         "run the same gradian index command again to recompute it")
            shards.append(info)
        total = sum_partials([partial / s.stats_file for s in shards], lambda p: np.load(p, allow_pickle=False))
        write_with(partial / STATS_NAME, lambda temp: write_npy(temp, total))
        write_text_atomic(partial / EXAMPLES_NAME, "".join(m.to_json() + "\n" for m in metas))
        manifest = _manifest(plan, shards, metas, timing)
        write_text_atomic(partial / MANIFEST_NAME, json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n")
        for number in range(plan.num_shards):
            (partial / shard_names(plan, number)[2]).unlink(missing_ok=True)
        (partial / BUILD_STATE).unlink(missing_ok=True)
        _move_into_place(partial, plan.out_dir)
    except OSError as error:
        raise _write_error(plan, f"the index manifest in {partial}", error) from None


def _manifest(plan: BuildPlan, shards: list[ShardInfo], metas: Sequence[ExampleMeta], timing: dict[str, Any]) -> Manifest:
    partial = plan.partial_dir
    versions = library_versions()
    build = {
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **timing,
        "python": platform.python_version(),
        "numpy": versions.get("numpy"),
    }
    return Manifest(
        index_id=plan.index_id,
        dim=plan.dim,
        num_examples=plan.num_examples,
        storage_dtype=plan.storage_dtype,
        codec=plan.codec.name,
        blocks=plan.blocks,
        stat_blocks=plan.stat_blocks,
        shards=tuple(shards),
        spec=plan.spec,
        sources=plan.sources,
        files={name: sha256_file(partial / name)
               for name in (STATS_NAME, EXAMPLES_NAME, *((WHITENING_NAME,) if plan.whitening is not None else ()))},
        totals={
            "supervised_tokens": sum(m.num_supervised for m in metas),
            "truncated_examples": sum(m.truncated for m in metas),
            "unsupervised_examples": sum(m.num_supervised == 0 for m in metas),
        },
        build=build,
    )


def _move_into_place(partial: Path, out_dir: Path) -> None:
    """Rename the finished build onto ``out_dir``; an older index there is swapped out, then removed."""
    if out_dir.is_dir() and not any(out_dir.iterdir()):
        out_dir.rmdir()
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{time.time_ns()}"
        out_dir.rename(old)
    partial.rename(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
