"""`gradian train`: a LoRA fine-tune through a trainer plugin, for counterfactual retraining and injection tests."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from gradian.cli.options import (
    BaseModelOption,
    ConfigOption,
    DatasetOption,
    DeviceOption,
    DtypeOption,
    FormatOption,
    SetOption,
    TrustRemoteCodeFlag,
)


def train(
    base_model: BaseModelOption = None,
    dataset: DatasetOption = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Output dir: the adapter goes to OUT/adapter, the run dir to OUT/run.")] = None,
    backend: Annotated[str, typer.Option("--backend", help="Training backend, by the name its plugin registers (gradian plugins lists them); hf, transformers.Trainer, is the default.")] = "hf",
    config: ConfigOption = None,
    set_: SetOption = None,
    trust_remote_code: TrustRemoteCodeFlag = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace OUT/adapter and OUT/run from an earlier run.")] = False,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
    output_format: FormatOption = "table",
) -> None:
    """Fine-tune a LoRA adapter on a dataset (Gradian trains only to check itself: verify and inject)."""
    from gradian.cli.options import load_cli_config
    from gradian.cli.output import libraries_quiet, note, print_result
    from gradian.cli.output import output_format as check_format
    from gradian.model.placement import resolve_placement
    from gradian.pipelines.train import make_job, resolve_backend, run_training

    fmt = check_format(output_format)
    placement = resolve_placement(device, dtype)  # before anything is read: a bad --device writes nothing
    cfg = load_cli_config(config, set_)
    resolve_backend(backend)  # unknown, missing or unavailable backends fail before any loading
    if out is not None:
        from gradian.output_location import check_output_dir

        check_output_dir(out, "--out")
    job = make_job(base_model, dataset, out, cfg, trust_remote_code=trust_remote_code, device=placement.device,
                   dtype=placement.dtype)
    with libraries_quiet():  # only our lines (and the trainer's progress) before a result or an error
        result = run_training(job, backend, overwrite=overwrite)
    for line in result.notes:
        note(f"note: {line}")
    loss = "n/a" if result.final_loss is None else f"{result.final_loss:.4f}"
    data = {"backend": result.backend, "seconds": round(result.seconds, 3), "steps": result.steps,
            "final_loss": result.final_loss, "adapter": str(result.adapter_dir), "run": str(result.run_dir),
            "notes": list(result.notes)}
    text = (f"trained with {result.backend} in {result.seconds:.1f} s: {result.steps} steps, final loss {loss}\n"
            f"adapter: {result.adapter_dir}\nrun:     {result.run_dir}")
    print_result(fmt, data, text)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("train")(train)
