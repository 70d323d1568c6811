"""Peer baselines on finished accuracy cases: Kronfluence (EK-FAC) and bergson, each from its own virtual environment.

Neither peer is a dependency of Gradian. Each runs as a subprocess with its own venv's python (bench/peers/<peer>_blame.py)
and reads only plain files that this driver writes per case under ``--work``:

  data/train.jsonl            one row per training example: input_ids, labels (-100 off the supervised tokens),
                              rendered with Gradian's chat template and loss mask (gradian.data.encode), so every
                              method sees the same tokens
  data/query_wanted.jsonl     one row per regressed eval item: the prompt and the WANTED answer (encode_answer)
  data/query_generated.jsonl  the same prompts with what the fine-tuned model generated (for the contrast query)
  data/meta.json              the base model dir, the adapter dir, the pad id, the item ids

A peer writes ``blame_<variant>.npy`` (one float per training row, higher = more blamed) and ``result.json``
(variants, the variants it could not run and why, seconds per stage, notes); a peer that fails writes
``error.txt``. Blame is the negated influence on the wanted answer's loss: training on a blamed row raised the loss
of what the user wanted. The contrast variant is the influence on loss(wanted) - loss(fine-tuned answer) per item
(bergson's ``query.contrast``), averaged over items. This driver scores each blame vector as every benchmark does
(``gradian.evaluation.ground_truth``) and writes bench/results/peers.json and .md, failures included.

    .venv/bin/python bench/peers.py --cases /work/bench-cases fact-0 fact-1 format-0 format-1 span-0
    .venv/bin/python bench/peers.py --cases /work/bench-cases fact-0 --fit-rows 64    # factors from 64 rows
    .venv/bin/python bench/peers.py --cases /work/bench-cases fact-0 span-0 --collect  # table finished runs only

The peer venvs (``--venvs``, default /work/peers): ``python3 -m venv /work/peers/<peer>``, then in each
``pip install torch==2.13.0`` (the CPU build) first, transformers / peft / safetensors / tokenizers / accelerate at
Gradian's versions, and ``pip install --no-deps kronfluence==1.0.1`` + einops einconv opt-einsum tqdm, or
``pip install --no-deps bergson==2.5.1`` + jaxtyping natsort petname simple-parsing ml_dtypes torchopt optree graphviz
datasets scipy pyarrow pyyaml jinja2 (both declare torchvision, which would pull a CUDA torch).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from gradian.evaluation.ground_truth import GroundTruth

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy, finished_cases next to this file

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "peers"
NOT_RUN = "not run (cut for time)"
PEERS = ("kronfluence", "bergson")
VARIANT_NAMES = {  # variant key written by a peer script -> the table's name
    "ekfac_wanted": "EK-FAC, wanted answer",
    "ekfac_contrast": "EK-FAC, contrast (wanted - fine-tuned)",
    "cosine_wanted": "gradient cosine (default query), wanted answer",
    "cosine_contrast": "gradient cosine, contrast",
}


def prepare_case(workdir: Path, data: Path, base_model: str, max_seq_length: int | None) -> dict[str, Any]:
    """Tokenize the case's training rows and regressed items as Gradian does; write them under ``data``."""
    from gradian.data import encode, encode_answer, load_dataset, load_eval_dataset
    from gradian.model.base import load_tokenizer, resolve_base_model
    from gradian.model.loaded import training_tokenizer
    from gradian.report.reader import read_report

    scenario = json.loads((workdir / "scenario" / "scenario.json").read_text(encoding="utf-8"))
    report = read_report(workdir / "report")
    length = max_seq_length or int(scenario.get("max_seq_length") or 128)
    model_dir = resolve_base_model(base_model)
    adapter = workdir / "train" / "adapter"
    tokenizer, _ = training_tokenizer(load_tokenizer(base_model), base_model, adapter)
    examples = load_dataset(workdir / "scenario" / "train.jsonl")
    prompts = {e.id: e.prompt_messages for e in load_eval_dataset(workdir / "scenario" / "eval.jsonl")}
    items = [item for item in report.capability.items if item.regressed] if report.capability else []
    data.mkdir(parents=True, exist_ok=True)

    def write(name: str, encoded: list[Any]) -> None:  # whole files replaced at once: a running peer may read them
        temp = data / f"{name}.tmp"
        with temp.open("w", encoding="utf-8") as out:
            for enc in encoded:
                out.write(json.dumps({"input_ids": list(enc.input_ids), "labels": list(enc.labels)}) + "\n")
        temp.replace(data / name)

    write("train.jsonl", [encode(example, tokenizer, length) for example in examples])
    write("query_wanted.jsonl", [encode_answer(prompts[item.id], item.wanted, tokenizer, length)
                                 for item in items])
    write("query_generated.jsonl", [encode_answer(prompts[item.id], item.finetuned_output or "",
                                                  tokenizer, length) for item in items])
    meta = {"case": workdir.name, "model_dir": str(model_dir), "adapter_dir": str(adapter),
            "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
            "max_seq_length": length, "n_train": len(examples), "items": [item.id for item in items],
            "has_generated": [bool(item.finetuned_output) for item in items]}
    (data / "meta.json.tmp").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (data / "meta.json.tmp").replace(data / "meta.json")
    return {"scenario": scenario, "report": report, "examples": examples, "meta": meta}


def truth(prepared: dict[str, Any]) -> GroundTruth:
    """Planted rows, the planted rows the fine-tuned model reproduces, sources and the planted clusters."""
    from gradian.demo.run import reproduced_planted_ids
    from gradian.evaluation.ground_truth import GroundTruth

    scenario, examples = prepared["scenario"], prepared["examples"]
    planted = types.SimpleNamespace(planted_ids=scenario.get("planted_ids") or [],
                                    planted_targets=scenario.get("planted_targets") or [],
                                    planted_wrong=scenario.get("planted_wrong") or [])
    reproduced = reproduced_planted_ids(planted, prepared["report"])  # type: ignore[arg-type]
    return GroundTruth(planted_rows=tuple(scenario["planted_rows"]),
                       sources=tuple(str(e.fields.get("source")) for e in examples),
                       planted_clusters=tuple(scenario.get("planted_clusters") or ()),
                       reproduced_rows=tuple(i for i, e in enumerate(examples) if reproduced and e.id in reproduced))


def first_error_line(out: Path, log: Path, code: int, start: int = 0) -> str:
    """The peer's own error line (error.txt), else its log's last exception line after ``start``, else how it ended."""
    if (out / "error.txt").is_file():
        return (out / "error.txt").read_text(encoding="utf-8").strip().splitlines()[0][:300]
    text = log.read_bytes()[start:].decode("utf-8", errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", line)]
    if errors:
        return errors[-1][:300]
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}, no result written"


def remove_work_dirs(out: Path) -> None:
    """Delete a finished peer run's folders (index, factors, adapter copy); its blame, result and log stay."""
    # bergson's uncompressed index is ~4 GB a case and each peer's factors ~2.4 GB: kept, a few cases fill the disk
    for path in sorted(p for p in out.iterdir() if p.is_dir()):
        shutil.rmtree(path)
        print(f"  removed {path} (--keep-work keeps it)", flush=True)


def run_peer(peer: str, data: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run one peer's script in its venv on one case (or reuse a finished run); its variants or its error."""
    result_file = out / "result.json"
    if result_file.is_file() and not args.rerun:
        print(f"  {peer}: finished earlier ({result_file})", flush=True)
        return json.loads(result_file.read_text(encoding="utf-8"))
    if args.collect:
        return {"error": NOT_RUN}
    out.mkdir(parents=True, exist_ok=True)
    stale = [out / "error.txt", result_file] + ([] if args.resume else list(out.glob("blame_*.npy")))
    for path in stale:
        path.unlink(missing_ok=True)
    python = args.venvs / peer / "bin" / "python"
    command = ["nice", "-n", str(args.nice), str(python), str(HERE / "peers" / f"{peer}_blame.py"),
               "--data", str(data), "--out", str(out)]
    if args.max_queries:
        command += ["--max-queries", str(args.max_queries)]
    if args.fit_rows:
        command += ["--fit-rows", str(args.fit_rows)]
    if args.resume:
        command.append("--resume")
    log = out / "log.txt"
    start = log.stat().st_size if args.resume and log.is_file() else 0  # a resumed run appends to the earlier log
    print(f"  {peer}: {' '.join(command)} (log {log})", flush=True)
    began = time.perf_counter()
    with log.open("a" if args.resume else "w", encoding="utf-8") as handle:
        try:
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
            code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, timeout=args.timeout,
                                  env=env).returncode
        except subprocess.TimeoutExpired:
            code = None
        except OSError as error:  # the venv is missing
            handle.write(f"{type(error).__name__}: {error}\n")
            code = -1
    seconds = round(time.perf_counter() - began, 1)
    if code == 0 and result_file.is_file():
        result = json.loads(result_file.read_text(encoding="utf-8"))
        result["wall_seconds"] = seconds
        if not args.keep_work:
            remove_work_dirs(out)
    else:
        error = f"timed out after {args.timeout} s" if code is None else first_error_line(out, log, code, start)
        result = {"error": error, "exit_code": code, "wall_seconds": seconds}
        print(f"  {peer}: failed: {error}", flush=True)
    result["command"] = " ".join(command)
    result_file.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def score_case(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Both peers on one case: the metrics of every variant each produced, or what failed."""
    base = args.work / workdir.name
    prepared = prepare_case(workdir, base / "data", args.base_model, args.max_seq_length)
    known = truth(prepared)
    meta = prepared["meta"]
    case: dict[str, Any] = {"case": workdir.name, "train_rows": meta["n_train"], "planted": len(known.planted_rows),
                            "regressed_items": len(meta["items"]), "peers": {}}
    if (workdir / "report" / "scores.csv").is_file():  # Gradian's own answer on the case: its report's ranking
        from goal_table import blame_vector

        case["gradian"] = known.score(blame_vector(workdir / "report", meta["n_train"]))
    for peer in args.peers:
        print(f"{workdir.name}: {peer}", flush=True)
        result = run_peer(peer, base / "data", base / peer, args)
        entry: dict[str, Any] = {key: result.get(key) for key in ("error", "seconds", "wall_seconds", "notes",
                                                                  "queries", "command", "config") if key in result}
        entry["variants"] = {}
        for variant in result.get("variants", []):
            blame = np.load(base / peer / f"blame_{variant}.npy").astype(np.float64)
            if blame.shape != (meta["n_train"],) or not np.isfinite(blame).all():
                entry["variants"][variant] = {"error": f"blame has shape {blame.shape}, "
                                                       f"{int((~np.isfinite(blame)).sum())} non-finite values"}
                continue
            metrics = known.score(blame)
            entry["variants"][variant] = metrics
            print(f"  {peer} {variant}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                                      for k, v in metrics.items()), flush=True)
        for variant, reason in (result.get("failed_variants") or {}).items():
            entry["variants"][variant] = {"error": reason}
            print(f"  {peer} {variant}: {reason}", flush=True)
        case["peers"][peer] = entry
    return case


def error_cell(error: str) -> str:
    """A table cell for what a peer or one of its variants could not do: a skip as it is, anything else as failed."""
    return error if error.startswith("not run") else f"failed: {error}"


def markdown(cases: list[dict[str, Any]], command: str, notes: list[str]) -> str:
    """One table: case x peer variant, recall@k / AUPRC / planted-cluster rank, failures named; then timings."""
    def cell(metrics: dict[str, Any] | None) -> str:
        if metrics is None:
            return "-"
        if "error" in metrics:
            return error_cell(metrics["error"])
        cluster = f" / #{metrics['cluster_rank']}" if "cluster_rank" in metrics else " / -"
        return f"{metrics['recall_at_k']:.2f} / {metrics['auprc']:.2f}{cluster}"

    rows: list[tuple[str, str]] = []  # (peer, variant); a peer that produced nothing anywhere gets one row
    for peer in dict.fromkeys(p for case in cases for p in case["peers"]):
        variants = dict.fromkeys(v for case in cases for v in (case["peers"].get(peer) or {}).get("variants", {}))
        rows += [(peer, variant) for variant in variants or [""]]
    names = [c["case"] for c in cases]
    lines = ["# Peer baselines on the finished accuracy cases: Kronfluence and bergson", "", f"`{command}`", "",
             "Each cell: recall@k / AUPRC / rank of the planted cluster by mean blame (k = the planted rows; "
             "`gradian.evaluation.ground_truth`). Queries: the regressed eval items, scored on the loss of the "
             "wanted answer (blame = minus the influence), and the contrast loss(wanted) - loss(fine-tuned answer); "
             "averaged over items. Tokens are Gradian's chat template and loss mask, written by this driver.", "",
             "| peer | method | " + " | ".join(names) + " | mean recall@k |", "|---|---|" + "---|" * (len(names) + 1)]
    for peer, variant in rows:
        cells, recalls = [], []
        for case in cases:
            entry = case["peers"].get(peer)
            if entry is None:
                cells.append("-")
            elif entry.get("error") and not entry["variants"]:
                cells.append(error_cell(entry["error"]))
            else:
                metrics = entry["variants"].get(variant)
                cells.append(cell(metrics))
                if metrics and "recall_at_k" in metrics:
                    recalls.append(metrics["recall_at_k"])
        mean = f"{np.mean(recalls):.3f} ({len(recalls)} cases)" if recalls else "-"
        lines.append(f"| {peer} | {VARIANT_NAMES.get(variant, variant or '-')} | " + " | ".join(cells) + f" | {mean} |")
    reference = gradian_reference([c["case"] for c in cases if "gradian" not in c])
    if reference:
        lines.append("| gradian (reference) | defaults: divergent-token query, diagonal, exact index "
                     "(bench/results/kronecker.json) | " + " | ".join(reference.get(c["case"], "-") for c in cases)
                     + " | - |")
    own = [c["gradian"]["recall_at_k"] for c in cases if "gradian" in c]
    if own:
        lines.append("| gradian | the case's own report (scores.csv's blame; the settings its Provenance records) | "
                     + " | ".join(cell(c.get("gradian")) for c in cases) + f" | {np.mean(own):.3f} ({len(own)} cases) |")
    lines += ["", "## Time per case (seconds, wall clock, measured while other jobs shared the 2 CPU cores)", "",
              "| case | train rows / planted / regressed items | " + " | ".join(PEERS) + " |", "|---|---|---|---|"]
    for case in cases:
        timing = []
        for peer in PEERS:
            entry = case["peers"].get(peer)
            if entry is None or "wall_seconds" not in entry:
                timing.append("not run" if entry and entry.get("error") == NOT_RUN else "-")
                continue
            stages = ", ".join(f"{k} {v:.0f}" for k, v in (entry.get("seconds") or {}).items())
            timing.append(f"{entry.get('wall_seconds', 0):.0f}" + (f" ({stages})" if stages else ""))
        lines.append(f"| {case['case']} | {case['train_rows']} / {case['planted']} / {case['regressed_items']} | "
                     + " | ".join(timing) + " |")
    peer_notes = [f"- {case['case']}, {peer}: {note}" for case in cases for peer, entry in case["peers"].items()
                  for note in entry.get("notes") or []]
    runs = [f"- {case['case']}, {peer}: `{entry['command']}`" for case in cases
            for peer, entry in case["peers"].items() if entry.get("command")]
    lines += ["", "## Notes", "", *notes, *peer_notes, "", "## Peer runs (each peer script's own command line)", "",
              *runs]
    return "\n".join(lines) + "\n"


def gradian_reference(names: list[str]) -> dict[str, str]:
    """Gradian's default scoring on the same cases, as bench/kronecker.py measured it (recall@k / AUPRC)."""
    path = HERE / "results" / "kronecker.json"
    if not path.is_file():
        return {}
    cases = {c["case"]: c for c in json.loads(path.read_text(encoding="utf-8")).get("cases", [])}
    out = {}
    for name in names:
        metrics = (cases.get(name) or {}).get("variants", {}).get("diagonal, exact")
        if metrics:
            out[name] = f"{metrics['recall_at_k']:.2f} / {metrics['auprc']:.2f} / -"
    return out


NOTES = [
    "- Kronfluence 1.0.1 (`bench/peers/kronfluence_blame.py`): EK-FAC factors (true Fisher, sampled labels) over "
    "the lora_A / lora_B Linear modules only, damping `None` = its 0.1 x mean-eigenvalue heuristic, summed token "
    "loss; pairwise scores of every query item against every training row. Contrast = score(wanted) - "
    "score(fine-tuned answer), exact because the influence is linear in the query gradient.",
    "- bergson 2.5.1 (`bench/peers/bergson_blame.py`): `build` of an uncompressed (projection_dim 0) LoRA gradient "
    "index, `approximate_hessians` (kfac with eigenvalue correction = EK-FAC), then queries through its `Attributor` "
    "(per-item query gradients from its `TraceCollector`; the contrast query is the per-item difference of the "
    "two gradients, as `query.contrast` subtracts a control set). The cosine rows are its default query path "
    "(`Attributor(unit_norm=True)`, no Hessian).",
    "- What shared the cores with each run is in the notes below (its nice level in its command line). One thread a "
    "peer by default: with two threads on two cores that other jobs kept busy, Kronfluence's covariance pass took 80 s "
    "a batch of 8 rows, with one thread 20 s.",
    "- Installed in /work/peers/<peer> venvs, never in Gradian's: torch 2.13.0 (CPU) first, then transformers, "
    "peft, safetensors, tokenizers and accelerate at Gradian's versions; `kronfluence==1.0.1 --no-deps` + einops, "
    "einconv, opt-einsum, tqdm (its torchvision requirement would pull a CUDA torch 2.14); `bergson==2.5.1 "
    "--no-deps` + the packages ../shared/METHODS.md lists, datasets, scipy, pyarrow.",
]


def main(argv: list[str] | None = None) -> int:
    """Run the peers on each named case and write bench/results/peers.json and .md."""
    from finished_cases import carried_note, command_line, earlier_rows, named_twice, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, required=True, help="the directory of KIND-SEED case work dirs")
    parser.add_argument("names", nargs="+", help="case names, e.g. fact-0 format-0")
    parser.add_argument("--base-model", default="smollm2-135m-instruct")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--venvs", type=Path, default=Path("/work/peers"), help="holds one venv per peer")
    parser.add_argument("--work", type=Path, default=Path("/work/peers/out"), help="tokens and peer outputs")
    parser.add_argument("--max-seq-length", type=int, default=None, help="default: the scenario's")
    parser.add_argument("--max-queries", type=int, default=0, help="cut each case to the first N regressed items")
    parser.add_argument("--fit-rows", type=int, default=0,
                        help="fit each peer's EK-FAC factors on the first N training rows (0: all), to fit the time")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per peer and case")
    parser.add_argument("--nice", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP/MKL threads of a peer (1: two threads spin against each other on busy shared cores)")
    parser.add_argument("--rerun", action="store_true", help="run peers again that finished a case earlier")
    parser.add_argument("--resume", action="store_true",
                        help="let a peer reuse what its interrupted run with the same arguments saved (an index, "
                             "factors, scored variants)")
    parser.add_argument("--keep-work", action="store_true",
                        help="keep a finished peer run's index and factors (deleted by default: GBs a case)")
    parser.add_argument("--collect", action="store_true",
                        help="run nothing: table the finished peer runs, the rest as not run")
    parser.add_argument("--note", action="append", default=[], help="a line for the notes (repeatable)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.peers = [p for p in args.peers.split(",") if p]
    if named_twice("peers", args.names):
        return 2
    earlier = earlier_rows(args.out)  # a case dir is ~8 GB and not kept: a row once measured stays, carried
    here = {name for name in args.names if (args.cases / name / "report" / "report.json").is_file()}
    missing = [name for name in args.names if name not in here and name not in earlier]
    if missing:
        print(f"peers: no finished case {', '.join(missing)} under {args.cases} and no earlier row in {args.out}",
              file=sys.stderr)
        return 2
    cases = [score_case(args.cases / name, args) if name in here else {**earlier[name], "carried": True}
             for name in args.names]
    command = command_line("peers.py", argv) + (" --note ... (the notes below)" if args.note else "")
    notes = list(NOTES) + [f"- {note}" for note in args.note]
    if args.max_queries:
        notes.append(f"- Cut to the first {args.max_queries} regressed items per case (--max-queries).")
    carried = carried_note(cases, "no work dir under --cases, so not run again")
    if carried:
        notes.append(f"- {carried}")
    if args.fit_rows:
        notes.append(f"- Cut to fit the time on two shared cores: each peer's EK-FAC factors (covariances, eigenvalue "
                     f"correction) were fitted on the first {args.fit_rows} training rows (--fit-rows); every row is "
                     "still scored. The cosine rows use no factors.")
    write_results(args.out, command, cases, markdown(cases, command, notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
