"""The index size estimate printed before a build, and the refusal when the disk cannot hold the index."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradian.errors import GradientIndexError
from gradian.index.sizing import (
    IndexEstimate,
    check_free_disk,
    estimate_index,
    free_bytes,
    human_bytes,
    kronecker_fit_bytes,
)
from gradian.index.store import Index
from tests.core.test_index_cli import assert_error, index_args, run_cli, write_dataset
from tests.support.disks import tmpfs


def test_the_estimate_is_printed_before_the_build_and_matches_the_shards(capsys, tmp_path, tiny_base_dir,
                                                                        tiny_adapter_dir):
    dataset = write_dataset(tmp_path / "train.jsonl", count=6)
    out = tmp_path / "index"
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, out,
                                               "--set", "grads.storage_dtype=float16"))
    assert code == 0, err
    line = next(line for line in err.splitlines() if line.startswith("index estimate:"))
    index = Index.open(out)
    estimate = IndexEstimate(6, index.dim, "float16", projected=False, peak_memory_bytes=0)
    assert f"6 examples x {index.dim:,} (exact, float16)" in line
    assert human_bytes(estimate.total_bytes) in line and "peak memory about" in line
    shard_bytes = sum((out / shard.file).stat().st_size for shard in index.manifest.shards)
    assert estimate.total_bytes <= shard_bytes <= estimate.total_bytes + 1024 * len(index.manifest.shards)
    # A reused index is not estimated again.
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, out,
                                               "--set", "grads.storage_dtype=float16"))
    assert code == 0 and "index estimate:" not in err


def test_peak_memory_counts_weights_logits_and_grows_with_the_batch(chatml_tokenizer):
    from tests.core.test_grads_exact import build_loaded

    loaded = build_loaded(chatml_tokenizer, r=4)
    weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    tokens, supervised = [40] * 16, [10] * 16
    small = estimate_index(loaded.model, 1000, "float32", False, tokens, supervised, batch_size=1, shard_size=8)
    large = estimate_index(loaded.model, 1000, "float32", False, tokens, supervised, batch_size=8, shard_size=8)
    vocab = loaded.causal_lm.config.vocab_size
    assert small.peak_memory_bytes > weights + 10 * vocab * 8
    assert large.peak_memory_bytes - small.peak_memory_bytes >= 7 * 10 * vocab * 8  # 7 more rows of fp32 + fp32 logits


@pytest.fixture()
def tiny_disk(tmp_path):
    """A real 16 KiB filesystem (tmpfs), where mounting is allowed (root); skipped elsewhere."""
    with tmpfs(tmp_path, 16 * 1024) as mount:
        yield mount


def test_a_disk_too_small_is_refused_before_any_gradient(capsys, tmp_path, tiny_base_dir, tiny_adapter_dir, tiny_disk):
    dataset = write_dataset(tmp_path / "train.jsonl", count=20)  # 20 x 1,664 float32 numbers: 133 KB
    out = tiny_disk / "index"
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, out))
    assert_error(code, err, "not enough free disk for the gradient index", "20 examples")
    assert "module_filter" in err and "projection_dim" in err
    assert "storage_dtype=float16" not in err  # the default already stores float16
    assert list(Path(tiny_disk).iterdir()) == []  # no index, no partial directory
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, out,
                                               "--set", "grads.storage_dtype=float32"))
    assert_error(code, err, "not enough free disk for the gradient index", "20 examples")
    assert "storage_dtype=float16 (half of float32)" in err


def test_the_refusal_names_what_the_index_cache_on_that_disk_holds(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))
    huge = IndexEstimate(10**6, 10**9, "float16", projected=False, peak_memory_bytes=0)  # 2 PB: never fits
    with pytest.raises(GradientIndexError) as refused:
        check_free_disk(huge, [(tmp_path / "index", 0, 0)])
    assert "index cache" not in refused.value.hint  # nothing cached yet
    old = tmp_path / "cache" / "indexes" / "0123abcd"
    old.mkdir(parents=True)
    (old / "shard-00000.npy").write_bytes(bytes(2_500_000))
    with pytest.raises(GradientIndexError) as refused:
        check_free_disk(huge, [(tmp_path / "index", 0, 0), (old.parent / "fedc", 0, 0)])
    hint = refused.value.hint
    assert "lower attribution.checkpoints" in hint
    assert "free 2.5 MB held by the index cache on that disk" in hint and "gradian cache prune" in hint


def test_the_kronecker_fit_kept_beside_the_index_counts_against_the_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))  # an empty index cache: no hint about it first
    small = IndexEstimate(10, 100, "float16", projected=False, peak_memory_bytes=0)
    check_free_disk(small, [(tmp_path / "index", 0, 0)])
    with pytest.raises(GradientIndexError) as refused:
        check_free_disk(small, [(tmp_path / "index", 0, free_bytes(tmp_path))])
    assert "with the kronecker fit's" in str(refused.value)
    assert refused.value.hint.startswith("set attribution.kronecker_wide=diagonal")


def test_the_estimate_line_names_the_kronecker_fit_where_one_will_be_kept(capsys, tmp_path, tiny_base_dir,
                                                                            tiny_adapter_dir):
    dataset = write_dataset(tmp_path / "train.jsonl", count=6)
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, tmp_path / "full"))
    assert code == 0, err
    line = next(line for line in err.splitlines() if line.startswith("index estimate:"))
    shapes = [tuple(block.stored_shape) for block in Index.open(tmp_path / "full").blocks]
    assert f"the kronecker fit keeps {human_bytes(kronecker_fit_bytes(shapes))} beside it" in line
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, tmp_path / "diagonal",
                                               "--set", "attribution.kronecker_wide=diagonal"))
    assert code == 0, err
    assert "kronecker fit" not in next(line for line in err.splitlines() if line.startswith("index estimate:"))
