"""Index storage without a model: dtypes (bfloat16 as bit patterns, zero rows), the npy codec, statistics."""

from __future__ import annotations

import numpy as np
import pytest

from gradian.errors import GradientIndexError
from gradian.index.dtypes import decode_rows, encode_rows, unit_rows
from gradian.index.stats import (
    BlockMomentAccumulator,
    PreconditionerStats,
    StatsAccumulator,
    legacy_block_vector,
    moments_length,
    plan_stat_blocks,
    stats_length,
    sum_partials,
)


def _rows(seed: int = 0, n: int = 16, dim: int = 40) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32) * 3
    rows[5] = 0.0  # an example with no supervised tokens has an all-zero gradient
    return rows


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 0.0), ("float16", 1e-3), ("bfloat16", 8e-3)])
def test_dtype_roundtrip_keeps_values_and_zero_rows(dtype, tolerance):
    rows = _rows()
    back = decode_rows(encode_rows(rows, dtype), dtype)
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, rows, rtol=tolerance, atol=tolerance)
    assert (back[5] == 0).all()
    unit = unit_rows(back)
    assert np.isfinite(unit).all() and (unit[5] == 0).all()
    np.testing.assert_allclose(np.linalg.norm(unit[np.arange(len(rows)) != 5], axis=1), 1.0, rtol=1e-5)


def test_bfloat16_bits_match_torch_rounding():
    torch = pytest.importorskip("torch")
    rows = _rows(seed=1) * 1e3
    ours = encode_rows(rows, "bfloat16")
    theirs = torch.from_numpy(rows).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert ours.dtype == np.dtype("<u2")
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(decode_rows(ours, "bfloat16"), torch.from_numpy(rows).to(torch.bfloat16).float().numpy())


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_decoding_a_read_only_memory_map_into_rows_equals_decoding_a_copy(tmp_path, dtype):
    from gradian.index.dtypes import decode_rows_into

    stored = encode_rows(_rows(seed=2) * 50, dtype)
    np.save(tmp_path / "shard.npy", stored)
    mapped = np.load(tmp_path / "shard.npy", mmap_mode="r")
    out = np.full((4, stored.shape[1]), np.nan, dtype=np.float32)
    decode_rows_into(mapped[3:7], dtype, out)
    # numpy's own widening, independent of the torch path decode_rows_into takes: bit for bit, zero rows included
    widened = (stored.astype(np.uint32) << np.uint32(16)).view(np.float32) if dtype == "bfloat16" else stored.astype(np.float32)
    np.testing.assert_array_equal(out, widened[3:7])


def test_a_scratch_map_keeps_its_rows_after_its_pages_are_released_and_writes_as_np_save_does(tmp_path):
    from gradian.index.codecs.npy import write_npy
    from gradian.index.mapped import release_pages

    rows = encode_rows(_rows(seed=3, n=64, dim=4096), "float16")
    scratch = np.lib.format.open_memmap(tmp_path / "shard.scratch", mode="w+", dtype=rows.dtype, shape=rows.shape)
    for start in range(0, 64, 8):  # filled batch by batch, pages handed back after each, as the build does
        scratch[start:start + 8] = rows[start:start + 8]
        release_pages(scratch)
    np.testing.assert_array_equal(scratch, rows)
    write_npy(tmp_path / "mapped.npy", scratch)
    write_npy(tmp_path / "plain.npy", rows)
    assert (tmp_path / "mapped.npy").read_bytes() == (tmp_path / "plain.npy").read_bytes()
    release_pages(rows)  # an in-memory array: nothing to do


def test_npy_codec_is_registered_and_reads_memory_mapped(tmp_path):
    from gradian.plugins import get_plugins

    codec = get_plugins().storage_codecs()["npy"]
    rows = encode_rows(_rows(), "float16")
    path = tmp_path / "temp-name-without-suffix"
    codec.write(path, rows)
    assert not (tmp_path / "temp-name-without-suffix.npy").exists()  # written exactly where asked
    back = codec.read(path)
    assert isinstance(back, np.memmap) and not back.flags.writeable
    np.testing.assert_array_equal(back, rows)


def test_stats_accumulate_in_float64_and_sum_over_shards(tmp_path):
    rows = _rows(n=30).astype(np.float64)
    blocks = plan_stat_blocks([("a", 0, 10), ("b", 10, 30)], max_width=16)
    assert [b.has_matrix for b in blocks] == [True, False]
    parts = []
    for number, chunk in enumerate((rows[:12], rows[12:24], rows[24:])):
        acc = StatsAccumulator(40)
        acc.add(chunk[:5])
        acc.add(chunk[5:])
        path = tmp_path / f"stats-{number}.npy"
        np.save(path, acc.to_vector())
        parts.append(path)
    total = sum_partials(parts, np.load)
    assert total.shape == (moments_length(40),)  # the build keeps no block matrices
    stats = PreconditionerStats.from_vector(total, 40, blocks)
    assert stats.count == 30 and stats.matrices == {}
    np.testing.assert_allclose(stats.second_moment(), (rows**2).mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.mean(), rows.mean(0), rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="block_stats"):
        stats.block_second_moment("a")  # matrices come only from Index.block_stats
    blocky = BlockMomentAccumulator(blocks)
    for chunk in (rows[:7], rows[7:]):
        blocky.add(chunk.astype(np.float32))
    with_blocks = stats.with_block_vector(blocky.to_vector())
    np.testing.assert_allclose(with_blocks.block_second_moment("a"), rows[:, :10].T @ rows[:, :10] / 30, rtol=1e-6)
    with pytest.raises(GradientIndexError) as refused:
        with_blocks.block_second_moment("b")
    assert "projection_dim" in refused.value.hint
    assert not with_blocks.has_block_matrices()
    with pytest.raises(GradientIndexError, match="block statistics"):
        stats.with_block_vector(BlockMomentAccumulator(blocks).to_vector())  # over 0 rows, not these 30


def test_legacy_stats_with_block_matrices_still_read():
    rows = _rows(n=12).astype(np.float64)
    blocks = plan_stat_blocks([("a", 0, 10), ("b", 10, 30)], max_width=16)
    moments, matrices = StatsAccumulator(40), BlockMomentAccumulator(blocks)
    moments.add(rows)
    matrices.add(rows)
    # What indexes built before block matrices were made on demand hold: [count, sum, sum_sq, matrices...].
    legacy = np.concatenate([moments.to_vector(), matrices.to_vector()[1:]])
    assert legacy.shape == (stats_length(40, blocks),)
    stats = PreconditionerStats.from_vector(legacy, 40, blocks)
    np.testing.assert_array_equal(stats.sum_sq, moments.sum_sq)
    assert stats.matrices == {} and legacy_block_vector(moments.to_vector(), 40) is None
    restored = stats.with_block_vector(legacy_block_vector(legacy, 40))
    np.testing.assert_array_equal(restored.block_second_moment("a"), matrices.matrices["a"] / 12)


def test_stats_vector_of_the_wrong_length_is_a_damaged_index():
    blocks = plan_stat_blocks([("a", 0, 4)])
    with pytest.raises(GradientIndexError, match="statistics"):
        PreconditionerStats.from_vector(np.zeros(7), 4, blocks)
