"""`gradian cache` and `gradian cache prune` on a cache dir holding real tiny indexes, a killed build and more."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradian.cli.app import main
from tests.core.test_index_cli import assert_error, run_cli, write_dataset

DAY = 86400


@pytest.fixture(scope="module")
def built_cache(tiny_base_dir, tiny_adapter_dir, tmp_path_factory):
    """A cache dir with two finished indexes (exact float32, projected float16) and one killed build, made once."""
    from gradian.config import load_config
    from gradian.data import load_dataset
    from gradian.index.build import build_index
    from gradian.model.loaded import LoadedModel

    root = tmp_path_factory.mktemp("cache-src")
    cache, data = root / "cache", root / "data"
    data.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIAN_CACHE_DIR", str(cache))
        first = write_dataset(data / "train.jsonl", count=5)
        second = write_dataset(data / "other.jsonl", count=4)
        common = ["index", "--base-model", str(tiny_base_dir), "--adapter", str(tiny_adapter_dir),
                  "--set", "grads.shard_size=2"]
        assert main([*common, "--dataset", str(first), "--set", "grads.storage_dtype=float32"]) == 0
        assert main([*common, "--dataset", str(second), "--set", "grads.projection_dim=48",
                     "--set", "grads.storage_dtype=float16"]) == 0

        def interrupt_after_first_shard(done: int, total: int) -> None:
            if done >= 4:  # the second shard's first batch: shard 0 is on disk
                raise KeyboardInterrupt

        loaded = LoadedModel.load(tiny_base_dir, tiny_adapter_dir)
        config = load_config(None, ["grads.shard_size=2", "grads.batch_size=2"])
        with pytest.raises(KeyboardInterrupt):
            build_index(loaded, load_dataset(write_dataset(data / "killed.jsonl", count=8)), config,
                        progress=interrupt_after_first_shard)
    return cache


@pytest.fixture()
def cache(built_cache, tmp_path, monkeypatch, tiny_base_dir):
    """A private copy of the built cache (file times kept), plus a converted model, a demo dir and foreign things."""
    cache = tmp_path / "cache"
    shutil.copytree(built_cache, cache, symlinks=True)
    for name in ("smollm2-135m-instruct-0123456789ab", "smollm2-135m-instruct-ba9876543210"):
        model = cache / "models" / name  # the layout gradian/model/embedded.py writes, with a tiny model in it
        shutil.copytree(tiny_base_dir, model)
        (model / "gradian-embedded.json").write_text(json.dumps(
            {"alias": "smollm2-135m-instruct", "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
             "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "dtype": "float32"}))
    demo = cache / "demo" / "fact-0"
    (demo / "scenario").mkdir(parents=True)
    (demo / "scenario" / "train.jsonl").write_text("{}\n" * 100)
    (cache / "notes").mkdir()
    (cache / "notes" / "mine.txt").write_text("not Gradian's")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "manifest.json").write_text("{}")
    (cache / "indexes" / "linked").symlink_to(outside, target_is_directory=True)
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(cache))
    return cache


def listing(capsys) -> dict:
    code, out, err = run_cli(capsys, "cache", "list", "--format", "json")
    assert code == 0, err
    return json.loads(out)


def by_kind(data: dict, kind: str) -> list[dict]:
    return [entry for entry in data["entries"] if entry["kind"] == kind]


def tree_size(path: Path) -> int:
    """Bytes of every file and symlink under ``path`` (a symlink counts as itself, never as what it points to)."""
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_symlink() or not p.is_dir())


def test_list_shows_each_index_with_what_built_it_and_every_other_entry(cache, capsys):
    data = listing(capsys)
    indexes = {entry["index"]["storage_dtype"]: entry for entry in by_kind(data, "index")}
    assert set(indexes) == {"float32", "float16"}
    exact, projected = indexes["float32"]["index"], indexes["float16"]["index"]
    assert (exact["num_examples"], exact["dim"], exact["projected"]) == (5, 1664, False)
    assert (projected["num_examples"], projected["dim"], projected["projected"]) == (4, 48, True)
    assert exact["dataset"].endswith("train.jsonl") and projected["dataset"].endswith("other.jsonl")
    assert exact["adapter"].endswith("adapter") and exact["created_at"]
    for entry in indexes.values():
        assert entry["id"] == entry["index"]["index_id"] and Path(entry["path"]).name == entry["id"]
        assert entry["size_bytes"] == tree_size(Path(entry["path"]))
    [partial] = by_kind(data, "partial")
    assert partial["note"] == "half-built index, 1 shard(s) finished" and Path(partial["path"]).name == f".{partial['id']}.partial"
    assert [e["id"] for e in by_kind(data, "model")] == ["smollm2-135m-instruct-0123456789ab",
                                                         "smollm2-135m-instruct-ba9876543210"]
    assert [e["id"] for e in by_kind(data, "demo")] == ["fact-0"]
    assert sorted(e["id"] for e in by_kind(data, "other")) == ["indexes/linked", "notes"]
    assert data["total_bytes"] == sum(e["size_bytes"] for e in data["entries"]) == tree_size(cache)

    code, out, _ = run_cli(capsys, "cache")  # the bare group lists too, as a table
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}  # id, size (2), created (2), age, ...
    assert rows[exact["index_id"]][6:10] == ["5", "1664", "exact", "float32"]
    assert rows[projected["index_id"]][6:10] == ["4", "48", "projected", "float16"]
    assert rows[exact["index_id"]][-1] == "train.jsonl" and rows[projected["index_id"]][-1] == "other.jsonl"
    for needle in ("half-built index, 1 shard(s) finished", "converted model HuggingFaceTB/SmolLM2-135M-Instruct",
                   "gradian demo work dir", "not written by Gradian; never removed"):
        assert needle in out, needle
    total = out.strip().splitlines()[-1]
    assert total.startswith(f"total {_decimal(data['total_bytes'])} in {cache}: 2 indexes ")
    assert all(part in total for part in (", 2 models ", ", 1 partial ", ", 1 demo ", ", 2 other "))


def test_prune_by_id_prefix_removes_that_index_and_reports_the_bytes(cache, capsys):
    before = listing(capsys)
    target = next(e for e in by_kind(before, "index") if e["index"]["storage_dtype"] == "float32")
    code, out, err = run_cli(capsys, "cache", "prune", "--id", target["id"][:8])
    assert code == 0, err
    assert f"removed index {target['id']}" in out
    assert f"freed {_decimal(target['size_bytes'])} (1 entry)" in out
    after = listing(capsys)
    assert [e["id"] for e in after["entries"]] == [e["id"] for e in before["entries"] if e["id"] != target["id"]]
    assert not Path(target["path"]).exists() and not any(p.name.startswith(".") and ".removing-" in p.name
                                                         for p in (cache / "indexes").iterdir())


def test_dry_run_lists_and_removes_nothing_then_partial_removes_only_the_killed_build(cache, capsys):
    before = listing(capsys)
    [partial] = by_kind(before, "partial")
    code, out, _ = run_cli(capsys, "cache", "prune", "--partial", "--dry-run")
    assert code == 0 and f"would remove partial {partial['id']}" in out and "nothing removed (--dry-run)" in out
    assert _same_entries(listing(capsys), before)
    code, out, _ = run_cli(capsys, "cache", "prune", "--partial")
    assert code == 0 and f"removed partial {partial['id']}" in out
    assert [e["id"] for e in listing(capsys)["entries"]] == [e["id"] for e in before["entries"] if e["kind"] != "partial"]


def dead_fit(index_dir: Path, size: int) -> Path:
    """The half-written Kronecker fit a SIGKILLed attribute leaves in an index: named by a process that has exited."""
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                            check=True)
    fit = index_dir / f"kronecker-eigen.npy.{int(exited.stdout)}.k1ll3d.partial"
    fit.write_bytes(b"\0" * size)
    return fit


def test_a_killed_kronecker_fit_inside_an_index_is_listed_and_pruned_as_partial_but_a_running_one_is_not(cache, capsys):
    index = next(e for e in by_kind(listing(capsys), "index") if e["index"]["storage_dtype"] == "float32")
    folder = Path(index["path"])
    fit = dead_fit(folder, 4096)
    running = folder / f"kronecker-eigen.npy.{os.getpid()}.w0rk1n.partial"  # this process is writing it
    running.write_bytes(b"\0" * 100)
    data = listing(capsys)
    [listed] = [e for e in by_kind(data, "partial") if Path(e["path"]) == fit]
    assert listed["size_bytes"] == 4096 and listed["note"] == (f"half-written kronecker fit in index {index['id']}, "
                                                                "its process gone")
    assert not any(Path(e["path"]) == running for e in data["entries"])
    assert data["total_bytes"] == sum(e["size_bytes"] for e in data["entries"]) == tree_size(cache)  # counted once
    code, out, err = run_cli(capsys, "cache", "prune", "--partial")
    assert code == 0, err
    assert f"removed partial {fit.name}" in out and not fit.exists()
    assert running.is_file() and (folder / "manifest.json").is_file()


def test_older_than_uses_the_manifest_created_time_and_the_newest_mtime(cache, capsys):
    data = listing(capsys)
    old_index = next(e for e in by_kind(data, "index") if e["index"]["storage_dtype"] == "float16")
    manifest_path = Path(old_index["path"]) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["build"]["created_at"] = "2020-01-01T00:00:00+00:00"
    manifest_path.write_text(json.dumps(manifest))
    old_model = cache / "models" / "smollm2-135m-instruct-0123456789ab"
    ten_days_ago = time.time() - 10 * DAY
    for path in [old_model, *old_model.rglob("*")]:
        os.utime(path, (ten_days_ago, ten_days_ago))

    code, out, err = run_cli(capsys, "cache", "prune", "--older-than", "7d")
    assert code == 0, err
    removed = sorted(line.split()[2] for line in out.splitlines() if line.startswith("removed "))
    assert removed == sorted([old_index["id"], "smollm2-135m-instruct-0123456789ab"])
    code, out, _ = run_cli(capsys, "cache", "prune", "--older-than", "12h")
    assert code == 0 and "nothing to remove (no entry older than 12h)" in out


def test_all_removes_what_gradian_wrote_and_never_follows_a_symlink_out(cache, capsys, tmp_path):
    index = next(e for e in by_kind(listing(capsys), "index") if e["index"]["storage_dtype"] == "float16")
    fit = dead_fit(Path(index["path"]), 64)  # removed with its index, not reported as failing after it
    code, out, err = run_cli(capsys, "cache", "prune", "--all")
    assert code == 0, err
    assert f"removed partial {fit.name}" in out and not Path(index["path"]).exists()
    assert "removed index " in out and "removed model " in out and "removed demo fact-0" in out
    assert "left alone (not written by Gradian): indexes/linked, notes" in err
    assert sorted(e["id"] for e in listing(capsys)["entries"]) == ["indexes/linked", "notes"]
    assert (tmp_path / "outside" / "manifest.json").is_file() and (cache / "notes" / "mine.txt").is_file()


@pytest.mark.parametrize(("argv", "needles"), [
    (["--older-than", "7y"], ["unknown unit 'y'", "7d, 12h or 30m"]),
    (["--older-than", "7"], ["has no unit"]),
    (["--older-than", "soon"], ["is not an age"]),
    (["--id", "0000nothing"], ["matches no cache entry", "gradian cache list"]),
    (["--id", "indexes/linked"], ["matches no cache entry"]),  # a symlink is never Gradian's to remove
    (["--id", "smollm2-135m-instruct-"], ["ambiguous", "matches 2 entries", "more characters"]),
    (["--dry-run"], ["needs something to select", "--older-than AGE"]),
])
def test_bad_prune_input_is_one_line_and_removes_nothing(cache, capsys, argv, needles):
    before = sorted(str(p) for p in cache.rglob("*"))
    code, out, err = run_cli(capsys, "cache", "prune", *argv)
    assert_error(code, err, *needles)
    assert out == "" and len(err.strip().splitlines()) == 1
    assert sorted(str(p) for p in cache.rglob("*")) == before


def test_an_empty_or_missing_cache_dir_lists_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "never-made"))
    code, out, _ = run_cli(capsys, "cache")
    assert code == 0 and "does not exist yet" in out
    code, out, _ = run_cli(capsys, "cache", "prune", "--all")
    assert code == 0 and "nothing to remove" in out and not (tmp_path / "never-made").exists()
    code, out, _ = run_cli(capsys, "cache", "--json")
    assert code == 0 and json.loads(out)["entries"] == []


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800), ("12h", 43200), ("7d", 7 * DAY), ("1.5h", 5400),
                                               ("2w", 14 * DAY), ("45s", 45)])
def test_ages(text, seconds):
    from gradian.cache_entries import parse_age

    assert parse_age(text) == seconds


def _decimal(size: int) -> str:
    from rich.filesize import decimal

    return decimal(size)


def _without_ages(data: dict) -> dict:
    return {**data, "entries": [{k: v for k, v in e.items() if k != "age_seconds"} for e in data["entries"]]}


def _same_entries(a: dict, b: dict) -> bool:
    return _without_ages(a) == _without_ages(b)
