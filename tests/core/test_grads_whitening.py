"""Whitening before the sketch: the capture scales factors exactly, the fit inverts E[g^2], builds keep and check it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gradian.errors import GradientIndexError
from gradian.grads.batch import collate
from gradian.grads.capture import GradientCapture
from gradian.grads.whitening import SAMPLE_ROWS, MomentAccumulator, Whitening, sample_positions, whitening_spec
from tests.core.test_grads_exact import build_loaded
from tests.core.test_grads_projection import TARGETS, _examples
from tests.core.test_index_build import build, make_examples


@pytest.fixture(scope="module")
def tiny_model(tiny_base_dir, tiny_adapter_dir):
    """The tiny base model with its LoRA adapter, loaded once for this module's index builds."""
    from gradian.model.loaded import LoadedModel

    return LoadedModel.load(tiny_base_dir, tiny_adapter_dir)


def _random_whitening(capture: GradientCapture, seed: int = 0) -> Whitening:
    generator = torch.Generator().manual_seed(seed)
    scales = [(torch.rand(rows, generator=generator) + 0.1, torch.rand(cols, generator=generator) + 0.1)
              for rows, cols in capture.exact_shapes()]
    return Whitening(scales, {"scheme": "factored-diagonal-v1"})


def test_whitened_capture_equals_scaling_then_sketching_the_exact_gradient(chatml_tokenizer):
    loaded = build_loaded(chatml_tokenizer, r=4, targets=TARGETS)
    batch = collate(_examples(chatml_tokenizer, 5), chatml_tokenizer.pad_token_id, "left")
    exact_capture = GradientCapture(loaded)
    whitened = GradientCapture(loaded, projection_dim=300, seed=3)
    whitened.whitening = _random_whitening(whitened)
    exact, got = exact_capture.capture(batch), whitened.capture(batch)
    for index, (exact_entry, entry) in enumerate(zip(exact_capture.block_layout, whitened.block_layout, strict=True)):
        full = exact[:, exact_entry.offset:exact_entry.offset + exact_entry.size].reshape(5, *exact_entry.shape)
        rows, cols = whitened.whitening.scales[index]
        want = whitened.projection.sketch_gradient(index, rows[:, None] * full * cols[None, :]).reshape(5, -1)
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


def test_only_a_projected_index_scored_with_the_diagonal_is_whitened():
    assert whitening_spec(True, "diagonal", 10) == {"scheme": "factored-diagonal-v1", "sample_rows": 10}
    assert whitening_spec(True, "diagonal", 10_000)["sample_rows"] == SAMPLE_ROWS
    assert whitening_spec(False, "diagonal", 10) is None
    assert all(whitening_spec(True, kind, 10) is None for kind in ("none", "block", "adam"))


def test_a_projected_build_stores_its_scales_and_its_rows_are_whitened_sketches(tiny_model, tmp_path):
    from gradian.attribution.api import index_statistics
    from gradian.attribution.preconditioners import fit_preconditioner
    from gradian.data import encode
    from gradian.index.build import build_index
    from gradian.index.store import Index

    loaded = tiny_model
    index = build(loaded, tmp_path, projection_dim=48)
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
