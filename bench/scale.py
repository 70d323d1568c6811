"""Capture cost at Llama-3.2-1B and Llama-3-8B shapes: measured on this CPU at a few layers, projected past it.

Random-weight ``LlamaForCausalLM`` models with the exact shapes of Llama-3.2-1B (hidden 2048, 16 layers, MLP 8192,
32 heads, 8 KV heads, head_dim 64, vocab 128,256, tied embeddings) and Llama-3-8B (hidden 4096, 32 layers, MLP
14,336, 32 heads, 8 KV heads, vocab 128,256), LoRA r=16 on all seven projections (peft ``get_peft_model``, random
B so every gradient is live), wrapped in ``LoadedModel`` and captured with ``GradientCapture`` as the index build
does, on batches of random token ids whose first half is masked as prompt.

Capture cost is linear in layers, so each configuration runs at L layers (the model's own loop stops at
``config.num_hidden_layers``) in a fresh process: the projected capture (smallest batch only: it differs from exact
in the per-example products alone), the lm_head + loss part alone, then the exact capture, the peak RSS reset
before each. Per layer = (capture - head) / L; the full depth is head + layers x per layer. One configuration also
runs at full depth to check the extrapolation. GPU numbers are projections from a FLOP count at a stated
throughput, never measurements. Prints tables and writes
JSON and markdown:

    .venv/bin/python bench/scale.py                  # bench/results/scale.{json,md}
    .venv/bin/python bench/scale.py --tiny --out /tmp/scale   # a 2-layer model, seconds (what the test runs)
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "scale"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RANK = 16
ROWS = (10_000, 100_000, 1_000_000)
CHILD_OVERHEAD_S = 20.0  # a configuration's process: imports, building the model, warm-ups
TILE = 1_000_003  # prime, so no two weight rows repeat when a seeded random block is tiled over a tensor


@dataclass(frozen=True)
class Shape:
    """A Llama architecture's sizes."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    def layer_params(self) -> int:
        """Weights of one decoder layer's seven projections (norms are negligible)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.hidden * (2 * q + 2 * kv) + 3 * self.hidden * self.intermediate

    def head_params(self) -> int:
        """Weights of the lm_head (the embedding, tied or not, is a lookup)."""
        return self.vocab * self.hidden

    def total_params(self, layers: int | None = None) -> int:
        """Every weight of the model at ``layers`` layers (embedding counted once when tied)."""
        layers = self.layers if layers is None else layers
        norms = (2 * layers + 1) * self.hidden
        return layers * self.layer_params() + self.head_params() * (1 if self.tied else 2) + norms


MODELS = {
    "llama-3.2-1b": Shape(2048, 16, 8192, 32, 8, 64, 128_256, True),
    "llama-3-8b": Shape(4096, 32, 14_336, 32, 8, 128, 128_256, False),
    "tiny": Shape(256, 2, 512, 4, 2, 64, 4096, True),
}


@dataclass(frozen=True)
class Grid:
    """What to measure: models, batches, lengths, layers measured, projection width, budgets."""

    models: tuple[str, ...]
    batches: tuple[int, ...]
    tokens: tuple[int, ...]
    measured_layers: dict[str, int]
    projection_dim: int
    check_full_depth: str  # the model whose cheapest configuration is also run at full depth
    config_budget_s: float  # a configuration estimated to take longer is skipped
    total_budget_s: float  # configurations that would run past this are skipped


FULL = Grid(("llama-3.2-1b", "llama-3-8b"), (1, 4, 8), (256, 1024), {"llama-3.2-1b": 1, "llama-3-8b": 1}, 2048,
            "llama-3.2-1b", 120.0, 780.0)
TINY = Grid(("tiny",), (1, 2), (16,), {"tiny": 1}, 64, "tiny", 60.0, 300.0)


# --- FLOP model (the yardstick of the CPU rate and of the GPU projections) ----------------------


def base_flops(shape: Shape, layers: int, tokens: int, supervised: int) -> float:
    """Forward + backward per example: 6 x weights x tokens for the layers and the lm_head, plus attention.

    The lm_head sees only the supervised rows (Gradian gathers them first). The 6x convention counts weight
    gradients that capture never computes (the base is frozen), so it is an MFU-style yardstick, not work done.
    """
    attention = 12 * layers * tokens * tokens * shape.heads * shape.head_dim  # QK^T and AV, forward + backward
    return 6.0 * (shape.layer_params() * layers * tokens + shape.head_params() * supervised) + attention


def product_flops(sketches: list[tuple[int, int, int, int]], tokens: int) -> float:
    """Per-example gradient products: project each side that is sketched, then sum_t out_t^T in_t."""
    total = 0.0
    for rows, cols, k_rows, k_cols in sketches:
        total += 2 * tokens * (rows * k_rows if k_rows != rows else 0) + 2 * tokens * (cols * k_cols if k_cols != cols else 0)
        total += 2 * tokens * k_rows * k_cols
    return total


# --- building the model --------------------------------------------------------------------------


def llama_config(shape: Shape, layers: int) -> Any:
    """A LlamaConfig of this shape with ``layers`` decoder layers."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                       num_hidden_layers=layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                       head_dim=shape.head_dim, tie_word_embeddings=shape.tied, max_position_embeddings=8192,
                       pad_token_id=0, bos_token_id=1, eos_token_id=1)


def _skip_init() -> Any:
    """transformers' no_init_weights (its module moved between releases), else a no-op context."""
    for module in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            return __import__(module, fromlist=["no_init_weights"]).no_init_weights()
        except (ImportError, AttributeError):
            continue
    return nullcontext()


def random_model(shape: Shape, layers: int, dtype: str, seed: int) -> Any:
    """A LlamaForCausalLM with random weights: one seeded N(0, 0.02) block tiled over each matrix.

    normal_ over a billion weights takes minutes on two cores; dense matmul time does not depend on the values.
    """
    import torch
    from transformers import LlamaForCausalLM

    with _skip_init():
        model = LlamaForCausalLM(llama_config(shape, layers))
    block = torch.randn(TILE, generator=torch.Generator().manual_seed(seed)) * 0.02
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                flat, whole = param.view(-1), param.numel() // TILE * TILE
                flat[:whole].view(-1, TILE).copy_(block.expand(whole // TILE, TILE))
                flat[whole:].copy_(block[: param.numel() - whole])
            else:
                param.fill_(1.0)  # RMSNorm weights
    if shape.tied and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(getattr(torch, dtype)).eval()


def word_tokenizer(vocab: int) -> Any:
    """A tokenizer built in code with exactly ``vocab`` ids (capture needs token ids, not text)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1", unk_token="t0")


def loaded_model(shape: Shape, layers: int, dtype: str = "float32", seed: int = 0, device: str = "cpu") -> Any:
    """The random model with LoRA r=16 on all seven projections (random B), wrapped in LoadedModel."""
    import torch
    from peft import LoraConfig, get_peft_model

    from gradian.model.loaded import LoadedModel

    if device == "meta":
        with torch.device("meta"):
            from transformers import LlamaForCausalLM

            base = LlamaForCausalLM(llama_config(shape, layers))
    else:
        base = random_model(shape, layers, dtype, seed)
    peft_model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=list(TARGETS),
                                                 lora_dropout=0.0, task_type="CAUSAL_LM"))
    if device != "meta":
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.01)
    return LoadedModel(peft_model, word_tokenizer(shape.vocab), base_model_name=f"random-{layers}-layers")


def random_batch(vocab: int, batch: int, tokens: int, seed: int) -> Any:
    """A Batch of random token ids; the first half of each example is prompt (labels -100)."""
    import torch

    from gradian.grads.batch import IGNORE_INDEX, collate

    ids = torch.randint(2, vocab, (batch, tokens), generator=torch.Generator().manual_seed(seed))
    labels = ids.clone()
    labels[:, : tokens // 2] = IGNORE_INDEX
    return collate([{"input_ids": ids[i], "labels": labels[i]} for i in range(batch)], 0)


def layer_of(block_name: str) -> int:
    """The decoder layer a LoRA block sits in (``model.layers.3.mlp.down_proj`` -> 3)."""
    parts = block_name.split(".")
    return int(parts[parts.index("layers") + 1])


def full_depth_plans(shape: Shape, projection_dim: int) -> dict[str, Any]:
    """Stored widths and sketch shapes of the full-depth model, from the library on a meta-device copy."""
    from gradian.grads.capture import GradientCapture

    loaded = loaded_model(shape, shape.layers, device="meta")
    plans: dict[str, Any] = {}
    for name, setting in (("exact", None), (f"projected {projection_dim}", projection_dim), ("auto", "auto")):
        try:
            capture = GradientCapture(loaded, projection_dim=setting)
        except (ValueError, TypeError):
            continue  # "auto" is not a projection_dim this gradian knows
        plan = capture.projection_plan
        sketches = ([(s.rows, s.cols, s.k_rows, s.k_cols) for s in plan.sketches] if plan is not None else
                    [(e.shape[0], e.shape[1], e.shape[0], e.shape[1]) for e in capture.block_layout])
        label = name if plan is not None or setting is None else f"{name} (= exact at this size)"
        plans[label] = {"dim": capture.dim, "projected": plan is not None, "sketches": sketches}
    return plans


# --- one configuration, in its own process -------------------------------------------------------


def _status_kb(field_name: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> int:
    """Free what the allocator holds, reset the process's peak RSS, and return the RSS now (KiB)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap returned, so the next peak is this run's own
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass
    return _status_kb("VmRSS")


def _capture_once(loaded: Any, blocks: list[Any], projection_dim: int | None, batch: Any, warm: Any) -> dict[str, Any]:
    """Time one capture of ``batch`` (after a warm-up on a small one) and take its peak RSS and stored bytes."""
    from gradian.grads.capture import GradientCapture
    from gradian.index.dtypes import encode_rows

    capture = GradientCapture(loaded, blocks, projection_dim=projection_dim)
    capture.capture(warm)  # one-time costs (allocator, kernels) stay out of the timing
    baseline = _reset_peak()
    started, cpu_started = time.perf_counter(), time.process_time()
    rows = capture.capture(batch).numpy()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    peak = _status_kb("VmHWM")
    cast_started = time.perf_counter()
    stored = {name: encode_rows(rows, name) for name in ("float32", "float16")}
    cast_seconds = time.perf_counter() - cast_started
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "dim": capture.dim, "baseline_rss_mb": baseline / 1024,
            "peak_over_baseline_mb": (peak - baseline) / 1024, "encode_seconds": cast_seconds,
            "bytes_per_example": {k: v.nbytes / batch.size for k, v in stored.items()},
            "itemsize": {k: v.dtype.itemsize for k, v in stored.items()}}


def _head_once(loaded: Any, rows: int, seed: int) -> dict[str, Any]:
    """lm_head + fp32 cross-entropy + backward to the hidden states over ``rows`` supervised rows, alone."""
    import torch
    import torch.nn.functional as F

    lm_head = loaded.causal_lm.get_output_embeddings()
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn((rows, lm_head.in_features), generator=generator).to(lm_head.weight.dtype).requires_grad_()
    targets = torch.randint(0, lm_head.out_features, (rows,), generator=generator)
    baseline = _reset_peak()
    started, cpu_started = time.perf_counter(), time.process_time()
    with torch.enable_grad():
        loss = F.cross_entropy(lm_head(hidden).float(), targets, reduction="sum")
        torch.autograd.grad(loss, hidden)
    return {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started, "rows": rows,
            "peak_over_baseline_mb": (_status_kb("VmHWM") - baseline) / 1024}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one configuration: each run in order (a capture at some layers, or the head part alone)."""
    import torch

    torch.set_num_threads(spec["threads"])
    shape = MODELS[spec["model"]]
    started = time.perf_counter()
    loaded = loaded_model(shape, max(run["layers"] for run in spec["runs"]), spec["dtype"], spec["seed"])
    build_seconds = time.perf_counter() - started
    blocks = loaded.blocks()
    batch = random_batch(shape.vocab, spec["batch"], spec["tokens"], spec["seed"])
    warm = random_batch(shape.vocab, 1, 16, spec["seed"] + 1)
    runs = []
    for run in spec["runs"]:  # ascending layers, smaller runs first: memory freed earlier is reused, not counted
        if run["mode"] == "head":
            runs.append({**run, **_head_once(loaded, spec["batch"] * (spec["tokens"] // 2), spec["seed"])})
            continue
        loaded.causal_lm.config.num_hidden_layers = run["layers"]
        selected = [b for b in blocks if layer_of(b.name) < run["layers"]]
        runs.append({**run, **_capture_once(loaded, selected, run["projection_dim"], batch, warm)})
    return {"build_seconds": build_seconds, "runs": runs,
            "weights_mb": sum(p.numel() * p.element_size() for p in loaded.model.parameters()) / 2**20}


# --- the parent: plan, prune, run, extrapolate ---------------------------------------------------


@dataclass
class Config:
    """One (model, batch, tokens) configuration and the runs its process makes."""

    model: str
    batch: int
    tokens: int
    runs: list[dict[str, Any]]
    result: dict[str, Any] | None = None
    skipped: str | None = None
    estimate_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def plan_grid(grid: Grid) -> list[Config]:
    """Every configuration, cheapest first; the first of the check model also runs at full depth."""
    configs = []
    for model in grid.models:
        shape, layers = MODELS[model], grid.measured_layers[model]
        share = max(14 * layers, round(grid.projection_dim * layers / shape.layers))  # this depth's share of the width
        for tokens in grid.tokens:
            for batch in grid.batches:
                runs = [{"layers": 0, "mode": "head", "projection_dim": None},
                        {"layers": layers, "mode": "exact", "projection_dim": None}]
                if batch == min(grid.batches):
                    runs.insert(0, {"layers": layers, "mode": "projected", "projection_dim": share})
                configs.append(Config(model, batch, tokens, runs))
    configs.sort(key=config_flops)
    check = next((c for c in configs if c.model == grid.check_full_depth), None)
    if check is not None:
        check.runs.append({"layers": MODELS[check.model].layers, "mode": "exact", "projection_dim": None, "check": True})
    return configs


def config_flops(config: Config, runs: list[dict[str, Any]] | None = None) -> float:
    """Model FLOPs a configuration's process spends on its runs (a head run has layers 0; warm-ups are small)."""
    shape = MODELS[config.model]
    runs = config.runs if runs is None else runs
    return sum(base_flops(shape, r["layers"], config.tokens, config.tokens // 2) for r in runs) * config.batch


def gemm_rate(threads: int) -> float:
    """FLOP/s of a float32 matmul now (the first estimate of how long a configuration takes)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(512, 2048), torch.randn(2048, 2048)
    a @ b
    started = time.perf_counter()
    for _ in range(4):
        a @ b
    return 4 * 2 * 512 * 2048 * 2048 / (time.perf_counter() - started)


def bf16_probe(threads: int, width: int) -> dict[str, float]:
    """A Linear's forward + input-gradient rate in float32 and bfloat16 on this CPU (is a bf16 base cheap here?)."""
    import torch

    torch.set_num_threads(threads)
    rates: dict[str, float] = {"width": float(width)}
    for name in ("float32", "bfloat16"):
        layer = torch.nn.Linear(width, width, bias=False).to(getattr(torch, name)).requires_grad_(False)
        x = torch.randn(64, width).to(layer.weight.dtype).requires_grad_()
        torch.autograd.grad(layer(x).sum(), x)
        started = time.perf_counter()
        torch.autograd.grad(layer(x).sum(), x)
        rates[name] = 2 * 2 * 64 * width * width / (time.perf_counter() - started)
    return rates


def bf16_note(probe: dict[str, float], dtype: str) -> str:
    """Whether a bfloat16 base was measured, and why not."""
    if dtype == "bfloat16":
        return "bfloat16 base measured"
    if probe["bfloat16"] * 4 < probe["float32"]:
        return (f"not measured: a bfloat16 Linear's forward + input gradient runs {probe['float32'] / probe['bfloat16']:.0f}x "
                "slower than float32 on this CPU, so every bfloat16 configuration is far over the budget")
    return "not measured (--dtype bfloat16 runs it)"


def run_config(config: Config, threads: int, dtype: str, seed: int) -> dict[str, Any]:
    """Run one configuration in a fresh process; its JSON result."""
    spec = {"model": config.model, "batch": config.batch, "tokens": config.tokens, "runs": config.runs,
            "threads": threads, "dtype": dtype, "seed": seed}
    output = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], check=True, capture_output=True,
                            text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    return json.loads(output.stdout.strip().splitlines()[-1])


def _mem_available_gb() -> float:
    """MemAvailable of this machine in GB (others share it)."""
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("inf")


def _budget(config: Config, grid: Grid, rate: float, spent: float) -> str | None:
    """Why a configuration is skipped (None: it runs); drops only its full-depth check when that alone is too long."""
    grid_runs = [r for r in config.runs if not r.get("check")]
    check_runs = [r for r in config.runs if r.get("check")]
    config.estimate_s = CHILD_OVERHEAD_S + config_flops(config, grid_runs) / rate
    check_s = config_flops(Config(config.model, config.batch, config.tokens, check_runs)) / rate
    if check_runs and (check_s > grid.config_budget_s or spent + config.estimate_s + check_s > grid.total_budget_s):
        config.runs = grid_runs
        config.extra["full_depth_check"] = f"skipped: estimated {check_s:.0f} s"
        check_s = 0.0
    config.estimate_s += check_s
    shape = MODELS[config.model]
    need = shape.total_params(max(r["layers"] for r in config.runs)) * 4 / 1e9 + 3.0
    if need > _mem_available_gb():
        return f"needs about {need:.0f} GB and {_mem_available_gb():.0f} GB is available"
    if config.estimate_s - check_s > grid.config_budget_s:
        return f"estimated {config.estimate_s:.0f} s > {grid.config_budget_s:.0f} s per configuration"
    if spent + config.estimate_s > grid.total_budget_s:
        return f"estimated {config.estimate_s:.0f} s would pass the {grid.total_budget_s:.0f} s budget of the run"
    return None


def measure(configs: list[Config], grid: Grid, threads: int, dtype: str, seed: int, say: Any) -> float:
    """Run the configurations that fit the budgets; returns the last measured model FLOP/s."""
    # Capture does about 4 x weights x tokens of real work where the yardstick counts 6 x: model FLOP/s = 1.5 x GEMM rate.
    rate = 1.5 * gemm_rate(threads)
    started = time.perf_counter()
    for config in configs:
        config.skipped = _budget(config, grid, rate, time.perf_counter() - started)
        if config.skipped:
            say(f"skip {config.model} batch {config.batch} x {config.tokens}: {config.skipped}")
            continue
        say(f"run  {config.model} batch {config.batch} x {config.tokens} (estimated {config.estimate_s:.0f} s)")
        child_started = time.perf_counter()
        config.result = run_config(config, threads, dtype, seed)
        config.extra["wall_seconds"] = time.perf_counter() - child_started
        measured = sum(r["seconds"] for r in config.result["runs"])
        rate = config_flops(config) / max(measured, 1e-9)  # contention drifts: the latest rate predicts the next best
    return rate


def _split(capture_s: float, head_s: float, layers: int, full_layers: int) -> tuple[float, float]:
    """(per layer, full depth) seconds per example from a capture at ``layers`` layers and the head part alone."""
    per_layer = max(capture_s - head_s, 0.0) / layers
    return per_layer, (head_s + full_layers * per_layer if layers < full_layers else capture_s)


def extrapolate(configs: list[Config], plans: dict[str, dict[str, Any]], threads: int) -> list[dict[str, Any]]:
    """Per measured run: full-depth seconds per example (from CPU time, and wall), memory, bytes stored.

    Wall seconds are what this process got of the shared cores; process CPU time counts the work its threads did,
    so CPU seconds / threads is what dedicated cores would take with every thread busy, and it splits into head and
    layers without the contention of the moment leaking into the difference.
    """
    rows = []
    for c in configs:
        if not c.result:
            continue
        shape = MODELS[c.model]
        head = next(r for r in c.result["runs"] if r["mode"] == "head")  # same process, same batch, between the captures
        captures = [r for r in c.result["runs"] if r["mode"] != "head"]
        weights_measured = shape.total_params(max(r["layers"] for r in c.runs)) * 4 / 2**20
        runtime = captures[0]["baseline_rss_mb"] - weights_measured  # interpreter, torch, tokenizer
        for run in captures:
            layers, full = run["layers"], run["layers"] == shape.layers
            cpu_layer, cpu_full = _split(run["cpu_seconds"] / c.batch, head["cpu_seconds"] / c.batch, layers, shape.layers)
            _, wall_full = _split(run["seconds"] / c.batch, head["seconds"] / c.batch, layers, shape.layers)
            head_mb = head["peak_over_baseline_mb"]
            per_layer_mb = max(run["peak_over_baseline_mb"] - head_mb, 0.0) / layers
            working_full = run["peak_over_baseline_mb"] if full else head_mb + shape.layers * per_layer_mb
            plan = plans[c.model]["exact" if run["mode"] == "exact" else next(k for k in plans[c.model] if k.startswith("projected"))]
            flops = base_flops(shape, layers, c.tokens, c.tokens // 2) * c.batch
            rows.append({
                "model": c.model, "batch": c.batch, "tokens": c.tokens, "supervised": c.tokens // 2, "mode": run["mode"],
                "layers_measured": layers, "layers_full": shape.layers, "full_is_measured": full, "dim_measured": run["dim"],
                "capture_seconds": run["seconds"], "capture_cpu_seconds": run["cpu_seconds"],
                "head_cpu_seconds_per_example": head["cpu_seconds"] / c.batch, "cpu_seconds_per_layer_per_example": cpu_layer,
                "cpu_seconds_per_example_full": cpu_full, "seconds_per_example_full": cpu_full / threads,
                "wall_seconds_per_example_full": wall_full,
                "model_gflops_per_s_wall": flops / run["seconds"] / 1e9,
                "model_gflops_per_s_cpu": flops / (run["cpu_seconds"] / threads) / 1e9,
                "peak_over_baseline_mb": run["peak_over_baseline_mb"], "baseline_rss_mb": run["baseline_rss_mb"],
                "working_mb_full": working_full,
                "peak_rss_gb_full": ((run["baseline_rss_mb"] + run["peak_over_baseline_mb"]) / 1024 if full
                                     else (runtime + shape.total_params() * 4 / 2**20 + working_full) / 1024),
                "bytes_per_example_measured": run["bytes_per_example"], "itemsize": run["itemsize"], "dim_full": plan["dim"],
                "bytes_per_example_full": {k: plan["dim"] * size for k, size in run["itemsize"].items()},
                "encode_float16_seconds_per_example_full": run["encode_seconds"] / c.batch * plan["dim"] / run["dim"],
            })
    return rows


def gpu_seconds(shape: Shape, tokens: int, sketches: list[tuple[int, int, int, int]], tflops: float) -> float:
    """Projected GPU seconds per example: model FLOPs plus per-example products at ``tflops`` sustained."""
    return (base_flops(shape, shape.layers, tokens, tokens // 2) + product_flops(sketches, tokens)) / (tflops * 1e12)


def project_rows(measured: list[dict[str, Any]], plans: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Time to index 10k/100k/1M rows: this CPU at the best measured rate, one GPU and N GPUs (projections)."""
    tflops = args.gpu_peak_tflops * args.gpu_mfu
    out = []
    for model, plan_set in plans.items():
        shape = MODELS[model]
        for tokens in sorted({m["tokens"] for m in measured if m["model"] == model}):
            for storage, plan_name, itemsize in _storages(plan_set):
                # Any mode: projected and exact differ in the per-example products alone, less than run-to-run noise,
                # and only exact runs at every batch, so the best batch's rate stands for both.
                cpu = [m["seconds_per_example_full"] for m in measured if m["model"] == model and m["tokens"] == tokens]
                per_gpu = gpu_seconds(shape, tokens, plan_set[plan_name]["sketches"], tflops)
                write = plan_set[plan_name]["dim"] * itemsize / (args.disk_gbps * 1e9)
                row = {"model": model, "tokens": tokens, "storage": storage, "bytes_per_example": plan_set[plan_name]["dim"] * itemsize,
                       "cpu_seconds_per_example": min(cpu) if cpu else None, "gpu_seconds_per_example": per_gpu,
                       "write_seconds_per_example": write, "gpus": args.gpus, "rows": {}}
                for n in ROWS:
                    row["rows"][str(n)] = {
                        "cpu_seconds": min(cpu) * n if cpu else None,
                        "gpu1_seconds": max(per_gpu, write) * n,
                        f"gpu{args.gpus}_seconds": max(per_gpu / args.gpus, write) * n,
                        "disk_bytes": plan_set[plan_name]["dim"] * itemsize * n,
                    }
                out.append(row)
    return out


def _storages(plan_set: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(storage label, plan name, bytes per number) of each storage choice."""
    out = [("exact float32", "exact", 4), ("exact float16", "exact", 2)]
    out += [(f"{name} float16", name, 2) for name in plan_set if name != "exact"]
    return out


# --- report ----------------------------------------------------------------------------------------


def human_seconds(seconds: float | None) -> str:
    """12.3 s, 4.5 min, 3.2 h, 2.1 d, 1.4 y."""
    if seconds is None:
        return "-"
    for unit, size in (("y", 365 * 86400), ("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def human_bytes(count: float) -> str:
    """Powers of 1000, as disk tools print."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if count < 1000 or unit == "PB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return ""


def markdown(report: dict[str, Any]) -> str:
    """The results as markdown tables."""
    machine = report["machine"]
    lines = [f"Command: `{report['command']}`", "",
             f"**{report['label']}**: {report['threads']} threads, load average {machine['load_average_at_start']:.1f} at start "
             f"and {machine['load_average_at_end']:.1f} at end. Wall seconds are what this process got of the shared cores; "
             f"process CPU seconds count the work its threads did, so CPU s / {report['threads']} is what {report['threads']} "
             "dedicated cores would take with every thread busy. The split into head and layers, and every extrapolation, "
             "uses CPU time, so the contention of the moment does not leak into a difference of two wall times.", "",
             f"Random-weight models of the exact shapes, LoRA r=16 on q,k,v,o,gate,up,down, {report['dtype']} base, batches of "
             "random token ids with the first half masked as prompt. Each configuration ran in its own process at L layers "
             "(`num_hidden_layers`): the projected capture (smallest batch only; it differs from exact in the per-example "
             "products alone), the lm_head + fp32 loss + its backward alone (head), then the exact capture, peak RSS reset "
             "before each. **Full depth is extrapolated**: head + layers x (capture - head) / L, unless marked measured. "
             "Peak RSS at full depth adds the full model's fp32 weights to the measured runtime and the extrapolated working "
             "memory. The projected run at L layers uses that depth's share of the projection width; float16 storage is the "
             "exact capture plus a cast. Model GFLOP/s counts 6 x weights x tokens (the MFU convention; capture does about "
             "4x of real work, the frozen base needing no weight gradients): the yardstick of the GPU projections below.", ""]
    lines += _measured_lines(report) + _rows_lines(report) + _disk_lines(report)
    return "\n".join(lines) + "\n"


def _measured_lines(report: dict[str, Any]) -> list[str]:
    """The measured table, the full-depth check, what was skipped, the bf16 probe."""
    threads = report["threads"]
    lines = ["## Measured on this CPU (shared 2 cores) and extrapolated to full depth", "",
             f"| model | batch | tokens | mode | L | wall s, shared (batch, L layers) | CPU s | head CPU s/ex | per layer CPU s/ex | "
             f"full depth s/ex (CPU s / {threads}) | model GFLOP/s wall / CPU | peak over model MB (L) | peak RSS full GB | "
             "bytes/ex full fp32 | bytes/ex full fp16 |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in report["measured"]:
        full = f"{m['seconds_per_example_full']:.1f}" + (" (measured)" if m["full_is_measured"] else "")
        lines.append(f"| {m['model']} | {m['batch']} | {m['tokens']} | {m['mode']} | {m['layers_measured']} | "
                     f"{m['capture_seconds']:.1f} | {m['capture_cpu_seconds']:.1f} | {m['head_cpu_seconds_per_example']:.1f} | "
                     f"{m['cpu_seconds_per_layer_per_example']:.1f} | {full} | {m['model_gflops_per_s_wall']:.0f} / "
                     f"{m['model_gflops_per_s_cpu']:.0f} | {m['peak_over_baseline_mb']:.0f} | {m['peak_rss_gb_full']:.1f} | "
                     f"{human_bytes(m['bytes_per_example_full']['float32'])} | {human_bytes(m['bytes_per_example_full']['float16'])} |")
    check = report.get("full_depth_check")
    lines += ["", "Full-depth check: not run (over budget)." if not check else
              f"Full-depth check ({check['model']}, batch {check['batch']} x {check['tokens']}, exact, same process): extrapolated "
              f"from {check['layers_measured']} layer {check['extrapolated_s']:.1f} s/example vs measured {check['measured_s']:.1f} "
              f"at {check['layers_full']} layers (ratio {check['ratio']:.2f}, CPU time; wall, shared: {check['extrapolated_wall_s']:.1f} "
              f"vs {check['measured_wall_s']:.1f}); working memory extrapolated {check['extrapolated_mb']:.0f} MB vs measured "
              f"{check['measured_mb']:.0f} MB."]
    lines += ["", "Skipped (estimated from the measured wall rate before running, the budget being wall-clock):", ""]
    lines += [f"- {s['model']} batch {s['batch']} x {s['tokens']} tokens: {s['reason']}" for s in report["skipped"]] or ["- none"]
    probe = report["bf16_probe"]
    return lines + ["", f"bf16 base: {report['bf16']}; a Linear 64 x {probe['width']:.0f} x {probe['width']:.0f} forward + input "
                        f"gradient ran at {probe['float32'] / 1e9:.1f} GFLOP/s in float32 and {probe['bfloat16'] / 1e9:.2f} GFLOP/s "
                        "in bfloat16 here (wall)."]


def _rows_lines(report: dict[str, Any]) -> list[str]:
    """Time to index 10k / 100k / 1M rows: this CPU, and GPU projections."""
    a = report["assumptions"]
    lines = ["", "## Index build time at 10k / 100k / 1M rows", "",
             f"CPU: the best full-depth seconds per example above (CPU s / {report['threads']}: {report['threads']} dedicated cores; "
             f"this run's wall clock on the shared cores was {report['wall_over_cpu']:.1f}x that) x rows. **GPU columns are "
             f"PROJECTIONS, not measurements**: model FLOPs (6 x weights x tokens for the layers, 6 x lm_head x supervised "
             f"tokens, attention, plus the per-example gradient products) at {a['gpu_peak_tflops']:.0f} TFLOP/s bf16 peak x "
             f"{a['gpu_mfu']:.0%} = {a['gpu_peak_tflops'] * a['gpu_mfu']:.0f} TFLOP/s sustained per {a['gpu']}; {a['gpus']} GPUs = "
             f"torchrun ranks with perfect scaling (ranks share no work but the statistics); each GPU column is floored by "
             f"writing the rows at {a['disk_gbps']:g} GB/s to one node's disk.", "",
             f"| model | tokens | storage | CPU 10k | CPU 100k | CPU 1M | 1 GPU 10k | 1 GPU 100k | 1 GPU 1M | "
             f"{a['gpus']} GPUs 10k | {a['gpus']} GPUs 100k | {a['gpus']} GPUs 1M |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in report["rows_projection"]:
        cells = [human_seconds(p["rows"][str(n)][key]) for key in ("cpu_seconds", "gpu1_seconds", f"gpu{a['gpus']}_seconds")
                 for n in ROWS]
        lines.append(f"| {p['model']} | {p['tokens']} | {p['storage']} | " + " | ".join(cells) + " |")
    return lines + ["", "Exact rows are disk-bound on GPUs: the write floor, not the GPU count, sets their time. `auto` is the "
                        "library's `grads.projection_dim: auto` plan at full depth (exact when it fits its budget, else rank-exact "
                        "sketches). The CPU columns take the best batch of any mode: projected and exact captures differ in the "
                        "per-example products alone, less than the run-to-run noise of the table above."]


def _disk_lines(report: dict[str, Any]) -> list[str]:
    """Bytes on disk per storage choice and row count."""
    lines = ["", "## Disk per index (shards only; exact arithmetic: rows x width x bytes per number)", "",
             "| model | storage | width | per example | 10k rows | 100k rows | 1M rows |", "|---|---|---|---|---|---|---|"]
    seen = set()
    for p in report["rows_projection"]:
        if (p["model"], p["storage"]) in seen:
            continue
        seen.add((p["model"], p["storage"]))
        width = p["bytes_per_example"] // (4 if "float32" in p["storage"] else 2)
        lines.append(f"| {p['model']} | {p['storage']} | {width:,} | {human_bytes(p['bytes_per_example'])} | "
                     + " | ".join(human_bytes(p["rows"][str(n)]["disk_bytes"]) for n in ROWS) + " |")
    return lines


def full_depth_check(measured: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Compare the extrapolation from L layers with the full-depth run of the same process."""
    for full in (m for m in measured if m["full_is_measured"] and m["layers_measured"] > 1):
        low = next((m for m in measured if (m["model"], m["batch"], m["tokens"], m["mode"]) ==
                    (full["model"], full["batch"], full["tokens"], "exact") and not m["full_is_measured"]), None)
        if low is None:
            continue
        return {"model": full["model"], "batch": full["batch"], "tokens": full["tokens"],
                "layers_measured": low["layers_measured"], "layers_full": full["layers_measured"],
                "extrapolated_s": low["seconds_per_example_full"], "measured_s": full["seconds_per_example_full"],
                "ratio": low["seconds_per_example_full"] / full["seconds_per_example_full"],
                "extrapolated_wall_s": low["wall_seconds_per_example_full"], "measured_wall_s": full["wall_seconds_per_example_full"],
                "extrapolated_mb": low["working_mb_full"], "measured_mb": full["peak_over_baseline_mb"]}
    return None


def progress(text: str) -> None:
    """A progress line on stderr (the tables go to stdout)."""
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with --child, one configuration)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of hidden 256: seconds, for the test")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="base weights")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config-budget", type=float, help="seconds one configuration may take (estimated)")
    parser.add_argument("--total-budget", type=float, help="seconds the measured runs may take together")
    parser.add_argument("--gpu", default="H200", help="the GPU the projections are for")
    parser.add_argument("--gpu-peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200 SXM: 989)")
    parser.add_argument("--gpu-mfu", type=float, default=0.35, help="assumed fraction of the peak sustained")
    parser.add_argument("--gpus", type=int, default=8, help="ranks under torchrun for the N-GPU column")
    parser.add_argument("--disk-gbps", type=float, default=2.0, help="assumed write speed of one node's disk, GB/s")
    parser.add_argument("--out", type=Path, default=RESULTS, help="writes OUT.json and OUT.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    grid = TINY if args.tiny else FULL
    grid = Grid(**{**asdict(grid), "config_budget_s": args.config_budget or grid.config_budget_s,
                   "total_budget_s": args.total_budget or grid.total_budget_s})
    load_start = os.getloadavg()[0]
    probe = bf16_probe(args.threads, MODELS[grid.models[0]].hidden)
    plans = {model: full_depth_plans(MODELS[model], grid.projection_dim) for model in grid.models}
    configs = plan_grid(grid)
    rate = measure(configs, grid, args.threads, args.dtype, args.seed, progress)
    label = f"shared {os.cpu_count()} cores"
    measured = extrapolate(configs, plans, args.threads)
    import torch

    report: dict[str, Any] = {
        "command": " ".join([".venv/bin/python", "bench/scale.py", *map(shlex.quote, argv if argv is not None else sys.argv[1:])]),
        "label": label, "threads": args.threads, "dtype": args.dtype, "tiny": args.tiny,
        "grid": {**asdict(grid)}, "lora": {"r": RANK, "alpha": 2 * RANK, "targets": list(TARGETS)},
        "models": {m: {**asdict(MODELS[m]), "params": MODELS[m].total_params(),
                       "widths_full": {k: v["dim"] for k, v in plans[m].items()}} for m in grid.models},
        "measured": measured,
        "skipped": [{"model": c.model, "batch": c.batch, "tokens": c.tokens, "reason": c.skipped,
                     "estimated_seconds": c.estimate_s} for c in configs if c.skipped],
        "full_depth_check": full_depth_check(measured),
        "notes": {f"{c.model} batch {c.batch} x {c.tokens}": c.extra for c in configs if c.extra},
        "bf16_probe": probe,
        "bf16": bf16_note(probe, args.dtype),
        "last_model_gflops_per_s": rate / 1e9,
        "assumptions": {"gpu": args.gpu, "gpu_peak_tflops": args.gpu_peak_tflops, "gpu_mfu": args.gpu_mfu,
                        "gpus": args.gpus, "disk_gbps": args.disk_gbps,
                        "flops": "6 x layer weights x tokens + 6 x lm_head x supervised tokens + 12 x layers x tokens^2 x "
                                 "heads x head_dim + per-example products (2 x tokens x sketch sizes)"},
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                    "load_average_at_start": load_start, "load_average_at_end": os.getloadavg()[0]},
    }
    report["rows_projection"] = project_rows(measured, plans, args)
    # How much slower the shared wall clock was than CPU time / threads, over every capture of the run.
    report["wall_over_cpu"] = (sum(m["capture_seconds"] for m in measured) /
                               max(sum(m["capture_cpu_seconds"] for m in measured) / args.threads, 1e-9))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    args.out.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
