"""Preconditioners: the same numbers as the explicit dense formulas, no NaN on empty columns, clear refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradian.attribution import (
    BlockMoment,
    IndexStatistics,
    adam_preconditioner,
    block_preconditioner,
    diagonal_preconditioner,
    fit_preconditioner,
    from_config,
)
from gradian.config import AttributionConfig
from gradian.errors import GradientIndexError, RunDirError

SIZES = (3, 5, 4)


def _gradients(n: int = 40, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Columns of very different scale, as LoRA A and B gradients are.
    return rng.normal(size=(n, sum(SIZES))) * rng.uniform(0.01, 3.0, size=sum(SIZES))


def _blocks(grads: np.ndarray) -> tuple[BlockMoment, ...]:
    blocks, offset = [], 0
    for number, size in enumerate(SIZES):
        part = grads[:, offset:offset + size]
        blocks.append(BlockMoment(f"layers.{number}.q_proj", offset, size, part.T @ part / grads.shape[0]))
        offset += size
    return tuple(blocks)


def test_diagonal_is_one_over_second_moment_plus_ratio_of_mean():
    grads = _gradients()
    moment = (grads**2).mean(axis=0)
    queries = np.random.default_rng(1).normal(size=(3, grads.shape[1]))
    pre = diagonal_preconditioner(moment, damping_ratio=0.1)
    lam = 0.1 * moment.mean()
    np.testing.assert_allclose(pre.apply(queries), queries / (moment + lam), rtol=1e-12)
    assert pre.knobs["damping"] == pytest.approx(lam)
    assert pre.knobs["damping_ratio"] == 0.1


def test_diagonal_absolute_damping_wins_over_ratio():
    moment = (_gradients() ** 2).mean(axis=0)
    queries = np.ones((1, moment.size))
    pre = diagonal_preconditioner(moment, damping=0.5, damping_ratio=0.1)
    np.testing.assert_allclose(pre.apply(queries), 1.0 / (moment + 0.5)[None, :])
    assert pre.knobs["damping_source"] == "absolute" and pre.knobs["damping_ratio"] is None


def test_block_equals_dense_damped_inverse_per_block():
    grads = _gradients()
    blocks = _blocks(grads)
    pre = block_preconditioner(blocks, grads.shape[1], damping_ratio=0.1)
    dense = np.zeros((grads.shape[1], grads.shape[1]))
    for block in blocks:
        lam = 0.1 * np.trace(block.matrix) / block.size  # mean eigenvalue = trace / size
        stop = block.offset + block.size
        dense[block.offset:stop, block.offset:stop] = np.linalg.inv(block.matrix + lam * np.eye(block.size))
    queries = np.random.default_rng(2).normal(size=(4, grads.shape[1]))
    np.testing.assert_allclose(pre.apply(queries), queries @ dense, rtol=1e-9, atol=1e-12)
    lambdas = [b["damping"] for b in pre.knobs["blocks"]]
    np.testing.assert_allclose(lambdas, [0.1 * np.trace(b.matrix) / b.size for b in blocks])


def test_preconditioning_the_query_equals_preconditioning_the_train_gradient():
    grads = _gradients()
    pre = block_preconditioner(_blocks(grads), grads.shape[1], damping=0.05)
    q = np.random.default_rng(3).normal(size=(1, grads.shape[1]))
    dense = np.vstack([pre.apply(row[None, :])[0] for row in np.eye(grads.shape[1])])  # P, row by row
    np.testing.assert_allclose(-(pre.apply(q) @ grads.T), -(q @ (dense @ grads.T)), rtol=1e-9)


def test_block_without_matrices_refuses_with_the_projection_hint():
    stats = IndexStatistics(dim=12, second_moment=np.ones(12),
                            blocks=(BlockMoment("a", 0, 6, np.eye(6)), BlockMoment("b", 6, 6, None)))
    with pytest.raises(GradientIndexError) as error:
        fit_preconditioner("block", stats)
    assert "projection_dim" in error.value.hint and "b" in error.value.message
    with pytest.raises(GradientIndexError):
        fit_preconditioner("block", IndexStatistics(dim=12, second_moment=np.ones(12)))


def test_zero_columns_and_zero_blocks_never_give_nan_or_inf():
    grads = _gradients()
    grads[:, 2] = 0.0
    grads[:, 3:8] = 0.0  # the whole second block
    moment = (grads**2).mean(axis=0)
    queries = np.random.default_rng(4).normal(size=(2, grads.shape[1]))
    for damping in (None, 0.0):
        diagonal = diagonal_preconditioner(moment, damping=damping)
        block = block_preconditioner(_blocks(grads), grads.shape[1], damping=damping)
        for pre in (diagonal, block):
            out = pre.apply(queries)
            assert np.all(np.isfinite(out))
            if damping == 0.0:  # undamped, no signal there: the pseudo-inverse is zero
                np.testing.assert_array_equal(out[:, 3:8], 0.0)
            assert np.all(np.isfinite(-(out @ grads.T)))
    all_zero = diagonal_preconditioner(np.zeros(5))
    assert np.all(all_zero.apply(np.ones((1, 5))) == 0.0)


def test_singular_block_without_damping_is_the_pseudo_inverse():
    part = np.random.default_rng(5).normal(size=(2, 4))  # rank 2 in 4 dims
    matrix = part.T @ part
    pre = block_preconditioner((BlockMoment("a", 0, 4, matrix),), 4, damping=0.0)
    q = np.random.default_rng(6).normal(size=(1, 4))
    np.testing.assert_allclose(pre.apply(q), q @ np.linalg.pinv(matrix), rtol=1e-6, atol=1e-9)
    assert pre.knobs["blocks"][0]["dropped_directions"] == 2


def test_adam_divides_by_sqrt_v_plus_eps():
    v = np.array([0.0, 1e-6, 4.0, 9.0])
    pre = adam_preconditioner(v, eps=1e-8, dim=4)
    np.testing.assert_allclose(pre.apply(np.ones((1, 4))), 1.0 / (np.sqrt(v) + 1e-8)[None, :])
    with pytest.raises(RunDirError):
        adam_preconditioner(np.array([1.0, -1.0]))
    with pytest.raises(RunDirError):
        adam_preconditioner(v, dim=5)


def test_adam_refusals_say_why():
    with pytest.raises(GradientIndexError) as projected:
        fit_preconditioner("adam", IndexStatistics(dim=4, projected=True))
    assert "projection_dim" in projected.value.hint
    with pytest.raises(RunDirError) as missing:
        fit_preconditioner("adam", IndexStatistics(dim=4))
    assert "optimizer.pt" in missing.value.message


def test_from_config_records_every_knob_as_json():
    grads = _gradients()
    stats = IndexStatistics(dim=grads.shape[1], second_moment=(grads**2).mean(axis=0), blocks=_blocks(grads))
    for kind in ("none", "diagonal", "block"):
        pre = from_config(AttributionConfig(preconditioner=kind, damping_ratio=0.2), stats)
        knobs = json.loads(json.dumps(dict(pre.knobs)))
        assert knobs["kind"] == kind
        if kind != "none":
            assert knobs["damping_ratio"] == 0.2
    assert np.array_equal(from_config(AttributionConfig(preconditioner="none"), stats).apply(grads[:2]), grads[:2])


def test_non_finite_statistics_are_an_index_error():
    with pytest.raises(GradientIndexError):
        diagonal_preconditioner(np.array([1.0, np.nan]))
    with pytest.raises(GradientIndexError):
        diagonal_preconditioner(np.ones(3)).apply(np.ones((1, 4)))


def test_the_adam_state_is_read_from_the_highest_numbered_checkpoint(tmp_path):
    from gradian.attribution.adam_state import latest_optimizer_file

    for step in (9, 10):  # "checkpoint-9" sorts after "checkpoint-10" as a string
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "optimizer.pt").write_bytes(b"")
    (tmp_path / "checkpoint-final").mkdir()  # not a checkpoint-N dir
    assert latest_optimizer_file(tmp_path) == tmp_path / "checkpoint-10" / "optimizer.pt"
    assert latest_optimizer_file(tmp_path / "checkpoint-9") == tmp_path / "checkpoint-9" / "optimizer.pt"
    assert latest_optimizer_file(None) is None and latest_optimizer_file(tmp_path / "missing") is None
