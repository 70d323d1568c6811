"""Building and reading a gradient index on a tiny model: rows, chunks, manifest, dtypes, stats, cache, damage."""

from __future__ import annotations

import errno
import hashlib
import json

import numpy as np
import pytest

from gradian.errors import GradientIndexError


@pytest.fixture(scope="module")
def loaded(tiny_base_dir, tiny_adapter_dir):
    """The tiny base model with its LoRA adapter, loaded once for this module."""
    from gradian.model.loaded import LoadedModel

    return LoadedModel.load(tiny_base_dir, tiny_adapter_dir)


def make_examples(count: int = 10, *, reverse: bool = False):
    """Chat examples of varied length; example 3's answer has weight 0, so it has no supervised tokens."""
    from gradian.data import Message, make_example

    contents = []
    for i in range(count):
        answer = " ".join(["The capital of France is Paris."] * (1 + i % 3) + [f"Two plus {i} is {i + 2}."])
        contents.append((f"What is two plus {i}? Explain why.", answer, 0 if i == 3 else 1))
    if reverse:
        contents.reverse()
    return [make_example(position, messages=[Message("user", q), Message("assistant", a, weight=w)])
            for position, (q, a, w) in enumerate(contents)]


def make_config(**grads):
    """A GradianConfig with small shards and batches (so shards and batches both have several members).

    Rows are stored in float32 unless asked, so they compare with autograd to float32 rounding.
    """
    from gradian.config import load_config

    values = {"shard_size": 4, "batch_size": 3, "storage_dtype": "float32", **grads}
    return load_config(None, [f"grads.{key}={value}" for key, value in values.items()])


def build(loaded, tmp_path, name="index", examples=None, **grads):
    from gradian.index.build import build_index

    return build_index(loaded, examples if examples is not None else make_examples(), make_config(**grads),
                       tmp_path / name)


def test_each_row_is_the_examples_own_gradient(loaded, tmp_path):
    from gradian.data import encode
    from gradian.grads.batch import collate
    from gradian.grads.capture import GradientCapture

    examples = make_examples()
    index = build(loaded, tmp_path, examples=examples)
    capture = GradientCapture.from_config(loaded, make_config().grads)
    rows = index.rows_between(0, len(examples))
    assert rows.shape == (10, capture.dim) and rows.dtype == np.float32
    for position, example in enumerate(examples):
        alone = capture.capture(collate([encode(example, loaded.tokenizer, 1024)], loaded.tokenizer.pad_token_id))[0]
        alone = alone.numpy()
        scale = max(float(np.abs(alone).max()), 1e-30)
        assert float(np.abs(rows[position] - alone).max()) / scale < 1e-5, position
    assert not rows[3].any()  # no supervised tokens: an exact zero row
    assert all(rows[i].any() for i in range(10) if i != 3)


def test_chunks_stream_across_shards_without_loading_the_index(loaded, tmp_path):
    index = build(loaded, tmp_path)
    assert [s.rows for s in index.manifest.shards] == [4, 4, 2]
    chunks = list(index.iter_chunks(3))
    assert [offset for offset, _ in chunks] == [0, 3, 6, 9]
    assert [chunk.shape[0] for _, chunk in chunks] == [3, 3, 3, 1]
    assert all(chunk.dtype == np.float32 and not isinstance(chunk, np.memmap) for _, chunk in chunks)
    np.testing.assert_array_equal(np.concatenate([c for _, c in chunks]), index.rows_between(0, 10))
    np.testing.assert_array_equal(index.rows([9, 0, 5]), index.rows_between(0, 10)[[9, 0, 5]])
    assert isinstance(index.shard(1), np.memmap)  # shards are memory-mapped, not read into memory
    assert [offset for offset, _ in index.iter_chunks(4, start=2, stop=7)] == [2, 6]


def test_manifest_records_everything_needed_to_reproduce(loaded, tmp_path):
    from gradian.index.manifest import FORMAT_VERSION

    examples = make_examples()
    index = build(loaded, tmp_path, examples=examples)
    manifest = json.loads((index.path / "manifest.json").read_text())
    spec = manifest["spec"]
    assert manifest["format_version"] == FORMAT_VERSION and manifest["index_id"] == index.index_id
    assert manifest["codec"] == "npy" and manifest["storage_dtype"] == "float32"
    assert manifest["dim"] == sum(b["width"] for b in manifest["blocks"]) == index.dim
    assert [b["module"] for b in manifest["blocks"][::2]] == [b.name for b in loaded.blocks()]
    assert spec["checkpoint"]["adapter_sha256"] == loaded.adapter_hash
    assert spec["base_model"]["sha256"] == loaded.base_model_hash
    assert spec["dataset"]["num_examples"] == 10
    assert spec["grads"]["loss_reduction"] == "sum" and spec["grads"]["max_seq_length"] == 1024
    assert spec["grads"]["projection"] is None and spec["seed"] == 0
    assert spec["damping"] == {"damping": None, "damping_ratio": 0.1}
    assert set(spec["libraries"]) == {"torch", "transformers", "peft", "gradian-core"}
    assert index.example_ids == tuple(e.id for e in examples)
    assert index.examples[3].num_supervised == 0 and manifest["totals"]["unsupervised_examples"] == 1
    for shard in manifest["shards"]:
        assert hashlib.sha256((index.path / shard["file"]).read_bytes()).hexdigest() == shard["sha256"]
        assert hashlib.sha256((index.path / shard["stats_file"]).read_bytes()).hexdigest() == shard["stats_sha256"]
    assert sorted(p.name for p in index.path.iterdir()) == sorted(
        ["manifest.json", "examples.jsonl", "stats.npy"] + [s["file"] for s in manifest["shards"]]
        + [s["stats_file"] for s in manifest["shards"]])
    assert not list(tmp_path.glob(".*"))  # no partial or temp directory left behind


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_smaller_dtypes_stay_close_and_keep_zero_rows_zero(loaded, tmp_path, dtype):
    exact = build(loaded, tmp_path, "exact").rows_between(0, 10)
    index = build(loaded, tmp_path, dtype, storage_dtype=dtype)
    rows = index.rows_between(0, 10)
    assert index.shard(0).dtype == (np.float16 if dtype == "float16" else np.uint16)
    assert index.shard(0).nbytes * 2 == exact[:4].nbytes
    np.testing.assert_allclose(rows, exact, rtol=1e-2 if dtype == "float16" else 1e-2, atol=1e-4)
    assert not rows[3].any() and np.isfinite(rows).all()
    stats = index.stats()  # statistics are of the stored (rounded) values, which is what scoring reads
    np.testing.assert_allclose(stats.sum_sq, (rows.astype(np.float64) ** 2).sum(0), rtol=1e-12)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_statistics_are_the_moments_of_the_stored_rows(loaded, tmp_path, reduction):
    index = build(loaded, tmp_path, loss_reduction=reduction)
    rows = index.rows_between(0, 10).astype(np.float64)
    stats = index.block_stats(chunk_bytes=3 * index.dim * 4)  # chunks of 3 rows: several span shards of 4
    assert stats.count == 10 and np.isfinite(rows).all()
    np.testing.assert_allclose(stats.second_moment(), (rows**2).mean(0), rtol=1e-10, atol=1e-30)
    for block in stats.blocks:
        assert block.has_matrix  # tiny blocks are narrow enough for a block preconditioner
        part = rows[:, block.offset:block.offset + block.width]
        np.testing.assert_allclose(stats.block_second_moment(block.name), part.T @ part / 10, rtol=1e-10, atol=1e-30)
    assert [b.name for b in stats.blocks] == [b.module for b in index.blocks[::2]]


def test_projection_fixes_the_width_and_keeps_block_statistics(loaded, tmp_path):
    index = build(loaded, tmp_path, projection_dim=48)
    assert index.dim == 48 and index.manifest.projection["dim"] == 48
    assert all(b.width < b.shape[0] * b.shape[1] for b in index.blocks)
    stats = index.block_stats()
    assert stats.has_block_matrices()
    assert stats.block_second_moment(stats.blocks[0].name).shape == (stats.blocks[0].width,) * 2


def test_the_build_keeps_no_block_matrices_and_diagonal_scoring_makes_none(loaded, tmp_path):
    from gradian.attribution.index_statistics import index_statistics
    from gradian.index.stats import moments_length

    index = build(loaded, tmp_path)
    assert all(block.has_matrix for block in index.manifest.stat_blocks)  # narrow enough, yet none is built
    assert np.load(index.path / "stats.npy").shape == (moments_length(index.dim),)
    for number in range(len(index.manifest.shards)):
        assert np.load(index.path / f"stats-{number:05d}.npy").shape == (moments_length(index.dim),)
    before = sorted(p.name for p in index.path.iterdir())
    for kind in ("none", "diagonal", "adam"):
        statistics = index_statistics(index, kind)
        assert all(block.matrix is None for block in statistics.blocks)
    assert sorted(p.name for p in index.path.iterdir()) == before  # no block statistics computed or cached


def test_block_preconditioner_works_on_an_index_built_without_block_matrices(loaded, tmp_path):
    from gradian.attribution.index_statistics import index_statistics
    from gradian.attribution.preconditioners import fit_preconditioner

    index = build(loaded, tmp_path)
    rows = index.rows_between(0, 10).astype(np.float64)
    statistics = index_statistics(index, "block", chunk_bytes=3 * index.dim * 4)  # one streamed pass, 4 chunks
    for block in statistics.blocks:
        part = rows[:, block.offset:block.offset + block.size]
        np.testing.assert_allclose(block.matrix, part.T @ part / 10, rtol=1e-6, atol=1e-30)
    pre = fit_preconditioner("block", statistics)
    assert pre.kind == "block" and len(pre.block_inverses) == len(index.manifest.stat_blocks)
    assert (index.path / "block-stats.npy").is_file()  # cached for the next run
    cached = index_statistics(index, "block", chunk_bytes=index.dim * 4)  # another budget, same cached numbers
    for fresh, again in zip(statistics.blocks, cached.blocks, strict=True):
        np.testing.assert_array_equal(fresh.matrix, again.matrix)
    (index.path / "block-stats.npy").write_bytes(b"damaged")  # a damaged cache is recomputed, never read
    recomputed = index_statistics(index, "block", chunk_bytes=index.dim * 4)
    for fresh, again in zip(statistics.blocks, recomputed.blocks, strict=True):
        np.testing.assert_allclose(fresh.matrix, again.matrix, rtol=1e-6, atol=1e-30)


def test_scoring_under_a_tiny_byte_budget_equals_scoring_in_one_chunk(loaded, tmp_path):
    from gradian.attribution.clusters import sketch_rows
    from gradian.attribution.scoring import leading_rows, score_examples

    index = build(loaded, tmp_path)  # shards of 4, 4 and 2 rows
    queries = np.random.default_rng(0).normal(size=(3, index.dim))
    whole = score_examples(index, queries, top_k=5, chunk_bytes=1 << 30)
    assert whole.passes == 1
    scale = float(np.abs(whole.top_item_blame).max())
    for rows in (1, 3, 4, 7):  # one row; chunks spanning shards; chunks on shard edges; several per shard
        small = score_examples(index, queries, top_k=5, chunk_bytes=rows * index.dim * 4, score_budget=rows * 3)
        assert small.passes == 2  # the scores did not fit the budget either: the index was read twice
        # Float32 products: another chunk shape (another BLAS kernel) moves a score by float32 rounding only.
        np.testing.assert_allclose(small.top_item_blame, whole.top_item_blame, rtol=0, atol=1e-5 * scale)
        np.testing.assert_allclose(small.blame, whole.blame, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(small.top_positions, whole.top_positions)
        np.testing.assert_array_equal(sketch_rows(index, seed=1, chunk_bytes=rows * index.dim * 4),
                                      sketch_rows(index, seed=1, chunk_bytes=1 << 30))
        np.testing.assert_array_equal(leading_rows(index, 6, chunk_bytes=rows * index.dim * 4), index.rows_between(0, 6))


def test_identical_rebuild_is_reused_and_a_reordered_dataset_is_not(loaded, tmp_path, monkeypatch):
    from gradian.grads.capture import GradientCapture
    from gradian.index.build import build_index

    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))
    first = build_index(loaded, make_examples(), make_config())
    assert first.path == tmp_path / "cache" / "indexes" / first.index_id and not first.reused
    mtimes = {p.name: p.stat().st_mtime_ns for p in first.path.iterdir()}

    def no_capture(self, batch):
        raise AssertionError("a reused index must not compute gradients")

    monkeypatch.setattr(GradientCapture, "capture", no_capture)
    again = build_index(loaded, make_examples(), make_config(batch_size=5))  # batching does not change the id
    assert again.reused and again.index_id == first.index_id
    assert {p.name: p.stat().st_mtime_ns for p in again.path.iterdir()} == mtimes
    monkeypatch.undo()
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))
    reordered = build_index(loaded, make_examples(reverse=True), make_config())
    assert reordered.index_id != first.index_id and not reordered.reused
    # Same examples, other order: row i of one is row n-1-i of the other.
    np.testing.assert_allclose(reordered.rows_between(0, 10)[::-1], first.rows_between(0, 10), rtol=1e-4, atol=1e-6)
    other_dtype = build_index(loaded, make_examples(), make_config(storage_dtype="float16"))
    assert other_dtype.index_id not in (first.index_id, reordered.index_id)


def test_a_corrupted_shard_is_named_by_its_checksum(loaded, tmp_path):
    from gradian.index.store import Index

    index = build(loaded, tmp_path)
    shard = index.path / "shard-00001.npy"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    reopened = Index.open(index.path)  # same size: only the checksum can tell
    assert reopened.rows_between(0, 4).shape == (4, index.dim)  # shard 0 is fine
    with pytest.raises(GradientIndexError, match=r"shard shard-00001\.npy .* checksum"):
        list(reopened.iter_chunks(2))
    with pytest.raises(GradientIndexError, match="shard-00001.npy"):
        Index.open(index.path).verify()
    shard.write_bytes(bytes(data[:-100]))
    with pytest.raises(GradientIndexError, match="shard-00001.npy .*truncated"):
        Index.open(index.path)


def test_an_index_of_another_format_version_is_refused(loaded, tmp_path):
    from gradian.index.store import Index

    index = build(loaded, tmp_path)
    manifest = json.loads((index.path / "manifest.json").read_text())
    manifest["format_version"] = 0
    (index.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(GradientIndexError, match="format version 0") as refused:
        Index.open(index.path)
    assert "rebuild" in refused.value.hint
    with pytest.raises(GradientIndexError, match="format version 0"):
        build(loaded, tmp_path)  # nor is it overwritten by a build
    assert json.loads((index.path / "manifest.json").read_text())["format_version"] == 0


def test_a_failing_disk_leaves_nothing_half_written(loaded, tmp_path):
    from gradian.hookspecs import hookimpl
    from gradian.index.codecs.npy import read_npy
    from gradian.plugins import get_plugins
    from gradian.records import CodecSpec

    def full_disk(path, array):
        with open(path, "wb") as handle:
            handle.write(b"\x93NUMPY partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    class FullDiskPlugin:
        @hookimpl
        def gradian_storage_codecs(self):
            return [CodecSpec("full-disk", "a codec whose disk is full", ".npy", full_disk, read_npy)]

    get_plugins().register(FullDiskPlugin(), "full-disk", "test-full-disk")
    with pytest.raises(GradientIndexError, match="No space left on device") as failed:
        build(loaded, tmp_path, codec="full-disk")
    assert "shard-00000.npy" in failed.value.message and "--out" in failed.value.hint
    assert not (tmp_path / "index").exists()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp") or p.name.startswith("shard-")]

    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(GradientIndexError, match="could not write"):
        build(loaded, tmp_path / "a-file", "index")


def test_out_dirs_holding_other_things_are_not_overwritten(loaded, tmp_path):
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "notes.txt").write_text("mine")
    with pytest.raises(GradientIndexError, match="not a gradient index"):
        build(loaded, tmp_path)
    assert (tmp_path / "index" / "notes.txt").read_text() == "mine"
    first = build(loaded, tmp_path, "swap")
    second = build(loaded, tmp_path, "swap", storage_dtype="bfloat16")  # an older index at --out is replaced
    assert second.index_id != first.index_id and second.path == first.path
    assert second.shard(0).dtype == np.uint16 and not list(tmp_path.glob(".swap*"))


def test_the_python_api_is_gradian_build_index(loaded, tmp_path):
    import gradian
    from gradian.index.build import build_index

    assert gradian.build_index is build_index
    calls = []
    index = gradian.build_index(loaded, make_examples(5), make_config(), out=tmp_path / "api",
                                progress=lambda done, total: calls.append((done, total)))
    assert len(index) == 5 and calls[0] == (0, 5) and calls[-1] == (5, 5)


def test_a_float16_overflow_and_a_nan_from_the_weights_get_their_own_advice():
    from gradian.index.build import _check_finite

    rows = np.ones((3, 4), dtype=np.float32)
    _check_finite(rows, ["a", "b", "c"], "the gradient")  # finite: nothing to say
    cast = np.array([[1.0, 2.0], [np.inf, 1.0], [1.0, -np.inf]], dtype=np.float32)
    with pytest.raises(GradientIndexError, match="of example b overflows float16.*and 1 more") as error:
        _check_finite(cast, ["a", "b", "c"], "the float16 gradient", overflowed=True)
    assert "bfloat16" in error.value.hint
    with pytest.raises(GradientIndexError, match="of example b is not finite") as error:
        _check_finite(np.array([[0.0], [np.nan]]), ["a", "b"], "the gradient")
    assert "NaN/inf" in error.value.hint
