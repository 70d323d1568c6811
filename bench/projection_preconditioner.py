"""Where a projected index loses accuracy: sketch noise, or the diagonal preconditioner estimated after sketching.

On finished accuracy cases (exact float32 index, as bench/projection.py uses), the default scoring (contrastive
query, mean aggregation) is run with the diagonal preconditioner diag(1 / (E[g^2] + lambda)), lambda = 0.1 x the
mean of E[g^2], computed six ways, each against exact gradients:

  none                       no preconditioner: the sketch's noise alone
  sketch-space diagonal      what a projected index did before: E[g^2] of the sketched rows
  precondition, then sketch  rows and query scaled by 1/sqrt(E[g^2] + lambda) in exact space, then sketched
  exact-space query only     the query preconditioned in exact space, then sketched; rows sketched as stored
  64-row diagonal, then sketch   as "precondition, then sketch", E[g^2] from a seeded sample of 64 rows only
  64-row factored, then sketch   the same sample, E[g^2] fitted per matrix as row x column (what a build ships)

    .venv/bin/python bench/projection_preconditioner.py --cases /work/bench-cases fact-0 fact-1 format-0 span-0 \
        --budgets 262144
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # projection, accuracy next to this file

RESULTS = Path(__file__).resolve().parent / "results" / "projection_preconditioner"
DAMPING_RATIO = 0.1  # attribution.damping_ratio's default
ROWS_PER_SKETCH = 32
SAMPLE_ROWS = 64  # rows a build would see before it sketches


def _blame(rows: np.ndarray, queries: np.ndarray) -> np.ndarray:
    from gradian.attribution.scoring import ArraySource, score_examples

    return np.asarray(score_examples(ArraySource(rows), queries, aggregation="mean", top_k=20).blame, dtype=np.float64)


def _weights(rows: np.ndarray) -> np.ndarray:
    """1 / sqrt(E[g^2] + lambda) per coordinate: preconditioning both sides by it is the diagonal preconditioner."""
    moment = np.einsum("ij,ij->j", rows, rows, dtype=np.float64) / rows.shape[0]
    return (1.0 / np.sqrt(moment + DAMPING_RATIO * moment.mean())).astype(np.float32)


def _factored_weights(rows: np.ndarray, layout: Any) -> np.ndarray:
    """Per LoRA matrix, the rank-1 (row x column) fit of 1 / sqrt(E[g^2] + lambda) a build ships, as a flat vector."""
    from projection import whitening_of_rows

    whitening = whitening_of_rows(rows, layout, None, DAMPING_RATIO)
    return np.concatenate([np.outer(row_scale.numpy(), col_scale.numpy()).reshape(-1)
                           for row_scale, col_scale in whitening.scales]).astype(np.float32)


def _sample(rows: np.ndarray, count: int) -> np.ndarray:
    """A seeded sample of ``count`` rows: what a build sees before it sketches."""
    picked = np.sort(np.random.default_rng(0).choice(rows.shape[0], size=min(count, rows.shape[0]), replace=False))
    return rows[picked]


def _sketched(sketch: Any, rows: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
    """Every row (times ``scale`` when given) through ``sketch``, a few rows at a time."""
    return np.concatenate([sketch(rows[i:i + ROWS_PER_SKETCH] * (1 if scale is None else scale))
                           for i in range(0, rows.shape[0], ROWS_PER_SKETCH)])


def decompose(workdir: Path, budgets: list[int]) -> dict[str, Any]:
    """Recall@k, AUPRC and Spearman against exact of each way, at each auto budget, on one case."""
    from accuracy_methods import load_case, query
    from projection import exact_config, sketcher, spearman, variant_rows

    from gradian.demo.run import reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.grads.projection import plan_auto_projection
    from gradian.report.reader import read_report

    kind, seed = workdir.name.rsplit("-", 1)
    scenario = make_scenario(kind, int(seed))
    report = read_report(workdir / "report")
    config = exact_config(scenario)
    case = load_case(workdir, "smollm2-135m-instruct", config, report)
    queries = query(case, "contrastive").astype(np.float32)
    rows = variant_rows(case.index, None, "float32")
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, report))

    def measured(blame: np.ndarray, reference: np.ndarray) -> dict[str, float]:
        metrics = truth.score(blame)
        return {"recall_at_k": metrics["recall_at_k"], "auprc": metrics["auprc"],
                "spearman_vs_exact": spearman(blame, reference)}

    w = _weights(rows)
    exact_none, exact_diagonal = _blame(rows, queries), _blame(rows * w, queries * w)
    factored = _factored_weights(_sample(rows, SAMPLE_ROWS), case.capture.block_layout)
    exact_factored = _blame(rows * factored, queries * factored)
    out: dict[str, Any] = {"case": workdir.name, "exact": {"none": measured(exact_none, exact_none),
                                                           "diagonal": measured(exact_diagonal, exact_diagonal),
                                                           "factored": measured(exact_factored, exact_diagonal)}}
    for budget in budgets:
        sketch = sketcher(case.capture, plan_auto_projection(case.capture.blocks, config.grads.seed, budget))
        plain = _sketched(sketch, rows, None)
        ws = _weights(plain)
        ways = {"none": (_blame(plain, sketch(queries)), exact_none),
                "sketch-space diagonal": (_blame(plain * ws, sketch(queries) * ws), exact_diagonal),
                "exact-space query only": (_blame(plain, sketch(queries * w * w)), exact_diagonal)}
        del plain
        ways["precondition, then sketch"] = (_blame(_sketched(sketch, rows, w), sketch(queries * w)), exact_diagonal)
        sample = _sample(rows, SAMPLE_ROWS)
        ws = _weights(sample)
        ways[f"{SAMPLE_ROWS}-row diagonal, then sketch"] = (_blame(_sketched(sketch, rows, ws), sketch(queries * ws)),
                                                            exact_diagonal)
        wf = _factored_weights(sample, case.capture.block_layout)
        ways[f"{SAMPLE_ROWS}-row factored, then sketch"] = (_blame(_sketched(sketch, rows, wf), sketch(queries * wf)),
                                                            exact_diagonal)
        del sample
        out[f"auto {budget:,}"] = {name: measured(blame, reference) for name, (blame, reference) in ways.items()}
        print(f"  {workdir.name} auto {budget:,}: " + "; ".join(
            f"{name} {m['recall_at_k']:.2f} / {m['auprc']:.2f} / {m['spearman_vs_exact']:.3f}"
            for name, m in out[f"auto {budget:,}"].items()), flush=True)
    return out


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One table per case: recall@k / AUPRC / Spearman against exact with the same preconditioner."""
    lines = ["# Projected index: sketch noise against a preconditioner estimated after sketching", "", f"`{command}`", "",
             "recall@k / AUPRC / Spearman of blame against exact gradients scored the same way (no preconditioner "
             "for `none`, the exact-space diagonal for the others).", ""]
    for case in cases:
        widths = [key for key in case if key.startswith("auto")]
        ways = list(case[widths[0]]) if widths else []
        lines += [f"## {case['case']}", "",
                  f"exact: none {case['exact']['none']['recall_at_k']:.2f} / {case['exact']['none']['auprc']:.2f}, "
                  f"diagonal {case['exact']['diagonal']['recall_at_k']:.2f} / {case['exact']['diagonal']['auprc']:.2f}, "
                  f"{SAMPLE_ROWS}-row factored diagonal (unsketched) "
                  f"{case['exact']['factored']['recall_at_k']:.2f} / {case['exact']['factored']['auprc']:.2f} / "
                  f"{case['exact']['factored']['spearman_vs_exact']:.3f}",
                  "", "| width | " + " | ".join(ways) + " |", "|---|" + "---|" * len(ways)]
        for width in widths:
            lines.append(f"| {width} | " + " | ".join(
                f"{m['recall_at_k']:.2f} / {m['auprc']:.2f} / {m['spearman_vs_exact']:.3f}"
                for m in case[width].values()) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    """Decompose each named case and write the JSON and the markdown."""
    from finished_cases import missing_cases, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, required=True, help="the directory of KIND-SEED case work dirs")
    parser.add_argument("names", nargs="+", help="case names, e.g. fact-0 format-0")
    parser.add_argument("--budgets", default="262144,1048576")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if missing_cases("projection_preconditioner", args.cases, args.names):
        return 2
    budgets = [int(b) for b in args.budgets.split(",")]
    cases = [decompose(args.cases / name, budgets) for name in args.names]
    command = "python bench/projection_preconditioner.py " + " ".join(sys.argv[1:])
    write_results(args.out, command, cases, markdown(cases, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
