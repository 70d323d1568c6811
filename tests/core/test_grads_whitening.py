"""Whitening before the sketch: the capture transforms factors exactly, the fits invert the second moments they model,
builds keep and check them, and an exact index applies the Kronecker fit at query time."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gradian.errors import GradientIndexError
from gradian.grads.batch import collate
from gradian.grads.capture import GradientCapture
from gradian.grads.whitening import (
    SAMPLE_ROWS,
    SCHEMES,
    MomentAccumulator,
    Whitening,
    moments_of_rows,
    sample_positions,
    whitening_spec,
)
from tests.core.test_grads_exact import build_loaded
from tests.core.test_grads_projection import TARGETS, _examples
from tests.core.test_index_build import build, make_examples


@pytest.fixture(scope="module")
def tiny_model(tiny_base_dir, tiny_adapter_dir):
    """The tiny base model with its LoRA adapter, loaded once for this module's index builds."""
    from gradian.model.loaded import LoadedModel

    return LoadedModel.load(tiny_base_dir, tiny_adapter_dir)


def _random_whitening(capture: GradientCapture, seed: int = 0, full_narrow_side: bool = False) -> Whitening:
    generator = torch.Generator().manual_seed(seed)

    def side(size: int, full: bool) -> torch.Tensor:
        if not full:
            return torch.rand(size, generator=generator) + 0.1
        root = torch.randn(size, size, generator=generator)
        return root @ root.T + torch.eye(size)  # symmetric, as every fitted transform is

    scales = [(side(rows, full_narrow_side and rows <= cols), side(cols, full_narrow_side and cols < rows))
              for rows, cols in capture.exact_shapes()]
    return Whitening(scales, {"scheme": SCHEMES["kronecker" if full_narrow_side else "diagonal"]})


def _as_matrix(transform: torch.Tensor) -> torch.Tensor:
    return transform if transform.dim() == 2 else torch.diag(transform)


@pytest.mark.parametrize("full_narrow_side", [False, True], ids=["diagonal", "kronecker"])
def test_whitened_capture_equals_transforming_then_sketching_the_exact_gradient(chatml_tokenizer, full_narrow_side):
    loaded = build_loaded(chatml_tokenizer, r=4, targets=TARGETS)
    batch = collate(_examples(chatml_tokenizer, 5), chatml_tokenizer.pad_token_id, "left")
    exact_capture = GradientCapture(loaded)
    whitened = GradientCapture(loaded, projection_dim=300, seed=3)
    whitened.whitening = _random_whitening(whitened, full_narrow_side=full_narrow_side)
    exact, got = exact_capture.capture(batch), whitened.capture(batch)
    for index, (exact_entry, entry) in enumerate(zip(exact_capture.block_layout, whitened.block_layout, strict=True)):
        full = exact[:, exact_entry.offset:exact_entry.offset + exact_entry.size].reshape(5, *exact_entry.shape)
        rows, cols = whitened.whitening.scales[index]
        assert (rows.dim() == 2 or cols.dim() == 2) == full_narrow_side
        transformed = _as_matrix(rows) @ full @ _as_matrix(cols)
        want = whitened.projection.sketch_gradient(index, transformed).reshape(5, -1)
        part = got[:, entry.offset:entry.offset + entry.size]
        assert torch.allclose(part, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def test_moments_are_sums_of_the_exact_squared_gradients(chatml_tokenizer):
    loaded = build_loaded(chatml_tokenizer, r=4, targets=TARGETS)
    examples = _examples(chatml_tokenizer, 6, seed=1)
    capture = GradientCapture(loaded, projection_dim=300)
    capture.whitening = _random_whitening(capture)  # measured before any scaling or sketch, whatever is set
    moments = MomentAccumulator(capture.exact_shapes())
    for start in (0, 4):
        capture.measure_moments(collate(examples[start:start + 4], chatml_tokenizer.pad_token_id, "left"), moments)
    assert moments.examples == 6
    exact_capture = GradientCapture(loaded)
    exact = exact_capture.capture(collate(examples, chatml_tokenizer.pad_token_id, "left")).double()
    for index, entry in enumerate(exact_capture.block_layout):
        squared = exact[:, entry.offset:entry.offset + entry.size].reshape(6, *entry.shape).square()
        torch.testing.assert_close(moments.rows[index], squared.sum(dim=(0, 2)), rtol=1e-5, atol=1e-12)
        torch.testing.assert_close(moments.cols[index], squared.sum(dim=(0, 1)), rtol=1e-5, atol=1e-12)
        g = exact[:, entry.offset:entry.offset + entry.size].reshape(6, *entry.shape)
        narrow = g if entry.shape[0] <= entry.shape[1] else g.transpose(1, 2)  # A's rows, B's columns: the rank
        assert moments.grams[index].shape == (4, 4)
        gram = torch.einsum("nij,nkj->ik", narrow, narrow)  # off-diagonal sums cancel: tolerance of the largest
        torch.testing.assert_close(moments.grams[index], gram, rtol=1e-5, atol=1e-5 * float(gram.abs().max()))


def _accumulated(second_moments: list[np.ndarray], examples: int = 4) -> MomentAccumulator:
    moments = MomentAccumulator([m.shape for m in second_moments])
    moments.examples = examples
    for index, m in enumerate(second_moments):
        moments.rows[index] = torch.from_numpy(m.sum(axis=1) * examples)
        moments.cols[index] = torch.from_numpy(m.sum(axis=0) * examples)
    return moments


def test_the_fit_inverts_a_rank_one_second_moment_exactly():
    generator = np.random.default_rng(0)
    second = [np.outer(generator.uniform(0.1, 3, 4), generator.uniform(0.01, 5, 7)),
              np.outer(generator.uniform(1, 9, 6), generator.uniform(0.1, 1, 4))]
    whitening = _accumulated(second).whitening(damping=0.0, damping_ratio=0.1)
    for (rows, cols), moment in zip(whitening.scales, second, strict=True):
        np.testing.assert_allclose(np.outer(rows.numpy(), cols.numpy()), 1 / np.sqrt(moment), rtol=1e-5)
    assert whitening.info["sample_rows"] == 4 and whitening.info["damping"] == 0.0


def test_damping_follows_the_mean_second_moment_and_silent_coordinates_get_nothing():
    second = [np.array([[1.0, 4.0], [0.0, 0.0]]), np.array([[2.0, 2.0, 2.0]])]
    ratio = 0.5
    whitening = _accumulated(second).whitening(damping=None, damping_ratio=ratio)
    mean = (5.0 + 6.0) / 7
    assert whitening.info["damping"] == pytest.approx(ratio * mean)
    undamped = _accumulated(second).whitening(damping=0.0, damping_ratio=ratio)
    assert float(undamped.scales[0][0][1]) == 0.0  # a row no gradient touched: zero weight, never inf
    rows, cols = whitening.scales[1]
    lam = ratio * mean
    np.testing.assert_allclose(np.outer(rows.numpy(), cols.numpy()),
                               np.sqrt(2.0) / np.sqrt((2.0 + lam / 2) * (2.0 + lam / 2)), rtol=1e-6)


def test_scales_round_trip_through_safetensors_and_a_wrong_file_is_refused(tmp_path):
    generator = np.random.default_rng(1)
    whitening = _accumulated([generator.uniform(0.1, 1, (3, 5)), generator.uniform(0.1, 1, (5, 3))]).whitening(
        damping=None, damping_ratio=0.1)
    whitening.save(tmp_path / "w.safetensors")
    again = Whitening.load(tmp_path / "w.safetensors", 2)
    assert again.info == json.loads(json.dumps(whitening.info))
    for (a, b), (c, d) in zip(whitening.scales, again.scales, strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)
    with pytest.raises(ValueError, match="expected 6"):
        Whitening.load(tmp_path / "w.safetensors", 3)


def test_sample_positions_are_seeded_sorted_and_all_rows_when_few():
    assert sample_positions(10, seed=0) == list(range(10))
    one, again, other = (sample_positions(1000, seed=s) for s in (5, 5, 6))
    assert one == again != other and one == sorted(one) and len(one) == SAMPLE_ROWS == len(set(one))


def _inverse_root(matrix: np.ndarray, damping: float) -> np.ndarray:
    values, vectors = np.linalg.eigh(matrix)
    return (vectors / np.sqrt(values + damping)) @ vectors.T


def test_the_kronecker_fit_is_the_damped_inverse_root_of_the_rank_side_and_the_wide_diagonal():
    generator = np.random.default_rng(3)
    shapes = [(3, 7), (6, 3)]  # a LoRA A (r x d_in) and B (d_out x r) of rank 3
    n = 9
    gradients = [generator.normal(size=(n, *shape)) * generator.uniform(0.1, 2, size=shape[1]) for shape in shapes]
    rows = np.concatenate([g.reshape(n, -1) for g in gradients], axis=1)
    moments = moments_of_rows(rows, shapes)
    assert moments.examples == n
    ratio = 0.3
    whitening = moments.whitening(damping=None, damping_ratio=ratio, scheme=SCHEMES["kronecker"])
    lam = ratio * float(np.mean(rows**2))
    assert whitening.info["scheme"] == "kronecker-rank-v1" and whitening.info["damping"] == pytest.approx(lam)
    for g, (row_side, col_side) in zip(gradients, whitening.scales, strict=True):
        n_rows, n_cols = g.shape[1:]
        side = float(np.mean(g**2)) ** 0.25
        if n_rows <= n_cols:  # A: full r x r on the rows, the wide columns diagonal
            left = np.einsum("nij,nkj->ik", g, g) / (n * n_cols)
            np.testing.assert_allclose(row_side.numpy(), side * _inverse_root(left, lam / 2), rtol=1e-4, atol=1e-7)
            wide = (g**2).sum(axis=(0, 1)) / (n * n_rows)
            np.testing.assert_allclose(col_side.numpy(), side / np.sqrt(wide + lam / 2), rtol=1e-5)
        else:  # B: the wide rows diagonal, full r x r on the columns
            right = np.einsum("nji,njk->ik", g, g) / (n * n_rows)
            np.testing.assert_allclose(col_side.numpy(), side * _inverse_root(right, lam / 2), rtol=1e-4, atol=1e-7)
            wide = (g**2).sum(axis=(0, 2)) / (n * n_cols)
            np.testing.assert_allclose(row_side.numpy(), side / np.sqrt(wide + lam / 2), rtol=1e-5)
    # The diagonal scheme from the same sums is unchanged: vectors on both sides.
    assert all(a.dim() == b.dim() == 1 for a, b in moments.whitening(damping=None, damping_ratio=ratio).scales)


def test_the_kronecker_fit_gives_a_singular_rank_side_no_inf():
    gradient = np.zeros((2, 3, 5))
    gradient[:, 0, :] = 1.0  # one rank direction only: the other two carry nothing
    whitening = moments_of_rows(gradient.reshape(2, -1), [(3, 5)]).whitening(
        damping=0.0, damping_ratio=0.0, scheme=SCHEMES["kronecker"])
    rows, _ = whitening.scales[0]
    assert torch.isfinite(rows).all() and float(rows[1:, 1:].abs().max()) == 0.0 and float(rows[0, 0]) > 0


def test_only_a_projected_index_scored_with_a_fitted_preconditioner_is_whitened():
    assert whitening_spec(True, "diagonal", 10) == {"scheme": "factored-diagonal-v1", "sample_rows": 10}
    assert whitening_spec(True, "kronecker", 10) == {"scheme": "kronecker-rank-v1", "sample_rows": 10}
    assert whitening_spec(True, "diagonal", 10_000)["sample_rows"] == SAMPLE_ROWS
    assert whitening_spec(False, "diagonal", 10) is None and whitening_spec(False, "kronecker", 10) is None
    assert all(whitening_spec(True, kind, 10) is None for kind in ("none", "block", "adam"))


def test_a_projected_build_stores_its_scales_and_its_rows_are_whitened_sketches(tiny_model, tmp_path):
    from gradian.attribution.index_statistics import index_statistics
    from gradian.attribution.preconditioners import fit_preconditioner
    from gradian.data import encode
    from gradian.index.build import build_index
    from gradian.index.store import Index

    loaded = tiny_model
    index = build_index(loaded, make_examples(), index_config("attribution.preconditioner=diagonal"), tmp_path / "diag")
    spec = index.manifest.spec["grads"]
    assert spec["whitening"] == {"scheme": "factored-diagonal-v1", "sample_rows": 10}
    assert "whitening.safetensors" in index.manifest.files
    whitening = index.whitening()
    assert len(whitening.scales) == len(index.blocks) and whitening.info["sample_rows"] == 10

    # Each stored row is the example's gradient captured with those scales (queries go through the same capture).
    capture = GradientCapture.for_index(loaded, index_config().grads, index)
    pad = loaded.tokenizer.pad_token_id
    batch = collate([encode(e, loaded.tokenizer, 1024) for e in make_examples()[:3]], pad, "right")
    np.testing.assert_allclose(index.rows_between(0, 3), capture.capture(batch).numpy(), rtol=1e-4, atol=1e-7)

    statistics = index_statistics(index)
    applied = fit_preconditioner("diagonal", statistics)
    assert applied.knobs["applied"].startswith("before the sketch")
    np.testing.assert_array_equal(applied.apply(np.ones((1, index.dim))), np.ones((1, index.dim)))
    with pytest.raises(GradientIndexError, match="cannot be applied"):
        fit_preconditioner("none", statistics)

    # Unscaled when scored otherwise: another index, without scales.
    plain = build_index(loaded, make_examples(), index_config("attribution.preconditioner=none"), tmp_path / "plain")
    assert plain.index_id != index.index_id and plain.whitening() is None
    assert not (plain.path / "whitening.safetensors").exists()

    (index.path / "whitening.safetensors").write_bytes(b"damaged")
    with pytest.raises(GradientIndexError, match="whitening.safetensors .*checksum"):
        Index.open(index.path).whitening()


def index_config(*extra: str):
    from gradian.config import load_config

    return load_config(None, ["grads.shard_size=4", "grads.batch_size=3", "grads.storage_dtype=float32",
                              "grads.projection_dim=48", *extra])


def test_a_kronecker_projected_build_stores_rank_side_matrices_and_scores_with_them(tiny_model, tmp_path):
    from gradian.attribution.index_statistics import index_statistics
    from gradian.attribution.preconditioners import fit_preconditioner
    from gradian.data import encode
    from gradian.index.build import build_index

    loaded = tiny_model
    config = index_config("attribution.preconditioner=kronecker")
    index = build_index(loaded, make_examples(), config, tmp_path / "kron")
    assert index.manifest.spec["grads"]["whitening"] == {"scheme": "kronecker-rank-v1", "sample_rows": 10}
    whitening = index.whitening()
    assert all((rows.dim() == 2) != (cols.dim() == 2) for rows, cols in whitening.scales)
    capture = GradientCapture.for_index(loaded, config.grads, index)
    batch = collate([encode(e, loaded.tokenizer, 1024) for e in make_examples()[:3]], loaded.tokenizer.pad_token_id,
                    "right")
    np.testing.assert_allclose(index.rows_between(0, 3), capture.capture(batch).numpy(), rtol=1e-4, atol=1e-7)
    statistics = index_statistics(index, "kronecker")
    assert fit_preconditioner("kronecker", statistics).knobs["scheme"] == "kronecker-rank-v1"
    with pytest.raises(GradientIndexError, match="kronecker preconditioner before") as refused:
        fit_preconditioner("diagonal", statistics)
    assert "use attribution.preconditioner kronecker" in refused.value.hint


def test_an_exact_index_scored_with_kronecker_ranks_as_whitened_rows_and_queries(tiny_model, tmp_path):
    """On an exact index P q . g equals (T q T) . (T g T) with T fitted from the sampled stored rows."""
    from gradian.attribution.index_statistics import index_statistics
    from gradian.attribution.preconditioners import fit_preconditioner

    index = build(tiny_model, tmp_path)
    assert index.whitening() is None and index.manifest.projection is None
    statistics = index_statistics(index, "kronecker", chunk_bytes=3 * index.dim * 4)  # the sample read in chunks
    pre = fit_preconditioner("kronecker", statistics, damping_ratio=0.2)
    rows = index.rows_between(0, index.num_examples).astype(np.float64)
    shapes = [tuple(block.stored_shape) for block in index.blocks]
    whitening = moments_of_rows(rows[sample_positions(index.num_examples, 0)], shapes).whitening(
        damping=None, damping_ratio=0.2, scheme=SCHEMES["kronecker"])
    queries = np.random.default_rng(0).normal(size=(2, index.dim))

    def whitened(vectors: np.ndarray) -> np.ndarray:
        out, offset = [], 0
        for (n_rows, n_cols), (left, right) in zip(shapes, whitening.scales, strict=True):
            block = torch.from_numpy(vectors[:, offset:offset + n_rows * n_cols]).reshape(-1, n_rows, n_cols)
            out.append((_as_matrix(left.double()) @ block @ _as_matrix(right.double())).reshape(len(vectors), -1))
            offset += n_rows * n_cols
        return torch.cat(out, dim=1).numpy()

    want = whitened(queries) @ whitened(rows).T
    got = pre.apply(queries) @ rows.T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * float(np.abs(want).max()))
    np.testing.assert_allclose(pre.apply(rows[:2]) @ queries.T, got[:, :2].T, rtol=1e-6, atol=1e-9)  # symmetric
    assert pre.kind == "kronecker" and pre.knobs["sample_rows"] == index.num_examples
