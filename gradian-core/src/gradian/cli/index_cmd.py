"""`gradian index`: build (or reuse) the gradient index of a training set under a LoRA adapter."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from gradian.cli.options import (
    AdapterOption,
    AllowPickleFlag,
    BaseModelOption,
    ConfigOption,
    DatasetOption,
    DeviceOption,
    DtypeOption,
    FormatOption,
    SetOption,
    TokenizerOption,
    TrustRemoteCodeFlag,
    check_tokenizer_dir,
)

OutOption = Annotated[Optional[Path], typer.Option("--out", help="Index directory (default: <cache dir>/indexes/<index id>).")]


def index(
    base_model: BaseModelOption = None,
    adapter: AdapterOption = None,
    dataset: DatasetOption = None,
    out: OutOption = None,
    config: ConfigOption = None,
    set_: SetOption = None,
    allow_pickle: AllowPickleFlag = False,
    trust_remote_code: TrustRemoteCodeFlag = False,
    tokenizer: TokenizerOption = None,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an index of another dataset or adapter at --out.")] = False,
    output_format: FormatOption = "table",
) -> None:
    """Capture per-example LoRA gradients of the training set into an index directory (reused when identical)."""
    from gradian.cli.options import load_cli_config
    from gradian.cli.output import note, print_result
    from gradian.cli.output import output_format as check_format
    from gradian.index.distributed import is_main_process

    fmt = check_format(output_format)
    cfg = load_cli_config(config, set_)
    index_built = build_from_cli(base_model, adapter, dataset, out, cfg, allow_pickle=allow_pickle,
                                 trust_remote_code=trust_remote_code, device=device, dtype=dtype, overwrite=overwrite,
                                 tokenizer=tokenizer)
    if is_main_process():
        notes = index_notes(index_built)
        print_result(fmt, summary_data(index_built, notes), f"{summary_line(index_built)}\n  {index_built.path}")
        for line in notes:
            note(f"note: {line}")


def build_from_cli(base_model: str | None, adapter: Path | None, dataset: Path | None, out: Path | None, cfg: Any, *,
                   allow_pickle: bool = False, trust_remote_code: bool = False, device: str = "auto",
                   dtype: str = "auto", overwrite: bool = False, tokenizer: Path | None = None) -> Any:
    """Check the inputs, load dataset and model, and build the index with a progress bar (rank 0 only)."""
    from gradian.attribution.checkpoint_ensemble import plan_ensemble
    from gradian.cli.output import libraries_quiet, note
    from gradian.cli.progress import one_bar
    from gradian.errors import ConfigError
    from gradian.index.build import build_index
    from gradian.index.distributed import is_main_process
    from gradian.model.base import base_model_for
    from gradian.model.loaded import LoadedModel, check_unsloth_absent, require_adapter
    from gradian.model.placement import resolve_placement
    from gradian.runs.training_format import run_dir_of_adapter

    check_unsloth_absent()
    placement = resolve_placement(device, dtype)  # before anything is read: a bad --device writes nothing
    require_adapter(adapter, "index")
    if dataset is None:
        raise ConfigError("gradian index needs --dataset", "pass the exact training data, in the same order")
    base_model = base_model_for(base_model, adapter, "index")
    from gradian.data import load_dataset
    from gradian.errors import GradientIndexError
    from gradian.index.directory import check_out_dir, refuse_other_inputs
    from gradian.output_location import check_output_dir

    if out is not None:  # before the model loads: a bad --out must not cost the whole build
        check_output_dir(out, "--out", error=GradientIndexError, beside=True)
        check_out_dir(Path(out).expanduser().absolute())
    check_tokenizer_dir(tokenizer)
    examples = load_dataset(dataset)
    if out is not None and not overwrite:
        refuse_other_inputs(Path(out).expanduser().absolute(), getattr(examples, "sha256", None), adapter)
    with libraries_quiet():  # one progress bar on stderr: ours
        loaded = LoadedModel.load(base_model, adapter, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
                                  device=placement.device, dtype=placement.dtype, tokenizer=tokenizer)
    # attribute scores an adapter beside its run's checkpoints with no kronecker fit kept beside the index
    ensemble = plan_ensemble(cfg.attribution.checkpoints, run_dir_of_adapter(loaded.adapter_dir), loaded.adapter_dir,
                             loaded.adapter_hash, allow_pickle=allow_pickle)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    label = "indexing" if world <= 1 else f"indexing (rank 0 of {world})"
    with one_bar(label, enabled=is_main_process()) as progress:
        return build_index(loaded, examples, cfg, out, progress=progress, say=note if is_main_process() else None,
                           scored_alone=len(ensemble.members) <= 1)


def summary_line(index: Any) -> str:
    """One line: the index id, whether it was built or reused, and what it holds."""
    manifest = index.manifest
    projection = manifest.projection
    kind = "exact" if projection is None else f"projected to {projection['dim']}"
    size = index.disk_bytes() / 1e6
    shards = len(manifest.shards)
    state = "reused" if index.reused else "built"
    timing = "" if index.reused else f" in {manifest.build.get('seconds', 0):.1f} s"
    return (f"index {manifest.index_id} {state}{timing}: {manifest.num_examples} examples x {manifest.dim} "
            f"({kind}, {manifest.storage_dtype}), {len(manifest.blocks) // 2} LoRA blocks, "
            f"{shards} shard{'' if shards == 1 else 's'}, {size:.1f} MB")


def summary_data(index: Any, notes: list[str]) -> dict[str, Any]:
    """What summary_line says, as the JSON document of ``gradian index --format json``."""
    manifest = index.manifest
    projection = manifest.projection
    return {"index_id": manifest.index_id, "path": str(index.path), "state": "reused" if index.reused else "built",
            "seconds": None if index.reused else manifest.build.get("seconds"),
            "examples": manifest.num_examples, "dim": manifest.dim,
            "projection": None if projection is None else projection["dim"], "storage_dtype": manifest.storage_dtype,
            "lora_blocks": len(manifest.blocks) // 2, "shards": len(manifest.shards), "bytes": index.disk_bytes(),
            "totals": dict(manifest.totals), "notes": notes}


def index_notes(index: Any) -> list[str]:
    """What a user should know about the indexed examples: empty or truncated ones are kept, not dropped."""
    totals = index.manifest.totals
    notes = []
    if totals.get("unsupervised_examples"):
        notes.append(f"{totals['unsupervised_examples']} example(s) have no supervised tokens; their rows are zero "
                     "(they cannot be blamed)")
    if totals.get("truncated_examples"):
        notes.append(f"{totals['truncated_examples']} example(s) were truncated to grads.max_seq_length="
                     f"{index.manifest.spec['grads']['max_seq_length']} tokens")
    return notes


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("index")(index)
