"""Options shared by several commands, so each flag is spelled and documented once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

ConfigOption = Annotated[Optional[Path], typer.Option("--config", help="YAML config file (sections grads, evaluation, attribution, train, diagnose).")]
SetOption = Annotated[Optional[list[str]], typer.Option("--set", help="Override one config key, e.g. --set grads.batch_size=4 (repeatable).")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table (an alias of --format json).")]
FormatOption = Annotated[str, typer.Option("--format", help="How results are printed: table, json or md.")]
BaseModelOption = Annotated[Optional[str], typer.Option("--base-model", help="Base model: a local path, an id in the local HF cache, or smollm2-135m-instruct (embedded). With --adapter, the default is the base its adapter_config.json names, when that is on this machine.")]
AdapterOption = Annotated[Optional[Path], typer.Option("--adapter", help="PEFT LoRA adapter directory.")]
DatasetOption = Annotated[Optional[Path], typer.Option("--dataset", help="The exact training data, in the same order (JSONL, JSON, parquet or a saved HF dataset).")]
EvalDatasetOption = Annotated[Optional[Path], typer.Option("--eval-dataset", help="Eval items describing the capability, with the answers you wanted.")]
RunOption = Annotated[Optional[Path], typer.Option("--run", help="Run directory with the trainer config and logs.")]
AllowPickleFlag = Annotated[bool, typer.Option("--allow-pickle", help="Accept a pickled adapter_model.bin (off by default). It is read with torch.load(weights_only=True): no code from the file runs, but its pickle is still parsed, and a crafted file can hold wrong or huge tensors; prefer re-saving it as safetensors.")]
BackendOption = Annotated[str, typer.Option("--backend", help="Training backend, by the name its plugin registers (gradian plugins lists them); hf is the default.")]
TokenizerOption = Annotated[Optional[Path], typer.Option("--tokenizer", help="A tokenizer directory (with its chat template) to render the data with; default: the one saved next to the adapter, else in the run's checkpoints, else the base model's.")]
TrustRemoteCodeFlag = Annotated[bool, typer.Option("--trust-remote-code", help="Allow the model's own Python code to run (off by default).")]
DeviceOption = Annotated[str, typer.Option("--device", help="Where the model runs: auto (this rank's GPU, cuda:$LOCAL_RANK, when CUDA is visible, else mps when it is available, else cpu), cpu, cuda, cuda:N or mps.")]
DtypeOption = Annotated[str, typer.Option("--dtype", help="dtype of the base model's weights: auto (bfloat16 on CUDA, float16 on a GPU without bfloat16 and on mps, float32 on cpu), float32, bfloat16 or float16 (not on cpu). LoRA weights and gradients stay float32.")]


def check_tokenizer_dir(tokenizer: Path | None) -> None:
    """--tokenizer must be a local directory; checked before any model loads."""
    from gradian.errors import ConfigError

    if tokenizer is not None and not Path(tokenizer).expanduser().is_dir():
        from gradian.user_files import absent

        path = Path(tokenizer).expanduser()
        reason = "is not a directory" if path.exists() else absent(path)
        raise ConfigError(f"--tokenizer {tokenizer} {reason}",
                          "pass the directory your trainer saved the tokenizer to (it holds tokenizer_config.json)")


def load_cli_config(config: Path | None, overrides: list[str] | None):
    """The GradianConfig a command runs with."""
    from gradian.config import load_config

    return load_config(config, tuple(overrides or ()))
