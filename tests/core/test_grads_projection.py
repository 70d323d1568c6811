"""Factored projection: fixed width, seeded and stable, equal to sketching the exact gradient, JL-type accuracy."""

from __future__ import annotations

import math

import pytest
import torch

from gradian.errors import ConfigError
from gradian.grads.batch import collate
from gradian.grads.capture import GradientCapture
from gradian.grads.projection import (
    AUTO_BUDGET,
    AUTO_EXACT_LIMIT,
    MIN_SKETCH_SIDE,
    FactoredProjection,
    exact_width,
    factor_width,
    gaussian_sketch,
    matrix_seed,
    plan_auto_projection,
    plan_projection,
    resolve_projection,
    split_width,
)
from gradian.model.lora_blocks import LoraBlock
from tests.core.test_grads_exact import build_loaded, random_example

TARGETS = ("q_proj", "v_proj", "down_proj")  # exact width 1664 per example on the tiny model at r=4


def _examples(tokenizer, count: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return [random_example(generator, len(tokenizer), int(torch.randint(8, 30, (1,), generator=generator)), 4)
            for _ in range(count)]


def _block(name: str, r: int, d_in: int, d_out: int) -> LoraBlock:
    return LoraBlock(name=name, module_name=f"base_model.model.{name}", d_in=d_in, d_out=d_out, r=r, scaling=2.0)


def test_projected_capture_equals_sketching_the_exact_gradient(chatml_tokenizer):
    loaded = build_loaded(chatml_tokenizer, r=4, targets=TARGETS)
    batch = collate(_examples(chatml_tokenizer, 5), chatml_tokenizer.pad_token_id, "left")
    exact_capture = GradientCapture(loaded)
    projected_capture = GradientCapture(loaded, projection_dim=300, seed=3)
    exact = exact_capture.capture(batch)
    projected = projected_capture.capture(batch)
    assert projected.shape == (5, 300)
    for index, (exact_entry, entry) in enumerate(zip(exact_capture.block_layout, projected_capture.block_layout,
                                                     strict=True)):
        full = exact[:, exact_entry.offset:exact_entry.offset + exact_entry.size].reshape(5, *exact_entry.shape)
        want = projected_capture.projection.sketch_gradient(index, full).reshape(5, -1)
        got = projected[:, entry.offset:entry.offset + entry.size]
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def test_width_is_fixed_and_split_over_every_matrix(chatml_tokenizer):
    loaded = build_loaded(chatml_tokenizer, r=4)
    blocks = loaded.blocks()
    for dim in (28, 100, 1000, 2048, 10000):
        capture = GradientCapture(loaded, blocks, projection_dim=dim)
        plan = capture.projection_plan
        assert capture.dim == dim
        assert sum(s.width for s in plan.sketches) + plan.padding == dim
        assert all(s.width >= 1 for s in plan.sketches) and len(plan.sketches) == 2 * len(blocks)
        assert capture.block_layout[-1].offset + capture.block_layout[-1].size == dim - plan.padding
        batch = collate(_examples(chatml_tokenizer, 2), chatml_tokenizer.pad_token_id)
        assert capture.capture(batch).shape == (2, dim)
    with pytest.raises(ConfigError, match="grads.projection_dim 27"):
        GradientCapture(loaded, blocks, projection_dim=27)


def test_width_is_independent_of_model_size():
    small = [_block(f"model.layers.{i}.mlp.down_proj", 8, 64, 32) for i in range(2)]
    large = [_block(f"model.layers.{i}.mlp.down_proj", 8, 4096, 1024) for i in range(40)]
    for blocks in (small, large):
        plan = plan_projection(blocks, 2048)
        assert sum(s.width for s in plan.sketches) + plan.padding == 2048


def test_large_shares_keep_the_rank_side_exact():
    plan = plan_projection([_block("a", 8, 512, 256)], 1024)
    a, b = plan.sketches
    assert (a.k_rows, a.projects_rows, a.projects_cols) == (8, False, True)
    assert (b.k_cols, b.projects_cols, b.projects_rows) == (8, False, True)
    assert a.width + b.width == 1024 and plan.padding == 0
    # A share as large as the matrix itself is stored exactly.
    exact = plan_projection([_block("a", 4, 32, 16)], 4 * 32 + 16 * 4)
    assert not any(s.projects_rows or s.projects_cols for s in exact.sketches)


def test_split_width_is_proportional_and_exact():
    assert split_width(100, [10, 10, 80], [1, 1, 1]) == ([10, 10, 80], 0)
    alloc, padding = split_width(1000, [4096, 4096, 1024], [8, 8, 8])
    assert sum(alloc) + padding == 1000 and abs(alloc[0] - alloc[1]) <= 8 and min(alloc[:2]) > alloc[2] >= 1
    assert all(a % 8 == 0 for a in alloc)  # large shares come in whole ranks
    alloc, padding = split_width(10, [1000, 1, 1, 1], [8, 8, 8, 8])
    assert alloc == [7, 1, 1, 1] and padding == 0
    alloc, padding = split_width(37, [64, 64], [4, 4])  # units of 4 cannot make 37: the rest is padding
    assert alloc == [16, 20] or alloc == [20, 16]
    assert padding == 1
    with pytest.raises(ValueError):
        split_width(2, [1, 1, 1], [1, 1, 1])
    assert factor_width(64, 8) == (8, 8)
    assert factor_width(8, 8) == (2, 4)  # too small a share to keep r exact: balanced instead
    assert factor_width(7, 8) == (1, 7)


def test_projection_is_seeded_and_stable_across_processes(chatml_tokenizer):
    # The seed is a hash of the config seed and the matrix's identity, never Python's randomized hash().
    assert matrix_seed(0, "model.layers.0.mlp.down_proj", "A", "cols") == 6520367704085301668
    first = gaussian_sketch(0, "model.layers.0.mlp.down_proj", "A", "cols", 2, 3)
    assert torch.allclose(first, torch.tensor([[-1.3273, -0.5433, -0.7242], [-0.4166, -0.8042, -0.0217]]), atol=1e-4)
    loaded = build_loaded(chatml_tokenizer, r=4, targets=TARGETS)
    batch = collate(_examples(chatml_tokenizer, 3), chatml_tokenizer.pad_token_id)
    one = GradientCapture(loaded, projection_dim=256, seed=1).capture(batch)
    two = GradientCapture(loaded, projection_dim=256, seed=1).capture(batch)
    other = GradientCapture(loaded, projection_dim=256, seed=2).capture(batch)
    assert torch.equal(one, two)
    assert not torch.allclose(one, other)
    spec = GradientCapture(loaded, projection_dim=256, seed=1).spec()["projection"]
    assert spec["dim"] == 256 and spec["seed"] == 1 and spec["scheme"] == "factored-gaussian-v1"


def test_sketched_inner_products_are_unbiased():
    torch.manual_seed(0)
    block = _block("model.layers.0.mlp.down_proj", 4, 48, 24)
    left = torch.randn(1, 4, 48)
    right = left + 0.5 * torch.randn(1, 4, 48)
    exact = float((left * right).sum())
    estimates = []
    for seed in range(400):
        projection = FactoredProjection(plan_projection([block], 40, seed=seed))
        # Only the A matrix matters here: its sketch is the first.
        estimates.append(float((projection.sketch_gradient(0, left) * projection.sketch_gradient(0, right)).sum()))
    mean = sum(estimates) / len(estimates)
    spread = (sum((e - mean) ** 2 for e in estimates) / (len(estimates) - 1)) ** 0.5 / len(estimates) ** 0.5
    assert abs(mean - exact) < 4 * spread
    assert spread < 0.1 * abs(exact)


def test_projected_inner_products_match_exact_within_jl_bounds(chatml_tokenizer):
    """Normalized inner-product errors shrink like sqrt(r / k): a factored sketch with the rank side exact acts on a
    low-rank per-example gradient like a JL projection to about k / r dimensions."""
    loaded = build_loaded(chatml_tokenizer, r=4, targets=TARGETS)
    batch = collate(_examples(chatml_tokenizer, 16), chatml_tokenizer.pad_token_id)
    exact = GradientCapture(loaded).capture(batch).double()
    gram = exact @ exact.T
    norms = exact.norm(dim=1)
    scale = norms[:, None] * norms[None, :]
    errors = {}
    for k in (128, 512, 1536):
        projected = GradientCapture(loaded, projection_dim=k, seed=0).capture(batch).double()
        error = ((projected @ projected.T - gram).abs() / scale)
        errors[k] = float(error.mean())
        assert errors[k] < 3.0 * math.sqrt(4 / k), (k, errors[k])
        norm_error = ((projected.norm(dim=1) / norms) ** 2 - 1).abs()
        assert float(norm_error.median()) < 4.0 * math.sqrt(4 / k), (k, norm_error)
    assert errors[1536] < errors[512] < errors[128]
    assert errors[1536] < errors[128] / 2


LLAMA_8B_LAYER = [("self_attn.q_proj", 4096, 4096), ("self_attn.k_proj", 4096, 1024), ("self_attn.v_proj", 4096, 1024),
                  ("self_attn.o_proj", 4096, 4096), ("mlp.gate_proj", 4096, 14336), ("mlp.up_proj", 4096, 14336),
                  ("mlp.down_proj", 14336, 4096)]


def _llama_blocks(layers: int, r: int = 16, shapes=LLAMA_8B_LAYER) -> list[LoraBlock]:
    return [_block(f"model.layers.{i}.{name}", r, d_in, d_out) for i in range(layers) for name, d_in, d_out in shapes]


def test_auto_keeps_small_gradients_exact():
    blocks = [_block(f"model.layers.{i}.mlp.down_proj", 8, 64, 32) for i in range(2)]
    assert plan_auto_projection(blocks, 0, budget=exact_width(blocks)) is None
    assert plan_auto_projection(blocks, 0, budget=exact_width(blocks) - 1) is not None


def test_the_default_keeps_a_small_adapter_exact_and_projects_1b_and_8b():
    smollm2 = [("self_attn.q_proj", 576, 576), ("self_attn.k_proj", 576, 192), ("self_attn.v_proj", 576, 192),
               ("self_attn.o_proj", 576, 576), ("mlp.gate_proj", 576, 1536), ("mlp.up_proj", 576, 1536),
               ("mlp.down_proj", 1536, 576)]
    small = _llama_blocks(30, r=8, shapes=smollm2)
    assert exact_width(small) == 2_442_240 and resolve_projection(small, "auto") is None
    eight_b = _llama_blocks(32)
    assert resolve_projection(eight_b, "auto").dim <= AUTO_BUDGET < AUTO_EXACT_LIMIT < exact_width(eight_b)
    assert resolve_projection(small, None) is None and resolve_projection(small, 4096).dim == 4096


def test_auto_width_follows_matrix_size_and_never_sketches_below_the_floor():
    blocks = _llama_blocks(32)  # Llama-3-8B, r=16 on all seven projections: 41.9M numbers exact
    assert exact_width(blocks) == 41_943_040
    plan = plan_auto_projection(blocks, 0, budget=AUTO_BUDGET)
    assert 0.9 * AUTO_BUDGET <= plan.dim <= AUTO_BUDGET and plan.padding == 0
    for sketch in plan.sketches:
        rank_side, other = (sketch.k_rows, sketch.k_cols) if sketch.matrix == "A" else (sketch.k_cols, sketch.k_rows)
        assert rank_side == 16 and other >= MIN_SKETCH_SIDE  # the LoRA rank side is never sketched
    width = {(s.block.rsplit(".", 1)[-1], s.matrix): s.width for s in plan.sketches[:14]}
    assert width[("gate_proj", "B")] > width[("q_proj", "B")] > width[("k_proj", "B")]  # follows d_out
    assert plan.to_json()["sizing"] == "auto" and plan.to_json()["budget"] == AUTO_BUDGET


def test_auto_width_is_near_the_budget_whatever_the_model_size():
    one_b = [("self_attn.q_proj", 2048, 2048), ("self_attn.k_proj", 2048, 512), ("self_attn.v_proj", 2048, 512),
             ("self_attn.o_proj", 2048, 2048), ("mlp.gate_proj", 2048, 8192), ("mlp.up_proj", 2048, 8192),
             ("mlp.down_proj", 8192, 2048)]
    dims = [plan_auto_projection(blocks, 0, AUTO_BUDGET).dim
            for blocks in (_llama_blocks(16, shapes=one_b), _llama_blocks(32), _llama_blocks(80))]
    assert all(0.85 * AUTO_BUDGET <= dim <= AUTO_BUDGET for dim in dims[:2]), dims
    # 80 layers x 14 matrices at the floor of 16 x 16 still fit; nothing collapses to a 1x1 sketch.
    assert dims[2] <= 1.1 * AUTO_BUDGET


def test_auto_capture_equals_sketching_the_exact_gradient(chatml_tokenizer, monkeypatch):
    loaded = build_loaded(chatml_tokenizer, r=4, targets=TARGETS)
    monkeypatch.setattr("gradian.grads.projection.AUTO_BUDGET", 1200)  # the tiny model's 1664 numbers exceed it
    monkeypatch.setattr("gradian.grads.projection.AUTO_EXACT_LIMIT", 1200)
    batch = collate(_examples(chatml_tokenizer, 3), chatml_tokenizer.pad_token_id, "left")
    exact_capture = GradientCapture(loaded)
    auto = GradientCapture(loaded, projection_dim="auto", seed=1)
    assert auto.projection_plan.budget == 1200 and auto.dim == auto.projection_plan.dim <= 1200
    exact, projected = exact_capture.capture(batch), auto.capture(batch)
    for index, (exact_entry, entry) in enumerate(zip(exact_capture.block_layout, auto.block_layout, strict=True)):
        full = exact[:, exact_entry.offset:exact_entry.offset + exact_entry.size].reshape(3, *exact_entry.shape)
        want = auto.projection.sketch_gradient(index, full).reshape(3, -1)
        got = projected[:, entry.offset:entry.offset + entry.size]
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))
    monkeypatch.setattr("gradian.grads.projection.AUTO_EXACT_LIMIT", 1664)
    assert GradientCapture(loaded, projection_dim="auto").projection is None  # small enough: exact
