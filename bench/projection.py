"""What a smaller index costs in accuracy: float16 storage and factored projections against exact fp32 gradients.

For each finished accuracy case (a demo work dir of bench/accuracy.py: the scenario, the trained adapter, the
report and the exact float32 index), the shipped default scoring (contrastive query, diagonal preconditioner,
mean of z-scored item blame) ranks the training rows under several index variants:

- exact float32 (the reference: the same numbers as bench/accuracy.py's default row);
- exact float16 (the stored rows rounded to float16);
- ``auto`` projections at several budgets (rank side exact, widths following each matrix's size) and the older
  fixed ``projection_dim`` split, each stored in float16.

A projected variant is computed from the exact rows: the factored sketch P_rows G P_cols^T is linear in G, so
sketching the stored exact gradient equals sketching at capture time (one forward and backward per variant
saved); ``--real-check KIND-SEED`` also builds one real projected index with `gradian index` code and reports
how close its blame is to the sketched one. The query is sketched the same way.

    .venv/bin/python bench/projection.py --cases /work/bench-cases        # every case dir found there
    .venv/bin/python bench/projection.py --cases DIR --budgets 65536,262144 --real-check fact-0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy, accuracy_methods next to this file

RESULTS = Path(__file__).resolve().parent / "results"
ROWS_PER_READ = 32  # exact SmolLM2 rows are ~10 MB each


def exact_config(scenario: Any) -> Any:
    """The demo's config with the index the accuracy cases were built with: exact float32 gradients."""
    from gradian.demo.run import demo_config

    config = demo_config(scenario)
    return config.replace(grads=dataclasses.replace(config.grads, projection_dim=None, storage_dtype="float32"))


def sketcher(capture: Any, plan: Any, whitening: Any = None) -> Any:
    """A function mapping exact flat gradients [n, exact dim] to the plan's sketched rows [n, plan.dim].

    With a ``whitening`` each matrix gradient goes through its row-side and column-side transforms first, as the
    capture does.
    """
    import torch

    from gradian.grads.projection import FactoredProjection

    projection = FactoredProjection(plan)
    layout = capture.block_layout

    def sketch(rows: np.ndarray) -> np.ndarray:
        out = np.zeros((rows.shape[0], plan.dim), dtype=np.float32)
        offset = 0
        for index, entry in enumerate(layout):
            g = torch.from_numpy(np.ascontiguousarray(rows[:, entry.offset:entry.offset + entry.size]))
            g = g.reshape(rows.shape[0], *entry.shape)
            if whitening is not None:
                g = transformed(g, *whitening.scales[index])
            s = projection.sketch_gradient(index, g).reshape(rows.shape[0], -1)
            out[:, offset:offset + s.shape[1]] = s.numpy()
            offset += s.shape[1]
        return out

    return sketch


def transformed(gradients: Any, row_side: Any, col_side: Any) -> Any:
    """T_rows G T_cols for a batch of matrix gradients [n, rows, cols]; a vector transform is a diagonal."""
    g = row_side @ gradients if row_side.dim() == 2 else row_side[:, None] * gradients
    return g @ col_side if col_side.dim() == 2 else g * col_side[None, :]


def variant_rows(index: Any, transform: Any, dtype: str) -> np.ndarray:
    """Every index row through ``transform`` (identity for exact), rounded to the storage dtype, as float32."""
    parts = []
    for _, chunk in index.iter_chunks(ROWS_PER_READ):
        rows = np.asarray(chunk, dtype=np.float32)
        rows = transform(rows) if transform is not None else rows
        parts.append(rows.astype(dtype).astype(np.float32))
    return np.concatenate(parts)


def fit_whitening(index: Any, capture: Any, seed: int, attribution: Any) -> Any:
    """The scales a projected build fits: E[g^2] of the exact rows at the build's seeded sample positions."""
    from gradian.grads.whitening import sample_positions

    rows = np.asarray(index.rows(sample_positions(index.num_examples, seed)), dtype=np.float32)
    return whitening_of_rows(rows, capture.block_layout, attribution.damping, attribution.damping_ratio)


def whitening_of_rows(rows: np.ndarray, layout: Any, damping: float | None, damping_ratio: float,
                      scheme: str = "factored-diagonal-v1") -> Any:
    """The shipped fit (``MomentAccumulator.whitening``) from exact flat gradient rows laid out as ``layout``."""
    from gradian.grads.whitening import moments_of_rows

    return moments_of_rows(rows, [entry.shape for entry in layout]).whitening(
        damping=damping, damping_ratio=damping_ratio, scheme=scheme)


def default_blame(rows: np.ndarray, queries: np.ndarray, attribution: Any, *, whitened: bool = False) -> np.ndarray:
    """The shipped default scoring over in-memory rows: the diagonal preconditioner, from their second moment unless
    the rows and queries were scaled by it before the sketch (then P = I here)."""
    from gradian.attribution.preconditioners import IndexStatistics, from_config
    from gradian.attribution.scoring import ArraySource, score_examples

    moment = np.einsum("ij,ij->j", rows, rows, dtype=np.float64) / rows.shape[0]
    stats = IndexStatistics(dim=rows.shape[1], second_moment=moment, projected=True,
                            whitening={"scheme": "factored-diagonal-v1"} if whitened else None)
    pre = from_config(dataclasses.replace(attribution, preconditioner="diagonal"), stats)
    scores = score_examples(ArraySource(rows), queries, preconditioner=pre, aggregation="mean", top_k=20)
    return np.asarray(scores.blame, dtype=np.float64)


def variants(capture: Any, budgets: list[int], fixed: list[int], seed: int) -> list[tuple[str, Any, str, int, bool]]:
    """(name, plan or None, storage dtype, stored width, whitened) of every variant scored.

    Projected variants are whitened, as the shipped build does; the default budget is also scored the way a
    projected index was before (diagonal preconditioner estimated on the sketched rows), for comparison.
    """
    from gradian.grads.projection import AUTO_BUDGET, exact_width, plan_auto_projection, plan_projection

    exact = exact_width(capture.blocks)
    out: list[tuple[str, Any, str, int, bool]] = [("exact float32", None, "float32", exact, False),
                                                  ("exact float16", None, "float16", exact, False)]
    for budget in budgets:
        plan = plan_auto_projection(capture.blocks, seed, budget)
        if plan is None:
            continue
        out.append((f"auto {budget:,} float16", plan, "float16", plan.dim, True))
        if budget == AUTO_BUDGET:
            out.append((f"auto {budget:,} float16, sketch-space diagonal (before)", plan, "float16", plan.dim, False))
    for dim in fixed:
        out.append((f"fixed {dim:,} float16 (old split)", plan_projection(capture.blocks, dim, seed), "float16", dim,
                    True))
    return out


def score_case(workdir: Path, base_model: str, budgets: list[int], fixed: list[int]) -> dict[str, Any]:
    """Every variant's recall@k, AUPRC and agreement with exact fp32 on one finished case."""
    from accuracy_methods import load_case, query

    from gradian.demo.run import reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.report.reader import read_report

    kind, seed = workdir.name.rsplit("-", 1)
    scenario = make_scenario(kind, int(seed))
    report = read_report(workdir / "report")
    if not report.attributed:
        return {"kind": kind, "seed": int(seed), "status": "refused"}
    config = exact_config(scenario)
    case = load_case(workdir, base_model, config, report)
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, report))
    queries = query(case, "contrastive")
    row: dict[str, Any] = {"kind": kind, "seed": int(seed), "status": "scored", "variants": {}}
    reference = None
    whitening = fit_whitening(case.index, case.capture, config.grads.seed, config.attribution)
    for name, plan, dtype, width, whitened in variants(case.capture, budgets, fixed, config.grads.seed):
        began = time.perf_counter()
        sketch = sketcher(case.capture, plan, whitening if whitened else None) if plan is not None else None
        rows = variant_rows(case.index, sketch, dtype)
        q = sketch(queries.astype(np.float32)) if sketch is not None else queries
        blame = default_blame(rows, q, config.attribution, whitened=whitened)
        del rows
        metrics = truth.score(blame)
        reference = blame if reference is None else reference
        metrics["spearman_vs_exact"] = spearman(blame, reference)
        metrics["width"] = width
        metrics["bytes_per_example"] = width * np.dtype(dtype).itemsize
        metrics["seconds"] = round(time.perf_counter() - began, 1)
        row["variants"][name] = metrics
        print(f"  {kind}-{seed} {name}: recall@k {metrics['recall_at_k']:.2f}, AUPRC {metrics['auprc']:.2f}, "
              f"spearman {metrics['spearman_vs_exact']:.3f}, {metrics['bytes_per_example'] / 1e6:.2f} MB/example",
              flush=True)
    return row


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two score vectors."""
    ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(np.float64)
    rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(np.float64)
    return float(np.corrcoef(ra, rb)[0, 1])


def real_check(workdir: Path, base_model: str, budget: int, scratch: Path) -> dict[str, Any]:
    """Build a real capture-time projected index for one case and compare its blame with the sketched one."""
    from accuracy_methods import load_case, query

    from gradian.demo.scenarios import make_scenario
    from gradian.grads.capture import GradientCapture
    from gradian.grads.projection import plan_auto_projection
    from gradian.index.build import build_index
    from gradian.report.reader import read_report

    kind, seed = workdir.name.rsplit("-", 1)
    scenario = make_scenario(kind, int(seed))
    report = read_report(workdir / "report")
    config = exact_config(scenario)
    case = load_case(workdir, base_model, config, report)
    queries = query(case, "contrastive")
    plan = plan_auto_projection(case.capture.blocks, config.grads.seed, budget)
    whitening = fit_whitening(case.index, case.capture, config.grads.seed, config.attribution)
    sketch = sketcher(case.capture, plan, whitening)
    sketched = default_blame(variant_rows(case.index, sketch, "float16"), sketch(queries.astype(np.float32)),
                             config.attribution, whitened=True)
    projected = config.replace(grads=dataclasses.replace(config.grads, projection_dim="auto", storage_dtype="float16"))
    # SmolLM2's adapter is small enough for ``auto`` to keep it exact; lower the limits so it sketches to ``budget``.
    import gradian.grads.projection as projection

    projection.AUTO_EXACT_LIMIT, projection.AUTO_BUDGET = 0, budget
    began = time.perf_counter()
    index = build_index(case.loaded, case.examples, projected, scratch)
    seconds = time.perf_counter() - began
    capture = GradientCapture.for_index(case.loaded, projected.grads, index)
    assert index.whitening() is not None, "a projected index scored with the diagonal is whitened"
    real_queries = query(dataclasses.replace(case, capture=capture, config=projected), "contrastive")
    real_rows = variant_rows(index, None, "float32")
    real = default_blame(real_rows, real_queries, projected.attribution, whitened=True)
    return {"case": workdir.name, "budget": budget, "spearman_real_vs_sketched": spearman(real, sketched),
            "top20_overlap": len(set(np.argsort(-real)[:20]) & set(np.argsort(-sketched)[:20])) / 20,
            "max_abs_row_difference": float(np.abs(real_rows - variant_rows(case.index, sketch, "float16")).max()),
            "index_seconds": round(seconds, 1), "index_bytes": index.disk_bytes()}


def summarize(cases: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per variant and kind: mean recall@k, AUPRC and Spearman vs exact over seeds; and over every case."""
    scored = [c for c in cases if c.get("status") == "scored"]
    names = list(dict.fromkeys(name for c in scored for name in c["variants"]))
    kinds = list(dict.fromkeys(c["kind"] for c in scored))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in names:
        out[name] = {}
        for kind in [*kinds, "all"]:
            rows = [c["variants"][name] for c in scored if name in c["variants"] and kind in (c["kind"], "all")]
            if rows:
                out[name][kind] = {key: float(np.mean([r[key] for r in rows]))
                                   for key in ("recall_at_k", "auprc", "spearman_vs_exact", "bytes_per_example")}
                out[name][kind]["cases"] = len(rows)
    return out


def markdown(summary: dict[str, Any], cases: list[dict[str, Any]], check: dict[str, Any] | None, command: str) -> str:
    """The summary table (recall@k / AUPRC by kind, loss against exact fp32) and the per-case table."""
    kinds = [k for k in next(iter(summary.values()), {}) if k != "all"]
    reference = summary.get("exact float32", {}).get("all", {}).get("recall_at_k")
    lines = ["# Index size against accuracy", "", f"`{command}`", "",
             "Default scoring (contrastive query, diagonal preconditioner); recall@k / AUPRC, mean over seeds; "
             "\"loss\" is mean recall@k over every case minus exact fp32's.", "",
             "| index | bytes per example | " + " | ".join(kinds) + " | all | loss vs exact | Spearman vs exact |",
             "|---|---|" + "---|" * len(kinds) + "---|---|---|"]
    for name, by_kind in summary.items():
        every = by_kind["all"]
        cells = [f"{by_kind[k]['recall_at_k']:.2f} / {by_kind[k]['auprc']:.2f}" if k in by_kind else "-" for k in kinds]
        loss = f"{reference - every['recall_at_k']:+.3f}" if reference is not None else "-"
        lines.append(f"| {name} | {every['bytes_per_example'] / 1e6:.2f} MB | " + " | ".join(cells)
                     + f" | {every['recall_at_k']:.2f} / {every['auprc']:.2f} | {loss} | {every['spearman_vs_exact']:.3f} |")
    lines += ["", "## Cases", "", "| case | " + " | ".join(summary) + " |", "|---|" + "---|" * len(summary)]
    for c in cases:
        if c.get("status") != "scored":
            lines.append(f"| {c['kind']}-{c['seed']} | {c.get('status')} |")
            continue
        lines.append(f"| {c['kind']}-{c['seed']} | " + " | ".join(
            f"{c['variants'][n]['recall_at_k']:.2f}" if n in c["variants"] else "-" for n in summary) + " |")
    if check:
        lines += ["", "## A real projected index against the sketch of the exact one", "",
                  f"Case {check['case']}, auto budget {check['budget']:,}: Spearman of blame {check['spearman_real_vs_sketched']:.4f}, "
                  f"top-20 overlap {check['top20_overlap']:.2f}, largest row difference {check['max_abs_row_difference']:.3g}; "
                  f"built in {check['index_seconds']} s (shared 2 cores), {check['index_bytes'] / 1e6:.1f} MB on disk."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score every case dir under --cases and write bench/results/projection.json and .md."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", required=True, help="a directory of accuracy case work dirs named KIND-SEED")
    parser.add_argument("--base-model", default="smollm2-135m-instruct")
    parser.add_argument("--budgets", default="65536,262144,1048576")
    parser.add_argument("--fixed", default="2048,16384", help="fixed projection_dim widths (the older split)")
    parser.add_argument("--real-check", default="", help="KIND-SEED: also build one real projected index")
    parser.add_argument("--out", default=str(RESULTS / "projection"))
    args = parser.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",") if b]
    fixed = [int(b) for b in args.fixed.split(",") if b]
    dirs = sorted(d for d in Path(args.cases).iterdir()
                  if (d / "index" / "manifest.json").is_file() and (d / "report" / "report.json").is_file())
    cases = []
    for workdir in dirs:
        print(f"== {workdir.name}", flush=True)
        cases.append(score_case(workdir, args.base_model, budgets, fixed))
    check = None
    if args.real_check:
        scratch = Path(args.cases) / f".projection-check-{args.real_check}"
        check = real_check(Path(args.cases) / args.real_check, args.base_model, budgets[len(budgets) // 2], scratch)
        print(f"  real check: {check}", flush=True)
    summary = summarize(cases)
    command = "python bench/projection.py " + " ".join(argv if argv is not None else sys.argv[1:])
    environment = {"python": platform.python_version(), "platform": platform.platform(), "cores": "2 (shared)"}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"command": command, "environment": environment, "summary": summary,
                                                    "cases": cases, "real_check": check}, indent=2) + "\n")
    text = markdown(summary, cases, check, command)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
