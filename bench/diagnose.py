"""Wall time of the whole `gradian diagnose` on 10,000 chat examples and a 2,000-step run (a benchmark, not a test).

Builds (once, untimed) a deterministic workload: 10,000 chat rows (system prompts, multi-turn, answers of 20-120
words), a 100-item eval set, a Hugging Face Trainer run dir with 2,000 logged steps (trainer_state.json, a real
torch.save'd training_args.bin, an adapter_config.json + adapter_model.safetensors for SmolLM2 shapes).
Then times `gradian diagnose` as a subprocess (startup, imports and tokenizer load included) with the SmolLM2
tokenizer, prints a table and writes JSON:

    .venv/bin/python bench/diagnose.py                  # bench/results/diagnose.json
    .venv/bin/python bench/diagnose.py --repeats 1 --tokenizer /path/to/model_dir

Goal: under 10 s on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "diagnose.json"
EMBEDDED = "smollm2-135m-instruct"
WORDS = """the of and to in is was for on that with as by at from his her an were are which this be or had not but
one all their there been has when who will more no if out so said what up its about into than them can only other
new some could time these two may then do first any my now such like our over man me even most made after also did
many before must through back years where much your way well down should because each just those people how too
little state good very make world still own see men work long get here between both life being under never day same
another know while last might us great old year off come since against go came right used take three states himself
few house use during without again place around however home small found thought went say part once general high upon
school every does got united left number course war until always away something fact though water less public put
think almost hand enough far took head yet government system better set told nothing night end why called didn eyes
find going look asked later knew point next program city business give group toward young days let room president side
social given present several order national possible rather second face per among form important often things looked
early white case become large big need four within felt along children saw best church ever least power development
light seemed family interest want members mind country area others done turned although open god service certain kind
problem began different door thus help sense means whole matter perhaps itself york times law human line above name
example action company hands local show whether five history gave today either act feet across taken past quite
anything seen having death experience body word half really week car field""".split()
SYSTEMS = ["You are a helpful assistant.", "Answer briefly and precisely.", "You are a careful teacher who explains things.",
           "Reply in plain English without lists."]


def sentence(rng: random.Random, low: int, high: int) -> str:
    """A random sentence of low..high words from the vocabulary."""
    words = rng.choices(WORDS, k=rng.randint(low, high))
    return " ".join(words).capitalize() + rng.choice([".", ".", ".", "!", "?"])


def make_rows(count: int, seed: int) -> list[dict[str, Any]]:
    """Chat rows: a third with a system prompt, a fifth multi-turn, answers of 20-120 words."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        messages = []
        if rng.random() < 0.33:
            messages.append({"role": "system", "content": rng.choice(SYSTEMS)})
        for _ in range(2 if rng.random() < 0.2 else 1):
            messages.append({"role": "user", "content": sentence(rng, 8, 40)})
            messages.append({"role": "assistant", "content": " ".join(sentence(rng, 6, 20) for _ in range(rng.randint(2, 6)))})
        rows.append({"messages": messages, "source": f"source-{index % 12}"})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """JSON Lines, one row per line."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_run_dir(run: Path, steps: int, seed: int) -> Path:
    """A Trainer run dir with ``steps`` logged steps, a real training_args.bin and a SmolLM2-shaped adapter."""
    import numpy as np
    import torch
    from safetensors.numpy import save_file
    from transformers import TrainingArguments

    rng = random.Random(seed)
    run.mkdir(parents=True, exist_ok=True)
    history = []
    for step in range(1, steps + 1):
        lr = 2e-4 * min(1.0, step / 60) * (1 - step / (steps + 1))
        history.append({"epoch": round(2 * step / steps, 4), "grad_norm": 0.6 + 0.2 * rng.random(), "learning_rate": lr,
                        "loss": 2.2 * math.exp(-step / 1500) + 0.15 * rng.random(), "step": step})
        if step % 50 == 0:
            history.append({"epoch": round(2 * step / steps, 4), "eval_loss": 2.0 * math.exp(-step / 2500), "eval_runtime": 3.1,
                            "step": step})
    history.append({"epoch": 2.0, "step": steps, "total_flos": 1.0e15, "train_loss": 1.1, "train_runtime": 3600.0})
    state = {"best_global_step": None, "epoch": 2.0, "eval_steps": 50, "global_step": steps, "log_history": history,
             "logging_steps": 1, "max_steps": steps, "num_train_epochs": 2, "train_batch_size": 4}
    (run / "trainer_state.json").write_text(json.dumps(state, indent=2), encoding="utf-8")
    args = TrainingArguments(output_dir=str(run), learning_rate=2e-4, num_train_epochs=2, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, warmup_steps=60, eval_strategy="steps", eval_steps=50,
                             logging_steps=1, report_to=[], use_cpu=True)
    torch.save(args, run / "training_args.bin")  # exactly what Trainer._save does
    # SmolLM2-135M: 30 layers, hidden 576, 9 heads / 3 kv heads of 64, MLP 1536.
    shapes = {"q_proj": (576, 576), "k_proj": (192, 576), "v_proj": (192, 576), "o_proj": (576, 576),
              "gate_proj": (1536, 576), "up_proj": (1536, 576), "down_proj": (576, 1536)}
    generator = np.random.default_rng(seed)
    tensors = {}
    for layer in range(30):
        for name, (out_features, in_features) in shapes.items():
            part = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = generator.normal(0, 0.02, (8, in_features)).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = generator.normal(0, 0.002, (out_features, 8)).astype(np.float32)
    save_file(tensors, str(run / "adapter_model.safetensors"))
    (run / "adapter_config.json").write_text(json.dumps({
        "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct", "peft_type": "LORA", "r": 8, "lora_alpha": 16,
        "lora_dropout": 0.0, "target_modules": list(shapes), "use_rslora": False, "modules_to_save": None}), encoding="utf-8")
    return run


def resolve_tokenizer(name: str) -> tuple[str, str | None]:
    """The --base-model to benchmark with: the requested one when it loads, else the tiny test model."""
    probe = subprocess.run([sys.executable, "-c", f"from gradian.model.base import load_tokenizer; load_tokenizer({name!r})"],
                           capture_output=True, text=True)
    if probe.returncode == 0:
        return name, None
    reason = (probe.stderr.strip().splitlines() or ["failed"])[-1]
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from tests.support.tiny import save_tiny_base

    fallback = Path(tempfile.mkdtemp(prefix="gradian-bench-tiny-"))
    save_tiny_base(fallback)
    return str(fallback), reason


def time_diagnose(arguments: list[str]) -> tuple[float, dict[str, Any]]:
    """Run `gradian diagnose` in a fresh process; its wall time and its JSON report."""
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, "-m", "gradian", "diagnose", *arguments, "--format", "json", "--fail-on", "never"],
                            capture_output=True, text=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"gradian diagnose failed ({result.returncode}): {result.stderr.strip()}")
    report = json.loads(result.stdout)
    report["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, report


def main() -> None:
    """Build the workload, time diagnose, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokenizer", default=EMBEDDED, help="--base-model whose tokenizer is used (default: the embedded SmolLM2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    options = parser.parse_args()

    base_model, fallback_reason = resolve_tokenizer(options.tokenizer)
    if fallback_reason:
        print(f"note: {options.tokenizer} did not load ({fallback_reason}); using the tiny test tokenizer", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="gradian-bench-diagnose-") as tmp:
        root = Path(tmp)
        dataset = write_jsonl(root / "train.jsonl", make_rows(options.rows, options.seed))
        eval_set = write_jsonl(root / "eval.jsonl", make_rows(100, options.seed + 1))
        run = write_run_dir(root / "run", options.steps, options.seed)
        arguments = ["--dataset", str(dataset), "--run", str(run), "--base-model", base_model, "--eval-dataset", str(eval_set)]
        time_diagnose(arguments)  # warm the OS file cache and the tokenizer cache once, untimed
        runs = [time_diagnose(arguments) for _ in range(options.repeats)]
    walls = [seconds for seconds, _ in runs]
    report = runs[-1][1]
    wall = statistics.median(walls)
    slowest = sorted(report["timings"].items(), key=lambda item: -item[1])[:6]
    result = {
        "rows": options.rows, "logged_steps": options.steps, "base_model": base_model, "repeats": options.repeats,
        "wall_seconds": round(wall, 3), "wall_seconds_all": [round(w, 3) for w in walls],
        "rows_per_second": round(options.rows / wall, 1), "in_process_seconds": report["summary"]["seconds"],
        "cpu_seconds": round(statistics.median(r["cpu_seconds"] for _, r in runs), 3),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "checks_run": report["summary"]["checks_run"], "findings": {k: report["summary"][k] for k in ("error", "warning", "info")},
        "slowest_checks": dict(slowest), "goal_seconds": 10.0, "meets_goal": wall < 10.0,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "tokenizer_fallback": fallback_reason,
    }
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{'workload':<48} {'wall s':>7} {'cpu s':>7} {'rows/s':>8} {'checks':>7}")
    print(f"{f'{options.rows} rows + {options.steps} steps ({Path(base_model).name})':<48} {wall:>7.2f} "
          f"{result['cpu_seconds']:>7.2f} {options.rows / wall:>8.0f} {result['checks_run']:>7}")
    print(f"load average during the run: {result['load_average_1min']} on {os.cpu_count()} CPUs")
    print(f"runs: {', '.join(f'{w:.2f}' for w in walls)} s; in-process {result['in_process_seconds']:.2f} s; "
          f"slowest checks: {', '.join(f'{k} {v:.2f}s' for k, v in slowest)}")
    print(f"goal < 10 s: {'met' if result['meets_goal'] else 'NOT met'}; wrote {options.out}")


if __name__ == "__main__":
    main()
