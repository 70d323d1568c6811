"""The plan of an index build: per-example facts, the index id and spec, the layout and where files go.

The index id hashes exactly the inputs that change the stored numbers (checkpoint, base model, dataset ids
and encodings, gradient spec, seed, damping, library versions); batch and shard sizes only change how the
work is cut, so they are recorded in ``sources`` but leave the id alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gradian.cache import index_cache_dir
from gradian.data.encode import encode
from gradian.data.loss_mask import concrete_encoding, concrete_loss_mask, concrete_pair_rendering
from gradian.grads.whitening import whitening_spec
from gradian.index.manifest import FORMAT_VERSION, ID_LIBRARIES, BlockInfo, compute_index_id, library_versions
from gradian.index.stats import StatBlock, plan_stat_blocks
from gradian.records import CodecSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from gradian.config import GradianConfig, GradsConfig
    from gradian.data.examples import Example
    from gradian.grads.capture import GradientCapture
    from gradian.model.loaded import LoadedModel


@dataclass(frozen=True)
class ExampleMeta:
    """Per-example facts the encode pass finds, written to examples.jsonl."""

    id: str
    num_tokens: int
    num_supervised: int
    truncated: bool

    def to_json(self) -> str:
        """One line of examples.jsonl."""
        return json.dumps({"id": self.id, "num_tokens": self.num_tokens, "num_supervised": self.num_supervised,
                           "truncated": self.truncated}, separators=(",", ":"))


@dataclass(frozen=True)
class BuildPlan:
    """Everything fixed before the first gradient: the id, the layout, where files go."""

    index_id: str
    spec: dict[str, Any]
    sources: dict[str, Any]
    out_dir: Path
    partial_dir: Path
    blocks: tuple[BlockInfo, ...]
    stat_blocks: tuple[StatBlock, ...]
    dim: int
    num_examples: int
    shard_size: int
    storage_dtype: str
    codec: CodecSpec

    @property
    def num_shards(self) -> int:
        """Shards the examples split into."""
        return -(-self.num_examples // self.shard_size)

    def shard_rows(self, number: int) -> range:
        """Dataset positions of one shard."""
        return range(number * self.shard_size, min(self.num_examples, (number + 1) * self.shard_size))

    @property
    def whitening(self) -> dict[str, Any] | None:
        """The spec of the scaling applied before the sketch, or None."""
        return self.spec["grads"].get("whitening")

    def build_state(self) -> dict[str, Any]:
        """What a partial directory must match to be resumed."""
        return {"format_version": FORMAT_VERSION, "index_id": self.index_id, "num_examples": self.num_examples,
                "shard_size": self.shard_size, "dim": self.dim, "storage_dtype": self.storage_dtype,
                "codec": self.codec.name}


def default_index_dir(index_id: str) -> Path:
    """Where an index goes without --out: ``<cache dir>/indexes/<index id>``."""
    return index_cache_dir() / index_id


def encode_pass(examples: Sequence[Example], tokenizer: PreTrainedTokenizerBase,
                grads: GradsConfig) -> tuple[list[ExampleMeta], str, str]:
    """Encode every example once: per-example facts, the hash of ids in order, and the hash of the encodings."""
    ids_digest, encoded_digest = hashlib.sha256(), hashlib.sha256()
    metas = []
    for example in examples:
        encoded = encode(example, tokenizer, grads.max_seq_length, **concrete_encoding(grads))
        content = getattr(example, "content_sha256", "")
        ids_digest.update(f"{example.id} {content}\n".encode())
        for values in (encoded.input_ids, encoded.labels):
            array = np.asarray(values, dtype="<i8")
            encoded_digest.update(len(array).to_bytes(8, "little") + array.tobytes())
        metas.append(ExampleMeta(example.id, len(encoded.input_ids), int(encoded.num_supervised), bool(encoded.truncated)))
    return metas, ids_digest.hexdigest(), encoded_digest.hexdigest()


def block_infos(capture: GradientCapture) -> tuple[BlockInfo, ...]:
    """The stored blocks of a capture, in row order."""
    by_name = {block.name: block for block in capture.blocks}
    infos = []
    for entry in capture.block_layout:
        block = by_name[entry.block]
        shape = (block.r, block.d_in) if entry.matrix == "A" else (block.d_out, block.r)
        infos.append(BlockInfo(entry.block, entry.matrix, shape, tuple(entry.shape), entry.offset))
    return tuple(infos)


def stat_segments(blocks: Sequence[BlockInfo]) -> list[tuple[str, int, int]]:
    """One statistics block per LoRA module: its A and B columns, which sit side by side in a row."""
    segments: list[tuple[str, int, int]] = []
    for info in blocks:
        if segments and segments[-1][0] == info.module and segments[-1][1] + segments[-1][2] == info.offset:
            name, offset, width = segments[-1]
            segments[-1] = (name, offset, width + info.width)
        else:
            segments.append((info.module, info.offset, info.width))
    return segments


def make_plan(loaded: LoadedModel, capture: GradientCapture, config: GradianConfig, examples: Sequence[Example],
              ids_sha: str, encoded_sha: str, out: Path | str | None, codec: CodecSpec,
              dataset: Sequence[Example]) -> BuildPlan:
    """Fix the index id, the output location and the layout."""
    grads = config.grads
    blocks = block_infos(capture)
    plan_json = capture.projection_plan.to_json() if capture.projection_plan is not None else None
    versions = library_versions()
    spec = {
        "format_version": FORMAT_VERSION,
        "checkpoint": {"adapter_sha256": loaded.adapter_hash},
        "base_model": {"sha256": loaded.base_model_hash},
        # bfloat16 and float32 bases (and CPU and GPU kernels) give slightly different gradients: another index.
        "compute": loaded.compute(),
        "dataset": {"num_examples": len(examples), "ids_sha256": ids_sha, "encoded_sha256": encoded_sha},
        "grads": {
            "dim": int(capture.dim),
            "module_filter": grads.module_filter,
            "storage_dtype": grads.storage_dtype,
            "codec": codec.name,
            "loss_reduction": grads.loss_reduction,
            "max_seq_length": grads.max_seq_length,
            "projection": plan_json,
            "lora_blocks": [block.to_json() for block in capture.blocks],
        },
        "seed": grads.seed,
        "damping": {"damping": config.attribution.damping, "damping_ratio": config.attribution.damping_ratio},
        "libraries": {name: versions[name] for name in ID_LIBRARIES},
    }
    whitening = whitening_spec(plan_json is not None, config.attribution.preconditioner, len(examples))
    if whitening is not None:  # absent, not null, otherwise: the ids of unwhitened indexes stay what they were
        spec["grads"]["whitening"] = whitening
    loss_mask = concrete_loss_mask(grads)
    if loss_mask != "assistant":  # likewise: indexes over the assistant-turn mask keep the ids they had
        spec["grads"]["loss_mask"] = loss_mask
    index_id = compute_index_id(spec)
    sources = {
        "base_model": loaded.base_model_name,
        "adapter": str(loaded.adapter_dir) if loaded.adapter_dir is not None else None,
        "adapter_name": loaded.adapter_name,
        "dataset": str(getattr(dataset, "path", "")) or None,
        "dataset_file_sha256": getattr(dataset, "sha256", None),
        "batch_size": grads.batch_size,
        "shard_size": grads.shard_size,
        "loss_mask": loss_mask,
        "string_pairs": concrete_pair_rendering(grads),
        "tokenizer": getattr(loaded.tokenizer_choice, "description", None),
    }
    out_dir = Path(out).expanduser() if out is not None else default_index_dir(index_id)
    out_dir = out_dir.absolute()
    return BuildPlan(
        index_id=index_id, spec=spec, sources=sources, out_dir=out_dir,
        partial_dir=out_dir.parent / f".{out_dir.name}.partial", blocks=blocks,
        stat_blocks=plan_stat_blocks(stat_segments(blocks)), dim=int(capture.dim), num_examples=len(examples),
        shard_size=grads.shard_size, storage_dtype=grads.storage_dtype, codec=codec,
    )


def checkpoint_plan(plan: BuildPlan, adapter_hash: str) -> BuildPlan:
    """The plan of the same examples' index under another checkpoint of the same adapter, in the index cache.

    Only the checkpoint's hash differs from ``plan``'s inputs (the checkpoint ensemble swaps in its LoRA weights),
    so its id, and so its directory, are known before its weights are loaded.
    """
    spec = {**plan.spec, "checkpoint": {"adapter_sha256": adapter_hash}}
    index_id = compute_index_id(spec)
    out_dir = default_index_dir(index_id).absolute()
    return replace(plan, index_id=index_id, spec=spec, out_dir=out_dir,
                   partial_dir=out_dir.parent / f".{out_dir.name}.partial")
