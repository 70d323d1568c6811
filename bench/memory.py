"""Peak memory of attribution: `gradian attribute` at two index sizes, and scoring alone on a real index.

(a) tiny: a random tiny Llama built in code (hidden 128, 4 layers, LoRA r=16 on all seven projections: 131,072
    numbers, 512 KiB of float32 gradient per example). `gradian index` builds an exact float32 index, then
    `gradian attribute --index` (no eval set: the first training examples are the target) scores, clusters and
    drills into it, each in its own process, at 400 and 4,000 training rows: with attribution.chunk_mb at the
    budget (default 8 MiB, so the index is about 26x and 260x the budget) and at the old equivalent (1,024 rows
    a chunk, what attribution.chunk_size=1024 read before the budget was in bytes).
(b) index: scoring alone (statistics, diagonal preconditioner, scoring, automatic clusters) on an existing index,
    e.g. the exact fp32 index of 400 SmolLM2-135M rows that `gradian demo` builds (9.77 MB per row, 3.9 GB), at
    the default budget and at the old equivalent. ``--before-code DIR`` also runs it on the code of another
    checkout (its package sources on PYTHONPATH), e.g. a copy taken before the byte budget, at its own defaults.

Peak RSS is each child's ru_maxrss from os.wait4, so it counts that process alone, pages of memory-mapped shards
included. RSS does not depend on CPU contention; the seconds do, and on a shared machine they are only a guide.
Prints a table and writes JSON and markdown:

    .venv/bin/python bench/memory.py                                    # bench/results/memory.{json,md}
    .venv/bin/python bench/memory.py --index DIR --before-code /path/to/old/checkout
    .venv/bin/python bench/memory.py --rows 400 --skip-index
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PACKAGES = ("gradian-core", "gradian-checks", "gradian-trainer-hf", "gradian-trainer-trl", "gradian-trainer-unsloth")
OLD_CHUNK_ROWS = 1024  # attribution.chunk_size's default before the budget was in bytes
TINY = {"hidden": 128, "layers": 4, "heads": 4, "kv_heads": 2, "r": 16}
WORDS = ("the river city market music garden winter lesson science bridge history planet ocean doctor letter "
         "mountain village engine forest language window summer number teacher animal kitchen station").split()
DEMO_INDEX = Path("/work/bench-cases/fact-0/index")


# --- running one measured child ----------------------------------------------------------------


def measured(command: list[str], env: dict[str, str] | None = None, cap_gb: float | None = None) -> dict[str, Any]:
    """Run ``command``; its wall seconds, peak RSS (from its own rusage) and last stdout line.

    ``cap_gb`` limits the child's address space, so code that would take more memory than the shared machine
    has fails with a MemoryError instead of pushing other jobs out.
    """

    def limit() -> None:
        import resource

        cap = int(cap_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    started = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as out, tempfile.TemporaryFile(mode="w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, env={**os.environ, **(env or {})}, cwd=ROOT,
                                 preexec_fn=limit if cap_gb else None)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if child.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited {child.returncode}:\n{stderr[-3000:]}")
    lines = stdout.strip().splitlines()
    return {"peak_rss_mb": usage.ru_maxrss / 1024, "seconds": round(seconds, 1), "last_line": lines[-1] if lines else ""}


def gradian_command(*args: str) -> list[str]:
    """`gradian ARGS` through this interpreter."""
    return [sys.executable, "-m", "gradian", *args]


# --- (a) the tiny model ------------------------------------------------------------------------


def build_tiny_inputs(root: Path, rows: int, seed: int = 0) -> dict[str, Path]:
    """Base model, adapter (random B, so every gradient is live) and ``rows`` chat rows, written under ``root``."""
    sys.path.insert(0, str(ROOT))
    from tests.support.tiny import tiny_llama, tiny_lora, tiny_tokenizer

    base, adapter, dataset = root / "base", root / "adapter", root / f"train-{rows}.jsonl"
    if not (base / "config.json").is_file():
        tokenizer = tiny_tokenizer("chatml")
        model = tiny_llama(tokenizer, seed=seed, hidden=TINY["hidden"], layers=TINY["layers"], heads=TINY["heads"],
                           kv_heads=TINY["kv_heads"])
        model.save_pretrained(base, safe_serialization=True)
        tokenizer.save_pretrained(base)
        tiny_lora(model, r=TINY["r"], alpha=2.0 * TINY["r"], seed=seed,
                  targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                  ).save_pretrained(adapter, safe_serialization=True)
    if not dataset.is_file():
        rng = random.Random(seed)
        with open(dataset, "w", encoding="utf-8") as handle:
            for _ in range(rows):
                prompt = "Please explain: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) + "?"
                answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) + "."
                handle.write(json.dumps({"messages": [{"role": "user", "content": prompt},
                                                      {"role": "assistant", "content": answer}]}) + "\n")
    return {"base": base, "adapter": adapter, "dataset": dataset}


def tiny_runs(root: Path, rows: int, chunk_mb: float) -> list[dict[str, Any]]:
    """Build the index of ``rows`` rows, then attribute at the budget and at the old equivalent."""
    inputs = build_tiny_inputs(root, rows)
    index_dir = root / f"index-{rows}"
    common = ["--base-model", str(inputs["base"]), "--adapter", str(inputs["adapter"]), "--dataset",
              str(inputs["dataset"]), "--set", "grads.projection_dim=null", "--set", "grads.max_seq_length=128"]
    # One torch thread: a model this small runs several times faster so on a shared machine; RSS is the same.
    env = {"GRADIAN_CACHE_DIR": str(root / "cache"), "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    built = measured(gradian_command("index", *common, "--out", str(index_dir)), env)
    manifest = json.loads((index_dir / "manifest.json").read_text(encoding="utf-8"))
    row_mb = manifest["dim"] * 4 / 2**20
    index_mb = row_mb * rows
    results = [{"case": "tiny", "rows": rows, "step": "gradian index", "chunk_mb": None, "dim": manifest["dim"],
                "index_mb": index_mb, **built}]
    for label, budget in (("budget", chunk_mb), ("old equivalent", OLD_CHUNK_ROWS * row_mb)):
        out = root / f"report-{rows}-{label.replace(' ', '-')}"
        run = measured(gradian_command("attribute", *common, "--index", str(index_dir), "--out", str(out),
                                       "--set", f"attribution.chunk_mb={budget}"), env)
        results.append({"case": "tiny", "rows": rows, "step": f"gradian attribute ({label})", "chunk_mb": budget,
                        "dim": manifest["dim"], "index_mb": index_mb, **run})
    return results


# --- (b) scoring alone on an existing index ------------------------------------------------------


def score_child(index_dir: Path, chunk_mb: float | None, queries: int, seed: int) -> dict[str, Any]:
    """In a fresh process: statistics, diagonal preconditioner, scoring, clusters; peak RSS of each stage."""
    import numpy as np

    from gradian.attribution.clusters import score_clusters
    from gradian.attribution.index_statistics import index_statistics
    from gradian.attribution.preconditioners import from_config
    from gradian.attribution.scoring import score_with_config
    from gradian.config import AttributionConfig
    from gradian.index import open_index

    fields = {f.name for f in dataclasses.fields(AttributionConfig)}
    # Older code has no chunk_mb: it runs at its own defaults (chunk_size rows).
    config = AttributionConfig(chunk_mb=chunk_mb) if chunk_mb is not None and "chunk_mb" in fields else AttributionConfig()
    index = open_index(index_dir)
    q = np.random.default_rng(seed).standard_normal((queries, index.dim)).astype(np.float32)
    detail: dict[str, Any] = {"dim": index.dim, "rows": len(index), "queries": queries,
                              "chunk_mb": getattr(config, "chunk_mb", None),
                              "chunk_size": getattr(config, "chunk_size", None), "baseline_rss_mb": _status_mb("VmRSS")}

    def stage(name: str, step: Any) -> Any:
        _reset_peak()
        started = time.perf_counter()
        try:
            value = step()
        except MemoryError:  # over --cap-gb: what it would have taken is more than the cap
            value = None
            detail[f"{name}_error"] = "MemoryError at the address-space cap"
        detail[f"{name}_peak_rss_mb"] = _status_mb("VmHWM")
        detail[f"{name}_seconds"] = round(time.perf_counter() - started, 1)
        return value

    preconditioner = stage("statistics", lambda: from_config(config, index_statistics(index)))
    scores = stage("score", lambda: score_with_config(index, q, config, preconditioner=preconditioner))
    if scores is not None:
        stage("clusters", lambda: score_clusters(config, np.asarray(scores.blame), None, index))
    return detail


def _status_mb(field: str) -> float:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    """Reset VmHWM so the next stage's peak is its own (Linux; a no-op elsewhere)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
    except OSError:
        pass


def index_runs(index_dir: Path, queries: int, before_code: Path | None, cap_gb: float | None) -> list[dict[str, Any]]:
    """Scoring alone on ``index_dir`` at the default budget, the old equivalent, and (optionally) older code."""
    manifest = json.loads((index_dir / "manifest.json").read_text(encoding="utf-8"))
    row_mb = manifest["dim"] * 4 / 2**20
    runs = [("this code, default budget", None, None), ("this code, old equivalent", OLD_CHUNK_ROWS * row_mb, None)]
    if before_code is not None:
        runs.append((f"code at {before_code}, its defaults", None, before_code))
    results = []
    for label, budget, code in runs:
        env = {"PYTHONPATH": os.pathsep.join(str(code / p / "src") for p in PACKAGES)} if code is not None else {}
        command = [sys.executable, str(Path(__file__).resolve()), "--score-child", str(index_dir), "--queries",
                   str(queries)] + (["--chunk-mb", str(budget)] if budget is not None else [])
        run = measured(command, env, cap_gb)
        detail = json.loads(run.pop("last_line"))
        results.append({"case": "index", "step": f"scoring alone ({label})", "index": str(index_dir),
                        "index_mb": row_mb * manifest["num_examples"], **detail, **run})
    return results


# --- report ------------------------------------------------------------------------------------


def table(report: dict[str, Any]) -> str:
    """The results as markdown tables."""
    lines = []
    tiny = [r for r in report["results"] if r["case"] == "tiny"]
    if tiny:
        lines += [f"(a) tiny Llama, {tiny[0]['dim']:,} numbers per row ({tiny[0]['dim'] * 4 / 2**20:.2f} MiB float32); "
                  f"peak RSS of each command in its own process", "",
                  "| rows | index MiB | command | chunk_mb | peak RSS MB | seconds (contended) |", "|---|---|---|---|---|---|"]
        for r in tiny:
            budget = "-" if r["chunk_mb"] is None else f"{r['chunk_mb']:.0f}"
            lines.append(f"| {r['rows']:,} | {r['index_mb']:.0f} | `{r['step']}` | {budget} | {r['peak_rss_mb']:.0f} | "
                         f"{r['seconds']:.0f} |")
    scored = [r for r in report["results"] if r["case"] == "index"]
    if scored:
        first = scored[0]
        lines += ["", f"(b) scoring alone on {first['index']}: {first['rows']} rows x {first['dim']:,} numbers "
                      f"({first['index_mb']:.0f} MiB), {first['queries']} queries", "",
                  "| run | chunk | whole process peak RSS MB | after imports MB | statistics peak | score peak | "
                  "clusters peak | score s | clusters s |", "|---|---|---|---|---|---|---|---|---|"]
        for r in scored:
            chunk = f"{r['chunk_mb']:.0f} MiB" if r.get("chunk_mb") is not None else f"{r.get('chunk_size')} rows"
            peaks = [_peak(r, stage, report.get("cap_gb")) for stage in ("statistics", "score", "clusters")]
            seconds = [f"{r[f'{stage}_seconds']:.0f}" if f"{stage}_seconds" in r else "-" for stage in ("score", "clusters")]
            lines.append(f"| {r['step']} | {chunk} | {r['peak_rss_mb']:.0f} | {r['baseline_rss_mb']:.0f} | "
                         f"{' | '.join(peaks)} | {' | '.join(seconds)} |")
    return "\n".join(lines)


def _peak(result: dict[str, Any], stage: str, cap_gb: float | None) -> str:
    if f"{stage}_error" in result:
        return f"over the {cap_gb:g} GiB cap"
    return f"{result[f'{stage}_peak_rss_mb']:.0f}" if f"{stage}_peak_rss_mb" in result else "-"


def main() -> int:
    """Run the benchmark (or, with --score-child, one scoring measurement)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[400, 4000], help="training rows of the tiny runs")
    parser.add_argument("--chunk-mb", type=float, help="attribution.chunk_mb of the tiny runs (default 8)")
    parser.add_argument("--index", type=Path, default=DEMO_INDEX, help="an existing index to score (part b)")
    parser.add_argument("--queries", type=int, default=10, help="query vectors scored against that index")
    parser.add_argument("--before-code", type=Path, help="a checkout whose code part (b) also runs")
    parser.add_argument("--skip-index", action="store_true", help="skip part (b)")
    parser.add_argument("--cap-gb", type=float, default=12.0,
                        help="address-space cap of each part (b) child, in GiB; a stage past it is reported, not run")
    parser.add_argument("--workdir", type=Path, help="keep the tiny model, datasets and indexes here")
    parser.add_argument("--out", type=Path, default=RESULTS / "memory.json")
    parser.add_argument("--merge", action="store_true",
                        help="keep the results in --out of the part (tiny / index) this run skips")
    parser.add_argument("--score-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.score_child:
        print(json.dumps(score_child(args.score_child, args.chunk_mb, args.queries, args.seed)))
        return 0
    command = shlex.join([f".venv/bin/{Path(sys.executable).name}", *sys.argv])
    report: dict[str, Any] = {
        "commands": [command], "tiny_model": TINY, "cap_gb": args.cap_gb, "results": [],
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average_at_start": os.getloadavg()[0]},
    }
    ran = {"tiny"} if args.rows else set()
    ran |= set() if args.skip_index else {"index"}
    if args.merge and args.out.is_file():
        previous = json.loads(args.out.read_text(encoding="utf-8"))
        report["results"] = [r for r in previous["results"] if r["case"] not in ran]
        report["commands"] = [c for c in previous.get("commands", []) if c != command] + [command]
    with tempfile.TemporaryDirectory(prefix="gradian-memory-") as scratch:
        root = args.workdir or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        for rows in args.rows:
            report["results"] += tiny_runs(root, rows, args.chunk_mb or 8.0)
            print(table(report), flush=True)
    if not args.skip_index:
        if (args.index / "manifest.json").is_file():
            report["results"] += index_runs(args.index, args.queries, args.before_code, args.cap_gb)
        else:
            print(f"no index at {args.index}: part (b) skipped", file=sys.stderr)
    report["machine"]["load_average_at_end"] = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    text = table(report)
    made_by = "\n".join(f"    {c}" for c in report["commands"])
    args.out.with_suffix(".md").write_text(f"Made by:\n\n{made_by}\n\n{text}\n", encoding="utf-8")
    print(text)
    print(f"\nwrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
