"""Throughput and memory of per-example gradient capture, and index size on disk (a benchmark, not a test).

On the embedded SmolLM2-135M-Instruct with LoRA r=8 on all seven projections, 2 threads, chat examples of
about 128 tokens with about a third supervised, alternating in one run:

  (a) gradian  Gradian's capture: one forward + one backward per batch, hooks on lora_A / lora_B
  (b) naive    a per-example loop: batch 1, full-vocab fp32 logits, flattened .grad (how LESS collects)
  (c) plain    a plain batched forward + backward (HF loss over full logits), no per-example gradients

Peak RSS is measured for each method in its own process. Index size on disk is measured by building real
indexes (exact, float16, down_proj only, projection_dim 2048). Prints a table and writes JSON:

    .venv/bin/python bench/throughput.py                # bench/results/throughput.json
    .venv/bin/python bench/throughput.py --rounds 5 --batches 2 --index-examples 32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m-instruct"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
METHODS = ("gradian", "naive", "plain")
RESULTS = Path(__file__).resolve().parent / "results" / "throughput.json"
WORDS = ("the river city market music garden winter lesson science bridge history planet ocean doctor letter "
         "mountain village engine forest language window summer number teacher animal kitchen station").split()


def set_threads(threads: int) -> None:
    """Pin torch (and BLAS) to a thread count before any work."""
    import torch

    torch.set_num_threads(threads)


def load_model(seed: int = 0) -> Any:
    """SmolLM2-135M-Instruct with a LoRA r=8 adapter on all seven projections (random B, so every gradient is live)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers.utils import logging as hf_logging

    from gradian.model.base import load_base_model
    from gradian.model.loaded import LoadedModel

    hf_logging.disable_progress_bar()
    base, tokenizer = load_base_model(MODEL)
    peft_model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=list(TARGETS), lora_dropout=0.0,
                                                 task_type="CAUSAL_LM"))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.01)
    return LoadedModel(peft_model, tokenizer, base_model_name=MODEL)


def make_examples(tokenizer: Any, count: int, seed: int = 0, total: int = 128, supervised: int = 43) -> list[Any]:
    """Chat examples of about ``total`` tokens with about ``supervised`` of them in the answer (lengths vary ~15%)."""
    from gradian.data import Message, encode, make_example

    rng = random.Random(seed)
    examples = []
    for position in range(count):
        want_total = int(total * rng.uniform(0.85, 1.15))
        want_answer = int(supervised * rng.uniform(0.85, 1.15))
        prompt_words, answer_words = 40, 25
        for _ in range(6):  # adjust word counts until the encoded lengths land near the targets
            prompt = "Please explain: " + " ".join(rng.choice(WORDS) for _ in range(prompt_words)) + "?"
            answer = " ".join(rng.choice(WORDS) for _ in range(answer_words)) + "."
            example = make_example(position, messages=[Message("user", prompt), Message("assistant", answer)])
            encoded = encode(example, tokenizer, 4 * total)
            answer_words = max(1, answer_words + (want_answer - encoded.num_supervised) // 1)
            prompt_words = max(1, prompt_words + (want_total - len(encoded.input_ids)) - (want_answer - encoded.num_supervised))
        examples.append(example)
    return examples


def encode_batches(examples: list[Any], tokenizer: Any, batch_size: int) -> list[tuple[list[Any], Any]]:
    """(encoded examples, padded Batch) per batch."""
    from gradian.data import encode
    from gradian.grads.batch import collate

    encoded = [encode(e, tokenizer, 1024) for e in examples]
    return [(encoded[i:i + batch_size], collate(encoded[i:i + batch_size], tokenizer.pad_token_id))
            for i in range(0, len(encoded), batch_size)]


def lora_parameters(loaded: Any) -> list[Any]:
    """The LoRA A/B weights, in module order (A then B per layer)."""
    return [p for _, p in loaded.model.named_parameters() if p.requires_grad]


def run_gradian(loaded: Any, capture: Any, encoded: list[Any], batch: Any) -> Any:
    """(a) one forward + one backward for the batch; every example's gradient from the hooks."""
    return capture.capture(batch)


def run_naive(loaded: Any, capture: Any, encoded: list[Any], batch: Any) -> Any:
    """(b) batch 1, the model's own loss over full-vocab fp32 logits, .grad flattened per example."""
    import torch

    params = lora_parameters(loaded)
    rows = []
    for item in encoded:
        loaded.model.zero_grad(set_to_none=True)
        ids = torch.tensor([item.input_ids])
        labels = torch.tensor([item.labels])
        with torch.enable_grad():
            loaded.model(input_ids=ids, labels=labels).loss.backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in params]))
    loaded.model.zero_grad(set_to_none=True)
    return torch.stack(rows)


def run_plain(loaded: Any, capture: Any, encoded: list[Any], batch: Any) -> Any:
    """(c) a plain batched forward + backward with the model's own loss; no per-example gradients."""
    import torch

    with torch.enable_grad():
        loss = loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).loss
        loss.backward()
    loaded.model.zero_grad(set_to_none=True)
    return loss.detach()


RUNNERS = {"gradian": run_gradian, "naive": run_naive, "plain": run_plain}


def throughput(loaded: Any, batches: list[tuple[list[Any], Any]], rounds: int) -> dict[str, dict[str, float]]:
    """Seconds per method, alternating methods within each round (order rotated) so drift hits all alike."""
    from gradian.grads.capture import GradientCapture

    capture = GradientCapture(loaded, loss_reduction="sum")
    for method in METHODS:  # warm-up: first calls pay one-time allocation costs
        RUNNERS[method](loaded, capture, *batches[0])
    seconds = {m: 0.0 for m in METHODS}
    order = list(METHODS)
    for _ in range(rounds):
        for method in order:
            started = time.perf_counter()
            for encoded, batch in batches:
                RUNNERS[method](loaded, capture, encoded, batch)
            seconds[method] += time.perf_counter() - started
        order = order[1:] + order[:1]
    examples = rounds * sum(len(e) for e, _ in batches)
    tokens = rounds * sum(sum(len(x.input_ids) for x in e) for e, _ in batches)
    return {m: {"seconds": seconds[m], "examples_per_s": examples / seconds[m], "tokens_per_s": tokens / seconds[m]}
            for m in METHODS}


def agreement(loaded: Any, batches: list[tuple[list[Any], Any]]) -> float:
    """Max relative error between (a) with mean reduction and (b) (the model's loss is a per-example mean)."""
    from gradian.grads.capture import GradientCapture

    encoded, batch = batches[0]
    ours = GradientCapture(loaded, loss_reduction="mean").capture(batch)
    theirs = run_naive(loaded, None, encoded, batch)
    return float(((ours - theirs).norm(dim=1) / theirs.norm(dim=1)).max())


# --- peak memory, one process per method -------------------------------------------------------


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child_memory(method: str, batch_size: int, batches: int, threads: int) -> dict[str, float]:
    """In a fresh process: load, reset the peak RSS, run the method, report the peak and the rise over the baseline."""
    set_threads(threads)
    loaded = load_model()
    prepared = encode_batches(make_examples(loaded.tokenizer, batch_size * batches), loaded.tokenizer, batch_size)
    from gradian.grads.capture import GradientCapture

    capture = GradientCapture(loaded, loss_reduction="sum")
    import gc

    gc.collect()
    baseline = _status_kb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # reset VmHWM, so the load's own peak does not count
        reset = True
    except OSError:
        reset = False
    for encoded, batch in prepared:
        RUNNERS[method](loaded, capture, encoded, batch)
    peak = _status_kb("VmHWM")
    return {"baseline_rss_mb": baseline / 1024, "peak_rss_mb": peak / 1024,
            "peak_over_baseline_mb": (peak - baseline) / 1024, "peak_reset": reset}


def memory(batch_size: int, batches: int, threads: int) -> dict[str, dict[str, float]]:
    """Peak RSS of each method, each in its own process."""
    results = {}
    for method in METHODS:
        output = subprocess.run([sys.executable, __file__, "--child", method, "--batch-size", str(batch_size),
                                 "--batches", str(batches), "--threads", str(threads)],
                                check=True, capture_output=True, text=True)
        results[method] = json.loads(output.stdout.strip().splitlines()[-1])
    return results


# --- index size on disk ------------------------------------------------------------------------


INDEX_CONFIGS = {
    "exact float32": [],
    "exact float16": ["grads.storage_dtype=float16"],
    "down_proj only": ["grads.module_filter=down_proj"],
    "projection_dim 2048": ["grads.projection_dim=2048"],
}


def index_sizes(loaded: Any, count: int, batch_size: int) -> dict[str, dict[str, float]]:
    """Build a real index per configuration and measure it on disk."""
    from gradian.config import load_config
    from gradian.index.build import build_index

    examples = make_examples(loaded.tokenizer, count, seed=1)
    results = {}
    with tempfile.TemporaryDirectory(prefix="gradian-bench-") as scratch:
        for name, overrides in INDEX_CONFIGS.items():
            config = load_config(None, [f"grads.batch_size={batch_size}", *overrides])
            started = time.perf_counter()
            index = build_index(loaded, examples, config, Path(scratch) / name.replace(" ", "-"))
            seconds = time.perf_counter() - started
            shard_bytes = sum((index.path / s.file).stat().st_size for s in index.manifest.shards)
            results[name] = {
                "dim": index.dim,
                "examples": count,
                "gradient_bytes_per_example": shard_bytes / count,
                "index_bytes": index.disk_bytes(),
                "gb_per_10k_examples": shard_bytes / count * 10_000 / 1e9,
                "build_examples_per_s": count / seconds,
            }
    return results


# --- report ------------------------------------------------------------------------------------


def table(report: dict[str, Any]) -> str:
    """The results as markdown tables."""
    speed, mem = report["throughput"], report.get("memory", {})
    lines = [f"SmolLM2-135M-Instruct, LoRA r=8 x 7 projections, {report['threads']} threads, batch {report['batch_size']}, "
             f"~{report['mean_tokens']:.0f} tokens/example ({report['mean_supervised']:.0f} supervised)", "",
             "| method | examples/s | tokens/s | peak RSS MB | peak over loaded model MB |", "|---|---|---|---|---|"]
    for method in METHODS:
        m = mem.get(method, {})
        lines.append(f"| {method} | {speed[method]['examples_per_s']:.2f} | {speed[method]['tokens_per_s']:.0f} | "
                     f"{m.get('peak_rss_mb', float('nan')):.0f} | {m.get('peak_over_baseline_mb', float('nan')):.0f} |")
    ratios = report["ratios"]
    lines += ["", f"gradian vs naive: {ratios['gradian_speedup_over_naive']:.2f}x faster (goal >= 2x); "
                  f"gradian time / plain time: {ratios['gradian_time_over_plain']:.2f} (goal <= 1.3); "
                  f"max relative error gradian vs naive gradients: {report['max_relative_error_vs_naive']:.2e}"]
    if report.get("index_sizes"):
        lines += ["", "| index | width | MB per example | GB per 10k examples | index build examples/s |", "|---|---|---|---|---|"]
        for name, s in report["index_sizes"].items():
            lines.append(f"| {name} | {s['dim']} | {s['gradient_bytes_per_example'] / 1e6:.3f} | "
                         f"{s['gb_per_10k_examples']:.2f} | {s['build_examples_per_s']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    """Run the benchmark (or, with --child, one memory measurement)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the three methods")
    parser.add_argument("--batches", type=int, default=2, help="batches per method per round")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--index-examples", type=int, default=16, help="examples per index-size build (0 skips)")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child_memory(args.child, args.batch_size, args.batches, args.threads)))
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_threads(args.threads)
    loaded = load_model()
    examples = make_examples(loaded.tokenizer, args.batch_size * args.batches)
    batches = encode_batches(examples, loaded.tokenizer, args.batch_size)
    encoded = [e for chunk, _ in batches for e in chunk]
    import torch

    speed = throughput(loaded, batches, args.rounds)
    report: dict[str, Any] = {
        "model": MODEL, "lora": {"r": 8, "alpha": 16, "targets": list(TARGETS)}, "threads": args.threads,
        "batch_size": args.batch_size, "rounds": args.rounds, "batches_per_round": args.batches,
        "mean_tokens": sum(len(e.input_ids) for e in encoded) / len(encoded),
        "mean_supervised": sum(e.num_supervised for e in encoded) / len(encoded),
        "throughput": speed,
        "ratios": {
            "gradian_speedup_over_naive": speed["gradian"]["examples_per_s"] / speed["naive"]["examples_per_s"],
            "gradian_time_over_plain": speed["plain"]["examples_per_s"] / speed["gradian"]["examples_per_s"],
        },
        "max_relative_error_vs_naive": agreement(loaded, batches),
        "lora_parameters": sum(p.numel() for p in lora_parameters(loaded)),
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                    "load_average_at_start": os.getloadavg()[0]},
    }
    if not args.skip_memory:
        report["memory"] = memory(args.batch_size, args.batches, args.threads)
    if args.index_examples:
        report["index_sizes"] = index_sizes(loaded, args.index_examples, args.batch_size)
    report["machine"]["load_average_at_end"] = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
