"""Building a gradient index: shards of per-example gradients, computed by rank, resumable, cached by index id.

``build_index`` fixes the plan (``gradian.index.plan``), reuses an identical index in place, and otherwise
computes the unfinished shards of this rank and lets rank 0 finish the directory
(``gradian.index.directory``). Under torchrun each rank takes a contiguous run of shard numbers, so the
files are the ones a single process writes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gradian.atomic_files import write_with
from gradian.config import AttributionConfig, GradianConfig, GradsConfig
from gradian.data.encode import Encoded, encode
from gradian.data.loss_mask import concrete_encoding, concrete_loss_mask
from gradian.errors import DatasetError, GradientIndexError
from gradian.grads.batch import collate
from gradian.grads.capture import GradientCapture
from gradian.grads.whitening import MomentAccumulator, sample_positions
from gradian.index.directory import (
    BUILD_STATE,
    check_out_dir,
    finalize,
    finished_shard,
    holds_index,
    prepare_partial,
    reusable_index,
    write_shard,
)
from gradian.index.distributed import RankContext, rank_context
from gradian.index.dtypes import decode_rows, encode_rows, storage_numpy_dtype
from gradian.index.mapped import release_pages
from gradian.index.plan import (
    BuildPlan,
    ExampleMeta,
    checkpoint_plan,
    default_index_dir,
    encode_pass,
    make_plan,
)
from gradian.index.sizing import (
    IN_MEMORY_SHARD_BYTES,
    IndexEstimate,
    check_free_disk,
    estimate_index,
    human_bytes,
    kronecker_fit_bytes,
    written_bytes,
)
from gradian.index.stats import StatsAccumulator
from gradian.index.store import WHITENING_NAME, Index, get_codec, read_whitening
from gradian.runs.training_format import read_run_of_adapter, with_loss_mask

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from gradian.data.examples import Example
    from gradian.model.loaded import LoadedModel
    from gradian.records import RunArtifact

__all__ = ["ProgressCallback", "build_index", "default_index_dir"]

# (examples done, examples to do) after every batch; the CLI turns it into a progress bar.
ProgressCallback = Callable[[int, int], None]


def build_index(loaded_model: LoadedModel, dataset: Sequence[Example], config: GradianConfig | None = None,
                out: Path | str | None = None, *, progress: ProgressCallback | None = None,
                say: Callable[[str], None] | None = None, checkpoint_hashes: Sequence[str] = (),
                scored_alone: bool = True) -> Index:
    """Build the gradient index of ``dataset`` under ``loaded_model``'s adapter, or reuse an identical one.

    Before computing anything, ``say`` gets the estimate line (bytes per example, total size, peak memory), and a
    build whose shards would not fit on the output's disk is refused. ``checkpoint_hashes`` names the checkpoints
    whose indexes of the same examples the caller builds next (the checkpoint ensemble): those not in the index
    cache yet count against its disk too, so a run short of disk learns it before the first gradient, and so does
    the kronecker fit attribution keeps beside an exact index it scores with a full wide side (``scored_alone``: this
    index's point is scored without checkpoints, where kronecker_wide auto fits it).
    """
    config = config if config is not None else GradianConfig()
    examples = list(dataset)
    if not examples:
        raise DatasetError("the dataset has no examples, so there is nothing to index", "pass the training data you used")
    config = follow_training_run(config, loaded_model, examples)
    codec = get_codec(config.grads.codec)
    storage_numpy_dtype(config.grads.storage_dtype)
    capture = GradientCapture.from_config(loaded_model, config.grads)
    tokenizer = loaded_model.tokenizer
    metas, ids_sha, encoded_sha = encode_pass(examples, tokenizer, config.grads)
    refuse_unsupervised(metas, dataset, config.grads)
    plan = make_plan(loaded_model, capture, config, examples, ids_sha, encoded_sha, out, codec, dataset)
    estimate = estimate_index(loaded_model.model, plan.dim, plan.storage_dtype, capture.projection is not None,
                              [m.num_tokens for m in metas], [m.num_supervised for m in metas],
                              config.grads.batch_size, plan.shard_size)
    later = [checkpoint_plan(plan, adapter_hash) for adapter_hash in checkpoint_hashes]
    fits = _kronecker_fit_bytes(capture, config.attribution, scored_alone)
    ranks = rank_context(loaded_model.device)
    try:
        return _build_on_ranks(plan, ranks, capture, examples, tokenizer, metas, config.grads, progress,
                               estimate, say, later, fits)
    finally:
        ranks.close()


def refuse_unsupervised(metas: Sequence[ExampleMeta], dataset: Sequence[Example], grads: GradsConfig) -> None:
    """Refuse a dataset none of whose examples has a supervised token: its index would be all zeros."""
    if any(meta.num_supervised for meta in metas):
        return
    where = getattr(dataset, "path", None) or "the dataset"
    truncated = sum(1 for meta in metas if meta.truncated)
    why = (f"{truncated} of them cut at grads.max_seq_length={grads.max_seq_length} before the answer"
           if truncated else f"loss mask {concrete_loss_mask(grads)}")
    raise DatasetError(
        f"no example in {where} has a supervised token ({len(metas)} examples, {why}): every gradient would be "
        "zero and nothing could be blamed",
        "index the data the adapter was trained on (with its assistant answers); gradian diagnose --dataset lists "
        "the rows" + (", or raise grads.max_seq_length" if truncated else ""))


def follow_training_run(config: GradianConfig, loaded_model: LoadedModel, examples: Sequence[Example],
                        run: RunArtifact | None = None) -> GradianConfig:
    """``config`` with grads.loss_mask and string_pairs ``auto`` made concrete from ``run`` or the adapter's run."""
    if "auto" not in (config.grads.loss_mask, config.grads.string_pairs):
        return config
    run = run if run is not None else read_run_of_adapter(getattr(loaded_model, "adapter_dir", None))
    return with_loss_mask(config, run, examples)[0]


def _build_on_ranks(plan: BuildPlan, ranks: RankContext, capture: GradientCapture, examples: list[Example],
                    tokenizer: PreTrainedTokenizerBase, metas: list[ExampleMeta], grads: GradsConfig,
                    progress: ProgressCallback | None, estimate: IndexEstimate,
                    say: Callable[[str], None] | None, later: Sequence[BuildPlan], fits: tuple[int, int]) -> Index:
    """Reuse the index in place, or compute this rank's shards and (rank 0) finish the directory."""
    ranks.check_same(plan.index_id, "index id")
    cached = reusable_index(plan.out_dir, plan.index_id, say if ranks.is_main else None)
    pending = [p for p in later if not holds_index(p.out_dir, p.index_id)]
    if cached is None:
        check_out_dir(plan.out_dir)
        if say is not None and ranks.is_main:
            each = ", each with its kronecker fit" if fits[1] else ""
            then = (f"; then {len(pending)} checkpoint index{'es' if len(pending) > 1 else ''} of the same size"
                    f"{each} (attribution.checkpoints)") if pending else ""
            fit = f"; the kronecker fit keeps {human_bytes(fits[0])} beside it" if fits[0] else ""
            say(estimate.line() + fit + then)
    builds = ([] if cached is not None else [(plan.out_dir, _resumable_bytes(plan), fits[0])])
    check_free_disk(estimate, builds + [(p.out_dir, _resumable_bytes(p), fits[1]) for p in pending])
    if cached is not None:
        ranks.barrier()
        return cached
    started = time.monotonic()
    ranks.together(lambda: prepare_partial(plan) if ranks.is_main else None)
    if plan.whitening is not None:
        ranks.together(lambda: _measure_whitening(plan, capture, examples, tokenizer, grads, say)
                       if ranks.is_main else None)
        # Every rank, rank 0 too, scales by the file: what a resumed build and the other ranks read.
        capture.whitening = ranks.together(lambda: read_whitening(plan.partial_dir, len(capture.block_layout)))
    computed = ranks.together(lambda: _run_shards(plan, ranks, capture, examples, tokenizer, grads, progress))
    computed = ranks.all_reduce_sum([computed])[0]
    timing = {"seconds": round(time.monotonic() - started, 3), "world_size": ranks.world_size,
              "computed_examples": computed}
    ranks.together(lambda: finalize(plan, metas, timing) if ranks.is_main else None)
    return Index.open(plan.out_dir)


def _kronecker_fit_bytes(capture: GradientCapture, attribution: AttributionConfig, scored_alone: bool) -> tuple[int, int]:
    """Bytes of the kronecker fit kept beside this index and beside each checkpoint's: 0 where none is fitted."""
    if attribution.preconditioner != "kronecker" or capture.projection is not None:
        return 0, 0  # a projected index keeps its wide side diagonal, in the index's statistics
    fit = kronecker_fit_bytes([entry.shape for entry in capture.block_layout])
    here, checkpoints = (fit if attribution.wide_side(alone) == "full" else 0 for alone in (scored_alone, False))
    return here, checkpoints


def _resumable_bytes(plan: BuildPlan) -> int:
    """Bytes already written by an interrupted build of this same index (a build of other inputs is discarded)."""
    state = plan.partial_dir / BUILD_STATE
    try:
        same = state.is_file() and state.read_text(encoding="utf-8") == json.dumps(plan.build_state(), sort_keys=True)
    except (OSError, UnicodeDecodeError):
        return 0
    return written_bytes(plan.partial_dir) if same else 0


def _run_shards(plan: BuildPlan, ranks: RankContext, capture: GradientCapture, examples: list[Example],
                tokenizer: PreTrainedTokenizerBase, grads: GradsConfig, progress: ProgressCallback | None) -> int:
    """Compute this rank's unfinished shards; returns how many examples it computed."""
    mine = ranks.shard_range(plan.num_shards)
    todo = [n for n in mine if finished_shard(plan, n) is None]
    total = sum(len(plan.shard_rows(n)) for n in mine)
    done = total - sum(len(plan.shard_rows(n)) for n in todo)
    if progress is not None:
        progress(done, total)

    def advance(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    computed = 0
    for number in todo:
        rows = plan.shard_rows(number)
        encoded = [encode(examples[i], tokenizer, grads.max_seq_length, **concrete_encoding(grads)) for i in rows]
        stored, stats = compute_shard(plan, number, capture, encoded, [examples[i].id for i in rows],
                                      grads.batch_size, pad_id, advance)
        write_shard(plan, number, stored, stats)
        del stored  # unmapped before the next shard's scratch is made
        computed += len(rows)
    return computed


def _measure_whitening(plan: BuildPlan, capture: GradientCapture, examples: list[Example],
                       tokenizer: PreTrainedTokenizerBase, grads: GradsConfig,
                       say: Callable[[str], None] | None) -> None:
    """Fit the scaling applied before the sketch from exact gradients of a seeded sample (kept when resuming)."""
    path = plan.partial_dir / WHITENING_NAME
    if path.is_file():
        return
    positions = sample_positions(len(examples), plan.spec["seed"], plan.whitening["sample_rows"])
    if say is not None:
        say(f"measuring gradient scales on {len(positions)} rows before sketching")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = sorted((encode(examples[i], tokenizer, grads.max_seq_length, **concrete_encoding(grads))
                      for i in positions),
                     key=lambda e: len(e.input_ids))
    moments = MomentAccumulator(capture.exact_shapes())
    for start in range(0, len(encoded), grads.batch_size):
        capture.measure_moments(collate(encoded[start:start + grads.batch_size], pad_id, "right"), moments)
    damping = plan.spec["damping"]  # the settings the index id was made with
    whitening = moments.whitening(damping=damping["damping"], damping_ratio=damping["damping_ratio"],
                                  scheme=plan.whitening["scheme"])
    try:
        write_with(path, whitening.save)
    except OSError as error:
        raise GradientIndexError(f"could not write {path}: {error.strerror or error}",
                                 f"free disk space or pass a writable --out (now {plan.out_dir})") from None


def compute_shard(plan: BuildPlan, number: int, capture: GradientCapture, encoded: Sequence[Encoded],
                  ids: Sequence[str], batch_size: int, pad_id: int,
                  advance: Callable[[int], None]) -> tuple[np.ndarray, StatsAccumulator]:
    """Gradients of one shard's examples in the storage dtype, and their statistics."""
    count = len(encoded)
    dtype = storage_numpy_dtype(plan.storage_dtype)
    stored = _shard_buffer(plan, number, count, dtype)
    stats = StatsAccumulator(plan.dim)  # block matrices are made on demand (Index.block_stats)
    # Batches of similar length waste less compute on padding; the order is fixed, so bytes are too.
    order = sorted(range(count), key=lambda i: (len(encoded[i].input_ids), i))
    for start in range(0, count, batch_size):
        members = order[start:start + batch_size]
        batch = collate([encoded[i] for i in members], pad_id, "right")
        rows = capture.capture(batch).detach().cpu().numpy()
        _check_finite(rows, [ids[i] for i in members], "the gradient")  # float32: NaN/inf came from the weights
        encoded_rows = encode_rows(rows, plan.storage_dtype)
        decoded = decode_rows(encoded_rows, plan.storage_dtype)
        _check_finite(decoded, [ids[i] for i in members], f"the {plan.storage_dtype} gradient",
                      overflowed=plan.storage_dtype == "float16")  # finite in float32: only the cast can overflow
        stats.add(decoded)
        stored[members] = encoded_rows
        release_pages(stored)  # a scratch shard's written rows wait in the page cache, not in this process
        advance(len(members))
    return stored, stats


def _shard_buffer(plan: BuildPlan, number: int, rows: int, dtype: np.dtype) -> np.ndarray:
    """Room for one shard: RAM when small, a scratch memory map in the build directory when large."""
    if rows * plan.dim * dtype.itemsize <= IN_MEMORY_SHARD_BYTES:
        return np.zeros((rows, plan.dim), dtype=dtype)
    scratch = plan.partial_dir / f".shard-{number:05d}.scratch"
    return np.lib.format.open_memmap(scratch, mode="w+", dtype=dtype, shape=(rows, plan.dim))


def _check_finite(rows: np.ndarray, ids: Sequence[str], what: str, *, overflowed: bool = False) -> None:
    """Refuse non-finite rows; ``overflowed``: they were finite before a float16 cast, so it overflowed."""
    finite = np.isfinite(rows).all(axis=1)
    if finite.all():
        return
    bad = [ids[i] for i in np.flatnonzero(~finite)]
    if overflowed:
        raise GradientIndexError(
            f"{what} of example {bad[0]} overflows float16 (largest finite value 65504)"
            + (f", and {len(bad) - 1} more in its batch" if len(bad) > 1 else ""),
            "set grads.storage_dtype=bfloat16 (same size, float32's range) or grads.loss_reduction=mean",
        )
    raise GradientIndexError(f"{what} of example {bad[0]} is not finite (NaN or inf)",
                             "check the adapter and base weights for NaN/inf values (they load, but poison every gradient)")
