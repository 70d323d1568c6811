"""Shared by the peer scripts (run with a peer's own venv python): the driver's token files, the model, the result.

Imports only torch, transformers, peft and the standard library, which every peer venv has.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

IGNORE = -100


def read_rows(path: Path) -> list[dict[str, list[int]]]:
    """input_ids / labels rows of one of the driver's .jsonl files."""
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_case(data: Path, max_queries: int = 0) -> dict[str, Any]:
    """meta.json, the training rows, and the wanted / generated query rows (the first ``max_queries`` items)."""
    meta = json.loads((data / "meta.json").read_text(encoding="utf-8"))
    wanted = read_rows(data / "query_wanted.jsonl")
    generated = read_rows(data / "query_generated.jsonl")
    has_generated = list(meta["has_generated"])
    if max_queries:
        wanted, generated, has_generated = wanted[:max_queries], generated[:max_queries], has_generated[:max_queries]
    return {"meta": meta, "train": read_rows(data / "train.jsonl"), "wanted": wanted, "generated": generated,
            "has_generated": has_generated}


def pad(rows: list[dict[str, list[int]]], pad_id: int) -> dict[str, Any]:
    """Right-padded input_ids, attention_mask and labels tensors."""
    import torch

    width = max(len(row["input_ids"]) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        ids[i, :n] = torch.tensor(row["input_ids"])
        labels[i, :n] = torch.tensor(row["labels"])
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def load_model(meta: dict[str, Any]) -> Any:
    """The base model (float32, CPU, eval mode) with the case's LoRA adapter, nothing trainable."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(meta["model_dir"], dtype=torch.float32, local_files_only=True)
    model = PeftModel.from_pretrained(base, meta["adapter_dir"], is_trainable=False)
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


class Stages:
    """Wall-clock seconds per named stage."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, name: str, work: Callable[[], Any]) -> Any:
        began = time.perf_counter()
        print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
        value = work()
        self.seconds[name] = round(time.perf_counter() - began, 1)
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {self.seconds[name]} s", flush=True)
        return value


def main_guarded(out: Path, body: Callable[[], dict[str, Any]]) -> int:
    """Run ``body`` (which writes blame_*.npy and returns result.json's content); on an exception write error.txt."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        result = body()
    except BaseException as error:  # the driver reports the first line of whatever failed
        traceback.print_exc()
        first = (str(error).strip().splitlines() or [""])[0]
        (out / "error.txt").write_text(f"{type(error).__name__}: {first}\n", encoding="utf-8")
        return 1
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0
