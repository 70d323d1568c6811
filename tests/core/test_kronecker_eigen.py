"""The kronecker fit with a full wide side: equal to the dense Kronecker inverse from every row, cached beside the
index and checked there, and refused on a sketched index."""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest

from gradian.attribution import kronecker_eigen as module
from gradian.attribution.index_statistics import index_statistics
from gradian.attribution.preconditioners import fit_preconditioner
from gradian.errors import GradientIndexError
from gradian.index.sizing import kronecker_fit_bytes
from tests.core.test_grads_whitening import index_config
from tests.core.test_index_build import build


@pytest.fixture(scope="module")
def tiny_model(tiny_base_dir, tiny_adapter_dir):
    """The tiny base model with its LoRA adapter, loaded once for this module's index builds."""
    from gradian.model.loaded import LoadedModel

    return LoadedModel.load(tiny_base_dir, tiny_adapter_dir)


def _dense_kronecker(index, damping_ratio: float, wide_max: int) -> list[np.ndarray]:
    """Per matrix m (L + lambda/2)^-1 (x) (R + lambda/2)^-1 from every stored row, as dense float64 matrices."""
    rows = index.rows_between(0, index.num_examples).astype(np.float64)
    n = rows.shape[0]
    lam = damping_ratio * float(np.mean(rows**2))
    dense = []
    for block in index.blocks:
        r, c = block.stored_shape
        g = rows[:, block.offset:block.offset + r * c].reshape(n, r, c)
        left = np.einsum("nij,nkj->ik", g, g) / (n * c)
        right = np.einsum("nji,njk->ik", g, g) / (n * r)
        left = left if r <= wide_max else np.diag(np.diag(left))
        right = right if c <= wide_max else np.diag(np.diag(right))
        mean = float(np.mean(g**2))
        dense.append(mean * np.kron(np.linalg.inv(left + lam / 2 * np.eye(r)), np.linalg.inv(right + lam / 2 * np.eye(c))))
    return dense


def _check_equal(pre, index, dense: list[np.ndarray]) -> None:
    queries = np.random.default_rng(1).normal(size=(3, index.dim))
    got = pre.apply(queries)
    for block, matrix in zip(index.blocks, dense, strict=True):
        part = slice(block.offset, block.offset + block.width)
        want = queries[:, part] @ matrix  # symmetric
        # the cache is float32: its rounding, amplified by the damped inverse's condition, is what is left
        np.testing.assert_allclose(got[:, part], want, rtol=5e-3, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("wide_max", [module.WIDE_MAX, 5], ids=["every side full", "wide sides over 5 diagonal"])
def test_the_full_fit_is_the_dense_kronecker_inverse_over_every_row(tiny_model, tmp_path, monkeypatch,
                                                                     wide_max):
    every_side_full = wide_max == module.WIDE_MAX
    monkeypatch.setattr(module, "WIDE_MAX", wide_max)
    index = build(tiny_model, tmp_path)
    statistics = index_statistics(index, "kronecker", chunk_bytes=3 * index.dim * 4)  # read in chunks of 3 rows
    pre = fit_preconditioner("kronecker", statistics, damping_ratio=0.2, kronecker_wide="full")
    assert pre.knobs["scheme"] == "kronecker-full-v1" and pre.knobs["fit_rows"] == index.num_examples
    assert (pre.knobs["full_wide_sides"] > 0) == every_side_full
    _check_equal(pre, index, _dense_kronecker(index, 0.2, wide_max))
    # auto is full on an exact index; diagonal keeps the 64-row fit of a projected build
    assert fit_preconditioner("kronecker", statistics, kronecker_wide="auto").knobs["scheme"] == "kronecker-full-v1"
    assert fit_preconditioner("kronecker", statistics, kronecker_wide="diagonal").knobs["scheme"] == "kronecker-rank-v1"


def test_the_decomposition_is_cached_beside_the_index_and_a_damaged_cache_is_fitted_again(tiny_model, tmp_path):
    index = build(tiny_model, tmp_path)
    first = np.array(module.kronecker_eigen(index, 1 << 20).values)  # a copy: the mapping would see the damage
    record = json.loads((index.path / module.RECORD_NAME).read_text())
    assert record["index_id"] == index.index_id and record["examples"] == index.num_examples
    assert not list(index.path.glob("*.partial"))
    # what the index build counted against the disk before it started
    shapes = [tuple(block.stored_shape) for block in index.blocks]
    assert (index.path / module.CACHE_NAME).stat().st_size == kronecker_fit_bytes(shapes)
    cached = module.kronecker_eigen(index, 1 << 20)
    np.testing.assert_array_equal(np.asarray(cached.values), first)
    # damaged: its checksum no longer holds, so it is fitted again rather than trusted
    values = np.load(index.path / module.CACHE_NAME, mmap_mode="r+")
    values[0] += 1.0
    values.flush()
    del values
    again = module.kronecker_eigen(index, 1 << 20)
    np.testing.assert_array_equal(np.asarray(again.values), first)


def test_an_index_it_cannot_write_beside_is_fitted_without_a_cache(tiny_model, tmp_path, monkeypatch):
    index = build(tiny_model, tmp_path)
    before = sorted(path.name for path in index.path.iterdir())
    monkeypatch.setattr(module.os, "access", lambda path, mode: False)  # as a read-only directory answers
    pre = fit_preconditioner("kronecker", index_statistics(index, "kronecker"), kronecker_wide="full")
    _check_equal(pre, index, _dense_kronecker(index, 0.1, module.WIDE_MAX))
    assert sorted(path.name for path in index.path.iterdir()) == before


def test_a_sketched_index_refuses_a_full_wide_side_and_auto_keeps_the_diagonal(tiny_model, tmp_path):
    from gradian.index.build import build_index
    from tests.core.test_index_build import make_examples

    index = build_index(tiny_model, make_examples(), index_config("attribution.preconditioner=kronecker"),
                        tmp_path / "projected")
    statistics = index_statistics(index, "kronecker")
    with pytest.raises(GradientIndexError, match="needs an exact index") as refused:
        fit_preconditioner("kronecker", statistics, kronecker_wide="full")
    assert "kronecker_wide auto" in refused.value.hint
    assert fit_preconditioner("kronecker", statistics, kronecker_wide="auto").knobs["scheme"] == "kronecker-rank-v1"


def test_a_side_no_row_touched_gets_no_inf_without_damping(tiny_model, tmp_path):
    index = build(tiny_model, tmp_path)
    eigen = module.kronecker_eigen(index, 1 << 20)
    out = eigen.apply(np.ones((1, index.dim)), 0.0)
    assert np.isfinite(out).all()


def test_no_room_for_the_cache_is_an_error_with_a_hint_and_leaves_nothing(tiny_model, tmp_path, monkeypatch):
    index = build(tiny_model, tmp_path)
    before = sorted(path.name for path in index.path.iterdir())

    def full_disk(descriptor, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(module.os, "posix_fallocate", full_disk)
    with pytest.raises(GradientIndexError, match="no room for the kronecker fit") as refused:
        module.kronecker_eigen(index, 1 << 20)
    assert "kronecker_wide diagonal" in refused.value.hint
    assert sorted(path.name for path in index.path.iterdir()) == before


def test_a_fit_removes_the_partials_of_killed_fits_and_keeps_a_running_ones(tiny_model, tmp_path):
    import os
    import subprocess
    import sys

    index = build(tiny_model, tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    killed = index.path / f"{module.CACHE_NAME}.{int(gone.stdout)}.abc123.partial"  # its process has exited
    running = index.path / f"{module.CACHE_NAME}.{os.getpid()}.def456.partial"  # this process runs
    unnamed = index.path / f"{module.CACHE_NAME}.xyz789.partial"  # written before partials named their process
    for path in (killed, running, unnamed):
        path.write_bytes(b"half a fit")
    module.kronecker_eigen(index, 1 << 20)
    assert not killed.exists() and running.exists() and unnamed.exists()
