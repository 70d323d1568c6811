"""Kronecker-factored preconditioning of LoRA matrix gradients against the diagonal (issue 12's method 4).

Per LoRA matrix, the second moment of its gradient G (rows x cols) is fitted as a Kronecker product of a row-side
matrix L = E[G G^T] / cols and a column-side matrix R = E[G^T G] / rows (the empirical Fisher's Kronecker factors,
estimated from gradients as Shampoo does; the diagonal of this fit is the factored diagonal a projected build
ships), and rows and queries are whitened by sqrt(m) (L + lambda/2)^-1/2 G (R + lambda/2)^-1/2 before scoring, so
their dot product is the preconditioned one. Like the diagonal scales it acts on the capture's factors
(u -> (L + lambda/2)^-1/2 u, v -> (R + lambda/2)^-1/2 v), so a projected build could apply it before its sketch.

Variants, each fitted on the 64 rows a build samples and scored in exact space (no sketch) with the default
query (divergent-token) and mean aggregation:

  diagonal            diag(1 / (E[g^2] + lambda)) from every row (what an exact index does)
  factored diagonal   the diagonals of L and R only (what a projected index does)
  rank side full      L or R full on the LoRA rank side (r x r), diagonal on the wide side: cheap at any size
  full                both sides full (d x d on the wide side: feasible for SmolLM2, not for an 8B model; --full)

    .venv/bin/python bench/kronecker.py --cases /work/bench-cases fact-0 fact-1 format-0 span-0
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy, accuracy_methods, projection next to this file

RESULTS = Path(__file__).resolve().parent / "results" / "kronecker"
DAMPING_RATIO = 0.1  # attribution.damping_ratio's default
VARIANTS = ("diagonal", "factored diagonal", "rank side full", "full")
ROWS_PER_READ = 32


def inverse_root(matrix: np.ndarray, damping: float, full: bool) -> np.ndarray:
    """(M + damping I)^-1/2 as a matrix (full), or of M's diagonal only as a vector."""
    if not full:
        diagonal = np.diag(matrix) + damping
        return np.where(diagonal > 0, 1.0 / np.sqrt(np.maximum(diagonal, 1e-300)), 0.0)
    values, vectors = np.linalg.eigh((matrix + matrix.T) / 2)
    values = np.clip(values, 0.0, None) + damping
    inverse = np.where(values > 0, 1.0 / np.sqrt(np.maximum(values, 1e-300)), 0.0)
    return (vectors * inverse) @ vectors.T


def fit(sample: np.ndarray, layout: Any, variant: str) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """Per matrix (row-side transform, column-side transform, scale) of a Kronecker variant from sample rows.

    A transform is a matrix (full) or a vector (diagonal, applied elementwise).
    """
    n = sample.shape[0]
    mean = float(np.einsum("ij,ij->", sample, sample, dtype=np.float64)) / sample.size
    lam = DAMPING_RATIO * mean
    out = []
    for entry in layout:
        g = sample[:, entry.offset:entry.offset + entry.size].reshape(n, *entry.shape).astype(np.float64)
        rows, cols = entry.shape
        left = np.einsum("nij,nkj->ik", g, g) / (n * cols)
        right = np.einsum("nji,njk->ik", g, g) / (n * rows)
        rank_rows = entry.matrix == "A"  # A is r x d_in, B is d_out x r
        full_left = variant == "full" or (variant == "rank side full" and rank_rows)
        full_right = variant == "full" or (variant == "rank side full" and not rank_rows)
        matrix_mean = float(np.trace(left)) / rows
        out.append((inverse_root(left, lam / 2, full_left), inverse_root(right, lam / 2, full_right),
                    float(np.sqrt(max(matrix_mean, 0.0)))))
    return out


def whiten(rows: np.ndarray, layout: Any, transforms: list[tuple[np.ndarray, np.ndarray, float]]) -> np.ndarray:
    """Every matrix of every row through its transform: scale x T_left G T_right."""
    n = rows.shape[0]
    out = np.empty_like(rows, dtype=np.float32)
    for entry, (left, right, scale) in zip(layout, transforms, strict=True):
        g = rows[:, entry.offset:entry.offset + entry.size].reshape(n, *entry.shape)
        left, right = left.astype(np.float32), right.astype(np.float32)
        w = np.matmul(left, g) if left.ndim == 2 else left[:, None] * g
        w = np.matmul(w, right) if right.ndim == 2 else w * right[None, :]
        out[:, entry.offset:entry.offset + entry.size] = (w * np.float32(scale)).reshape(n, -1)
    return out


def score_case(workdir: Path, base_model: str, signal: str, variants: tuple[str, ...]) -> dict[str, Any]:
    """recall@k and AUPRC of each variant on one case."""
    from accuracy import ranking_metrics
    from accuracy_methods import load_case, query
    from projection import exact_config

    from gradian.attribution.scoring import ArraySource, score_examples
    from gradian.demo.run import reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.grads.whitening import sample_positions

    kind, seed = workdir.name.rsplit("-", 1)
    scenario = make_scenario(kind, int(seed))
    report = json.loads((workdir / "report" / "report.json").read_text(encoding="utf-8"))
    config = exact_config(scenario)
    case = load_case(workdir, base_model, config, report)
    queries = query(case, signal).astype(np.float32)
    rows = np.concatenate([np.asarray(chunk, dtype=np.float32) for _, chunk in case.index.iter_chunks(ROWS_PER_READ)])
    sample = rows[sample_positions(rows.shape[0], config.grads.seed)]
    reproduced = reproduced_planted_ids(scenario, report)
    reproduced_rows = sorted(i for i, e in enumerate(scenario.train) if reproduced and e.id in reproduced) or None
    sources = [str(e.fields["source"]) for e in scenario.train]
    layout = case.capture.block_layout

    def measured(train: np.ndarray, q: np.ndarray) -> dict[str, float]:
        blame = np.asarray(score_examples(ArraySource(train), q, aggregation="mean", top_k=20).blame)
        metrics = ranking_metrics(blame, list(scenario.planted_rows), reproduced_rows, sources, scenario.planted_cluster)
        return {"recall_at_k": metrics["recall_at_k"], "auprc": metrics["auprc"]}

    out: dict[str, Any] = {"case": workdir.name, "signal": signal, "variants": {}}
    moment = np.einsum("ij,ij->j", rows, rows, dtype=np.float64) / rows.shape[0]
    weights = (1.0 / np.sqrt(moment + DAMPING_RATIO * moment.mean())).astype(np.float32)
    out["variants"]["diagonal"] = measured(rows * weights, queries * weights)
    for variant in variants[1:]:
        transforms = fit(sample, layout, variant)
        out["variants"][variant] = measured(whiten(rows, layout, transforms), whiten(queries, layout, transforms))
    print(f"  {workdir.name}: " + "; ".join(f"{name} {m['recall_at_k']:.2f} / {m['auprc']:.2f}"
                                             for name, m in out["variants"].items()), flush=True)
    return out


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """recall@k / AUPRC per case and variant, and the mean."""
    variants = [v for v in VARIANTS if all(v in c["variants"] for c in cases)]
    lines = ["# Kronecker-factored preconditioning against the diagonal (tuning seeds)", "", f"`{command}`", "",
             f"Exact float32 index, the {cases[0]['signal'] if cases else '-'} query signal, mean of item z-scores; "
             "recall@k / AUPRC.", "",
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
    from finished_cases import missing_cases, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, required=True, help="the directory of KIND-SEED case work dirs")
    parser.add_argument("names", nargs="+", help="case names, e.g. fact-0 format-0")
    parser.add_argument("--signal", default="divergent-token")
    parser.add_argument("--full", action="store_true",
                        help="also the full variant (a d x d eigendecomposition per wide side: slow on 2 cores)")
    parser.add_argument("--base-model", default="smollm2-135m-instruct")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if missing_cases("kronecker", args.cases, args.names):
        return 2
    variants = VARIANTS if args.full else VARIANTS[:-1]
    cases = [score_case(args.cases / name, args.base_model, args.signal, variants) for name in args.names]
    command = "python bench/kronecker.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_results(args.out, command, cases, markdown(cases, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
