"""The Kronecker preconditioner against the diagonal, on exact and on projected indexes (issue 12's method 4).

Per LoRA matrix the second moment of its gradient G (rows x cols) is fitted as a Kronecker product of a row-side
L = E[G G^T] / cols and a column-side R = E[G^T G] / rows (the empirical Fisher's Kronecker factors, estimated
from gradients as Shampoo does), full on the rank side (r x r) and diagonal on the wide side, from the 64 rows a
build samples (``attribution.preconditioner: kronecker``, gradian/grads/whitening.py). Every variant here runs the
shipped code on a finished accuracy case with the default query signal and mean aggregation:

  diagonal, exact          diag(1 / (E[g^2] + lambda)) from every stored row (the exact index's diagonal)
  kronecker, exact         the fit applied to the query at scoring time (P = T^2 on each side)
  diagonal, auto 262,144   rows and queries scaled by the factored diagonal, then sketched (a projected build)
  kronecker, auto 262,144  rows and queries through the Kronecker transforms, then sketched

A projected variant is computed from the exact rows: the capture's transform-then-sketch is linear in G, so
applying it to the stored exact gradient equals doing it at capture time (bench/projection.py checks this against
a real build).

    .venv/bin/python bench/kronecker.py --cases /work/bench-cases fact-0 fact-1 format-0 span-0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy, accuracy_methods, projection next to this file

RESULTS = Path(__file__).resolve().parent / "results" / "kronecker"
KINDS = ("diagonal", "kronecker")


def score_case(workdir: Path, base_model: str, signal: str, budget: int) -> dict[str, Any]:
    """recall@k and AUPRC of each variant on one case."""
    from accuracy_methods import load_case, preconditioner, query
    from projection import exact_config, sketcher, spearman, variant_rows

    from gradian.attribution.index_statistics import sample_moments
    from gradian.attribution.scoring import ArraySource, score_examples
    from gradian.demo.run import reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.grads.projection import plan_auto_projection
    from gradian.grads.whitening import SCHEMES
    from gradian.report.reader import read_report

    kind, seed = workdir.name.rsplit("-", 1)
    scenario = make_scenario(kind, int(seed))
    report = read_report(workdir / "report")
    config = exact_config(scenario)
    case = load_case(workdir, base_model, config, report)
    queries = query(case, signal).astype(np.float32)
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, report))
    attribution = config.attribution

    out: dict[str, Any] = {"case": workdir.name, "signal": signal, "variants": {}}
    reference = None

    def measured(name: str, rows: Any, pq: np.ndarray) -> None:
        nonlocal reference
        blame = np.asarray(score_examples(rows, pq, aggregation="mean", top_k=20).blame)
        metrics = truth.score(blame)
        reference = blame if reference is None else reference
        out["variants"][name] = {"recall_at_k": metrics["recall_at_k"], "auprc": metrics["auprc"],
                                 "spearman_vs_exact_diagonal": spearman(blame, reference)}

    for kind_name in KINDS:  # exact: the index streamed as it is, the preconditioner on the query
        measured(f"{kind_name}, exact", case.index, preconditioner(case, kind_name).apply(queries))
    plan = plan_auto_projection(case.capture.blocks, config.grads.seed, budget)
    # The sample's moments once, as the shipped kronecker preconditioner reads them; each scheme is a fit of them.
    moments = sample_moments(case.index, attribution.chunk_bytes)
    for kind_name in KINDS:  # projected: transformed before the sketch, P = I after
        whitening = moments.whitening(damping=attribution.damping, damping_ratio=attribution.damping_ratio,
                                      scheme=SCHEMES[kind_name])
        sketch = sketcher(case.capture, plan, whitening)
        measured(f"{kind_name}, auto {budget:,}", ArraySource(variant_rows(case.index, sketch, "float16")),
                 sketch(queries).astype(np.float64))
    print(f"  {workdir.name}: " + "; ".join(f"{name} {m['recall_at_k']:.2f} / {m['auprc']:.2f}"
                                             for name, m in out["variants"].items()), flush=True)
    return out


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """recall@k / AUPRC per case and variant, and the mean."""
    variants = list(cases[0]["variants"]) if cases else []
    lines = ["# The Kronecker preconditioner against the diagonal (tuning seeds)", "", f"`{command}`", "",
             f"The {cases[0]['signal'] if cases else '-'} query signal, mean of item z-scores; recall@k / AUPRC; "
             "\"exact\" streams the float32 index, \"auto\" sketches rows and queries as a projected build does "
             "(float16 rows).", "",
             "| case | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    for case in cases:
        lines.append(f"| {case['case']} | " + " | ".join(
            f"{case['variants'][v]['recall_at_k']:.2f} / {case['variants'][v]['auprc']:.2f}" for v in variants) + " |")
    lines.append("| **mean** | " + " | ".join(
        f"**{np.mean([c['variants'][v]['recall_at_k'] for c in cases]):.3f} / "
        f"{np.mean([c['variants'][v]['auprc'] for c in cases]):.3f}**" for v in variants) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/kronecker.json and .md."""
    from finished_cases import rescoring_main

    from gradian.grads.projection import AUTO_BUDGET

    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--signal", default="divergent-token")
        parser.add_argument("--budget", type=int, default=AUTO_BUDGET, help="the projected variants' auto budget")

    return rescoring_main("kronecker", __doc__.splitlines()[0], RESULTS, argv,
                          lambda workdir, args: score_case(workdir, args.base_model, args.signal, args.budget),
                          markdown, arguments)


if __name__ == "__main__":
    raise SystemExit(main())
