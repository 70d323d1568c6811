"""How much a bfloat16 base changes per-example LoRA gradients and blame, and what it costs, on the CPU.

The same trained adapter is loaded twice, on the embedded SmolLM2-135M-Instruct in float32 and in bfloat16
(``LoadedModel.load(..., dtype=...)``; the LoRA weights stay float32 in both). Exact per-example gradients of the
first ``--rows`` training rows are captured with each, batch by batch, alternating which dtype goes first, so
machine load hits both alike. The query is the summed gradient of the next ``--query-rows`` rows, taken in the same
dtype as the rows it scores, so each side is the whole pipeline in that dtype. Reports:

  per-example gradient cosine (mean, min) and relative norm difference between the two dtypes,
  Spearman rank correlation of the blame scores -(q . g_i) and the overlap of their top 10,
  seconds per example for each dtype (ratio measured in one run).

Defaults use a real trained adapter and its training set, the demo's fact scenario, seed 0, as
``gradian demo --scenario fact --seed 0 --workdir /work/bench-cases/fact-0`` writes them:

    --adapter /work/bench-cases/fact-0/train/adapter --dataset /work/bench-cases/fact-0/scenario/train.jsonl

    .venv/bin/python bench/bf16_agreement.py          # bench/results/bf16_agreement.json and .md
    .venv/bin/python bench/bf16_agreement.py --rows 16 --adapter DIR --dataset train.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BASE_MODEL = "smollm2-135m-instruct"
CASE = Path("/work/bench-cases/fact-0")
ADAPTER = CASE / "train" / "adapter"
DATASET = CASE / "scenario" / "train.jsonl"
RESULTS = Path(__file__).resolve().parent / "results" / "bf16_agreement.json"
DTYPES = ("float32", "bfloat16")
TOP = 10


def load_pair(base_model: str, adapter: Path, device: str) -> dict[str, Any]:
    """The adapter on the base in each dtype, on ``device``."""
    from transformers.utils import logging as hf_logging

    from gradian.model.loaded import LoadedModel

    hf_logging.disable_progress_bar()
    return {dtype: LoadedModel.load(base_model, adapter, device=device, dtype=dtype) for dtype in DTYPES}


def batches(examples: list[Any], tokenizer: Any, batch_size: int, max_seq_length: int) -> list[tuple[int, Any]]:
    """(examples in the batch, padded Batch) per batch of ``batch_size``."""
    from gradian.data import encode
    from gradian.grads.batch import collate

    encoded = [encode(example, tokenizer, max_seq_length) for example in examples]
    return [(len(encoded[i:i + batch_size]), collate(encoded[i:i + batch_size], tokenizer.pad_token_id))
            for i in range(0, len(encoded), batch_size)]


def capture_alternating(captures: dict[str, Any], prepared: list[tuple[int, Any]]) -> tuple[dict[str, Any], dict[str, float]]:
    """Per-example gradients of every batch with each dtype (order swapped every batch) and each dtype's seconds."""
    rows: dict[str, list[Any]] = {dtype: [] for dtype in DTYPES}
    seconds = dict.fromkeys(DTYPES, 0.0)
    for number, (_, batch) in enumerate(prepared):
        order = DTYPES if number % 2 == 0 else DTYPES[::-1]
        for dtype in order:
            started = time.perf_counter()
            rows[dtype].append(captures[dtype].capture(batch).double().numpy())
            seconds[dtype] += time.perf_counter() - started
    return {dtype: np.concatenate(parts) for dtype, parts in rows.items()}, seconds


def agreement(rows: dict[str, np.ndarray], queries: dict[str, np.ndarray]) -> dict[str, Any]:
    """Gradient cosine and norm difference per example, and how alike the blame rankings are."""
    full, half = rows["float32"], rows["bfloat16"]
    norm32, norm16 = np.linalg.norm(full, axis=1), np.linalg.norm(half, axis=1)
    live = norm32 > 0  # rows without supervised tokens have a zero gradient in both dtypes
    cosine = np.sum(full[live] * half[live], axis=1) / (norm32[live] * norm16[live])
    norm_difference = np.abs(norm16[live] - norm32[live]) / norm32[live]
    error = np.linalg.norm(half[live] - full[live], axis=1) / norm32[live]
    blame = {dtype: -(rows[dtype] @ queries[dtype]) for dtype in DTYPES}
    same_query = -(half @ queries["float32"])  # the bf16 rows scored by the fp32 query: the rows' part alone
    top = {dtype: set(np.argsort(-blame[dtype], kind="stable")[:TOP].tolist()) for dtype in DTYPES}
    query_cosine = float(queries["float32"] @ queries["bfloat16"]
                         / (np.linalg.norm(queries["float32"]) * np.linalg.norm(queries["bfloat16"])))
    return {
        "rows_compared": int(live.sum()),
        "rows_without_supervised_tokens": int((~live).sum()),
        "gradient_cosine_mean": float(cosine.mean()),
        "gradient_cosine_min": float(cosine.min()),
        "relative_norm_difference_mean": float(norm_difference.mean()),
        "relative_norm_difference_max": float(norm_difference.max()),
        "relative_error_mean": float(error.mean()),
        "relative_error_max": float(error.max()),
        "query_cosine": query_cosine,
        "blame_spearman": spearmanr(blame["float32"], blame["bfloat16"]),
        "blame_spearman_same_query": spearmanr(blame["float32"], same_query),
        f"top{TOP}_overlap": len(top["float32"] & top["bfloat16"]),
    }


def spearmanr(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties): numpy only, so a bare GPU image can run this."""
    from gradian.attribution.aggregation import average_ranks

    return float(np.corrcoef(average_ranks(a), average_ranks(b))[0, 1])


def table(report: dict[str, Any]) -> str:
    """The results as a markdown table."""
    a, speed = report["agreement"], report["seconds_per_example"]
    lines = [f"{report['base_model']} + the adapter {report['adapter']} ({report['lora_parameters']:,} LoRA parameters, "
             f"float32 in both), {a['rows_compared']} training rows scored by the summed gradient of "
             f"{report['query_rows']} others, exact gradients, {report['threads']} threads, batch {report['batch_size']}",
             "", "| measure | float32 base vs bfloat16 base |", "|---|---|",
             f"| per-example gradient cosine, mean | {a['gradient_cosine_mean']:.5f} |",
             f"| per-example gradient cosine, min | {a['gradient_cosine_min']:.5f} |",
             f"| relative norm difference, mean / max | {a['relative_norm_difference_mean']:.2%} / "
             f"{a['relative_norm_difference_max']:.2%} |",
             f"| relative error of the gradient, mean / max | {a['relative_error_mean']:.2%} / "
             f"{a['relative_error_max']:.2%} |",
             f"| query gradient cosine | {a['query_cosine']:.5f} |",
             f"| blame Spearman (each dtype's own query) | {a['blame_spearman']:.4f} |",
             f"| blame Spearman (both rows against the float32 query) | {a['blame_spearman_same_query']:.4f} |",
             f"| top {TOP} overlap | {a[f'top{TOP}_overlap']} of {TOP} |",
             f"| seconds per example, float32 | {speed['float32']:.3f} |",
             f"| seconds per example, bfloat16 | {speed['bfloat16']:.3f} |",
             f"| bfloat16 time / float32 time | {report['bf16_time_over_fp32']:.2f} |",
             "", report["machine"]["note"]]
    if report.get("device", "cpu") == "cpu" and not report["machine"]["cpu_bf16_instructions"]:
        lines.append("This CPU has no native bfloat16 instructions (AVX512-BF16, AMX), so torch emulates bfloat16 "
                     "matmuls: on the CPU a bfloat16 base halves weight memory but costs time.")
    return "\n".join(lines)


def main() -> int:
    """Run the benchmark, print the table, write the JSON and the markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-model", default=BASE_MODEL)
    parser.add_argument("--adapter", type=Path, default=ADAPTER, help=f"a trained LoRA adapter (default {ADAPTER})")
    parser.add_argument("--dataset", type=Path, default=DATASET, help=f"its training set (default {DATASET})")
    parser.add_argument("--rows", type=int, default=64, help="training rows whose gradients are compared")
    parser.add_argument("--query-rows", type=int, default=8, help="rows after those whose summed gradient is the query")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-seq-length", type=int, default=None, help="default: grads.max_seq_length's default")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (both dtypes run there)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    for flag, path in (("--adapter", args.adapter), ("--dataset", args.dataset)):
        if not path.exists():
            print(f"bf16_agreement: {flag} {path} does not exist (run `gradian demo --scenario fact --seed 0 "
                  f"--workdir {CASE}` first, or pass {flag})", file=sys.stderr)
            return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from gradian.config import GradsConfig
    from gradian.data import load_dataset
    from gradian.grads.capture import GradientCapture

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    grads = GradsConfig() if args.max_seq_length is None else GradsConfig(max_seq_length=args.max_seq_length)
    examples = list(load_dataset(args.dataset))
    if len(examples) < args.rows + args.query_rows:
        print(f"bf16_agreement: {args.dataset} has {len(examples)} rows, fewer than --rows + --query-rows", file=sys.stderr)
        return 2
    loaded = load_pair(args.base_model, args.adapter, args.device)
    captures = {dtype: GradientCapture.from_config(model, grads) for dtype, model in loaded.items()}
    tokenizer = loaded["float32"].tokenizer
    query_batches = batches(examples[args.rows:args.rows + args.query_rows], tokenizer, args.batch_size,
                            grads.max_seq_length)
    # The query rows go first, untimed: they also pay each model's one-time allocation costs.
    query_rows, _ = capture_alternating(captures, query_batches)
    queries = {dtype: query_rows[dtype].sum(axis=0) for dtype in DTYPES}
    rows, seconds = capture_alternating(captures, batches(examples[:args.rows], tokenizer, args.batch_size,
                                                          grads.max_seq_length))
    per_example = {dtype: seconds[dtype] / args.rows for dtype in DTYPES}
    lora = [p for p in loaded["bfloat16"].model.parameters() if p.requires_grad]
    report: dict[str, Any] = {
        "base_model": args.base_model, "adapter": str(args.adapter), "dataset": str(args.dataset),
        "device": args.device, "rows": args.rows, "query_rows": args.query_rows, "batch_size": args.batch_size,
        "max_seq_length": grads.max_seq_length, "threads": args.threads, "dim": captures["float32"].dim,
        "lora_parameters": sum(p.numel() for p in lora), "lora_dtypes": sorted({str(p.dtype) for p in lora}),
        "compute": {dtype: model.compute() for dtype, model in loaded.items()},
        "agreement": agreement(rows, queries),
        "seconds": seconds, "seconds_per_example": per_example,
        "bf16_time_over_fp32": per_example["bfloat16"] / per_example["float32"],
        "machine": {
            "python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "cpu_bf16_instructions": _cpu_bf16_flags(), "load_average_at_start": load_start,
            "load_average_at_end": os.getloadavg()[0],
            "note": _timing_note(args.device),
        },
    }
    text = table(report)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    args.out.with_suffix(".md").write_text(text + "\n", encoding="utf-8")
    print(f"\nwrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


def _timing_note(device: str) -> str:
    """What the seconds mean where they were measured."""
    alternation = "the two dtypes alternate batch by batch in one run, so compare their ratio"
    if device != "cpu":
        return f"Measured on {device}; {alternation}."
    return (f"Shared machine: {os.cpu_count()} cores, also running other engineers' jobs and a background benchmark, "
            f"so absolute seconds are inflated and noisy; {alternation}.")


def _cpu_bf16_flags() -> list[str]:
    """The CPU's native bfloat16 instructions (none means torch emulates bf16 matmuls, which is slower)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return []
    return sorted({flag for flag in flags if flag in ("avx512_bf16", "amx_bf16", "amx_tile")})


if __name__ == "__main__":
    sys.exit(main())
