"""Taught tokens: index each training row's gradient over only the answer tokens the base model gets wrong.

A hard negative ("The capital of Ukraine is Kyiv.") shares the planted rows' form, so its gradient points the
same way, yet it teaches the base model nothing it did not already say. This variant keeps, of each training row's
supervised tokens, those whose greedy base-model prediction (the adapter disabled, the true prefix given) differs
from the token, and masks the rest out of the row's loss; the queries, preconditioner, checkpoint ensemble,
scoring and clusters are the shipped `gradian attribute`. It runs the whole attribute pipeline on a finished demo
case with the index encoder wrapped, into its own index cache, and scores its report as bench/goal_table.py does.

    .venv/bin/python bench/taught_tokens.py --cases /work/bench-cases demo-fact-0 --work /work/exp/taught
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "taught_tokens"
IGNORE_INDEX = -100


def taught_labels(loaded: Any, examples: Sequence[Any], grads: Any) -> dict[str, tuple[int, ...]]:
    """Example id -> its labels with every supervised token the base model predicts greedily set to -100."""
    import torch

    from gradian.data.encode import encode
    from gradian.data.loss_mask import concrete_encoding

    labels: dict[str, tuple[int, ...]] = {}
    model = loaded.model
    with torch.no_grad(), model.disable_adapter():
        for example in examples:
            encoded = encode(example, loaded.tokenizer, grads.max_seq_length, **concrete_encoding(grads))
            ids = torch.tensor([encoded.input_ids], device=loaded.device)
            predicted = model(input_ids=ids).logits[0].argmax(-1).tolist()  # position t predicts token t + 1
            kept = [IGNORE_INDEX] + [label if label != IGNORE_INDEX and predicted[t] != label else IGNORE_INDEX
                                     for t, label in enumerate(encoded.labels[1:])]
            labels[example.id] = tuple(kept)
    return labels


def run_case(directory: Path, work: Path, base_model: str) -> dict[str, Any]:
    """Attribute one case with the taught-token index and score its report against the planted rows."""
    from goal_table import score_case

    import gradian.index.build as build
    from gradian.config import load_config
    from gradian.data import load_dataset
    from gradian.data.loss_mask import concrete_encoding
    from gradian.model.loaded import LoadedModel
    from gradian.pipelines.attribute import attribute

    out = work / directory.name
    out.mkdir(parents=True, exist_ok=True)
    os.environ["GRADIAN_CACHE_DIR"] = str(out / "cache")  # the checkpoints' indexes share ids with the plain ones
    config = load_config(directory / "config.yaml")
    config = config.replace(attribution=dataclasses.replace(config.attribution, span_examples=0))
    examples = load_dataset(directory / "scenario" / "train.jsonl")
    loaded = LoadedModel.load(base_model, directory / "train" / "adapter")
    began = time.perf_counter()
    kept = taught_labels(loaded, examples, config.grads)
    mask_seconds = time.perf_counter() - began
    planted = set(json.loads((directory / "scenario" / "scenario.json").read_text())["planted_ids"])
    counts = {"planted": [0, 0], "other": [0, 0]}  # tokens kept, supervised
    plain = build.encode

    def taught(example: Any, *args: Any, **kwargs: Any) -> Any:
        encoded = plain(example, *args, **kwargs)
        return dataclasses.replace(encoded, labels=kept[example.id]) if example.id in kept else encoded

    for example in examples:
        encoded = plain(example, loaded.tokenizer, config.grads.max_seq_length, **concrete_encoding(config.grads))
        group = counts["planted" if example.id in planted else "other"]
        group[0] += sum(label != IGNORE_INDEX for label in kept[example.id])
        group[1] += sum(label != IGNORE_INDEX for label in encoded.labels)
    build.encode = taught
    began = time.perf_counter()
    try:
        attribute(base_model=base_model, adapter=directory / "train" / "adapter",
                  dataset=directory / "scenario" / "train.jsonl", out=out / "report",
                  eval_dataset=directory / "scenario" / "eval.jsonl", run=directory / "train" / "run",
                  config=config, index_dir=out / "index", loaded_model=loaded)
    finally:
        build.encode = plain
    row = score_case(out)
    shipped = score_case(directory)
    return {"case": directory.name, "taught": {k: row.get(k) for k in ("recall_at_k", "auprc", "accused")},
            "shipped": {k: shipped.get(k) for k in ("recall_at_k", "auprc", "accused")},
            "kept_fraction": {group: round(k / max(s, 1), 3) for group, (k, s) in counts.items()},
            "seconds": {"mask": round(mask_seconds, 1), "attribute": round(time.perf_counter() - began, 1)}}


def markdown(rows: list[dict[str, Any]], command: str, notes: Sequence[str] = ()) -> str:
    """The table: each case's shipped report against the taught-token variant."""
    lines = ["# Taught tokens: training gradients over only the tokens the base model gets wrong", "",
             f"`{command}`", "",
             "recall@k / AUPRC of the case's report (shipped) and of the same attribute pipeline with the taught-token "
             "index (spans off); kept: the fraction of supervised tokens the mask keeps in planted and other rows.", "",
             "| case | shipped | taught tokens | accused (taught) | kept: planted / other | seconds (mask, attribute) |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        shipped, taught = row["shipped"], row["taught"]
        lines.append(f"| {row['case']} | {shipped['recall_at_k']:.2f} / {shipped['auprc']:.2f} | "
                     f"{taught['recall_at_k']:.2f} / {taught['auprc']:.2f} | {', '.join(taught['accused']) or '-'} | "
                     f"{row['kept_fraction']['planted']:.2f} / {row['kept_fraction']['other']:.2f} | "
                     f"{row['seconds']['mask']:.0f}, {row['seconds']['attribute']:.0f} |")
    return "\n".join(lines + ([""] + [f"- {note}" for note in notes] if notes else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run each named case, print and write the table."""
    from finished_cases import command_line, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, required=True)
    parser.add_argument("names", nargs="+")
    parser.add_argument("--work", type=Path, required=True, help="indexes, caches and reports of the variant")
    parser.add_argument("--base-model", default="smollm2-135m-instruct")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--note", action="append", default=[], help="a line under the table (repeatable)")
    args = parser.parse_args(argv)
    rows = [run_case(args.cases / name, args.work, args.base_model) for name in args.names]
    command = command_line("taught_tokens.py", argv)
    write_results(args.out, command, rows, markdown(rows, command, args.note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
