"""Two ways to re-rank a finished report's examples, measured before either is built into the product.

Both start from the report's own blame (scores.csv: the shipped defaults, smooth_max over the regressed items and
summed over the checkpoints) and mix a second score into it, each side centred and scaled to unit norm:

- feedback (pseudo-relevance feedback): a row's mean cosine similarity, at the final adapter, to the report's top
  ``m`` rows (itself left out), so rows whose gradients look like the accused ones rise. ``raw`` is the cosine of
  the index rows; ``kfac`` the cosine under the report's own kronecker preconditioner (g_i P g_j).
- hidden: hidden-state cosine (bench/accuracy_methods.py: mean-pooled last hidden states, the regressed items'
  prompt + fine-tuned output against every training row), which beat the report on some format and behaviour
  cases in bench/results/heldout_methods.md.

The mix is (1 - w) x unit(report) + w x unit(second). Rule, written before scoring: keep a mix only if it lifts the
tuning cases' mean recall@k by 0.05 with no tuning case 0.05 lower.

    OMP_NUM_THREADS=1 .venv/bin/python bench/ranking_mixes.py --cases /work/bench-cases rank-lr5e4-fact-0 ...
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "ranking_mixes"
FEEDBACK = ((5, 0.25), (10, 0.25), (20, 0.25), (20, 0.5))  # (top rows m, share w)
HIDDEN = (0.2, 0.3, 0.5)


def unit(scores: np.ndarray) -> np.ndarray:
    """Centred and scaled to unit norm, so two scores on different scales mix by their shares."""
    centred = np.asarray(scores, dtype=np.float64) - np.mean(scores)
    norm = float(np.linalg.norm(centred))
    return centred / norm if norm > 0 else centred


def gram(rows: np.ndarray, pre: Any | None = None) -> np.ndarray:
    """G G^T of the index rows [n, dim] (float32), or G P G^T under a fitted preconditioner ``pre``."""
    if pre is None:
        return (rows @ rows.T).astype(np.float64)
    out = np.zeros((len(rows), len(rows)))
    for start in range(0, len(rows), 16):  # a float64 copy of 16 rows at a time
        out[start:start + 16] = pre.apply(rows[start:start + 16].astype(np.float64)).astype(np.float32) @ rows.T
    return out


def mix(blame: np.ndarray, second: np.ndarray, share: float) -> np.ndarray:
    """(1 - share) x unit(blame) + share x unit(second)."""
    return (1 - share) * unit(blame) + share * unit(second)


def feedback(blame: np.ndarray, products: np.ndarray, top: int) -> np.ndarray:
    """Each row's mean cosine to the ``top`` most blamed rows, itself left out."""
    norms = np.sqrt(np.clip(np.diag(products), 1e-30, None))
    cosine = products / norms[:, None] / norms[None, :]
    np.fill_diagonal(cosine, 0.0)
    chosen = np.zeros(len(blame))
    chosen[np.argsort(-blame, kind="stable")[:top]] = 1.0
    return (cosine @ chosen) / np.maximum(chosen.sum() - chosen, 1.0)


def score_case(directory: Path, base_model: str) -> dict[str, Any]:
    """recall@k / AUPRC of the report's ranking and of every mix on one case."""
    from accuracy_methods import hidden_cosine_blame, load_case
    from finished_cases import planted_case, score_rankings
    from goal_table import report_item_blame

    from gradian.attribution.index_statistics import index_statistics
    from gradian.attribution.preconditioners import fit_preconditioner
    from gradian.config import load_config

    row, report, truth = planted_case(directory)
    if truth is None:
        return row
    blame = np.array([float(r["blame"]) for r in report_item_blame(directory / "report")[0]])
    case = load_case(directory, base_model, load_config(directory / "config.yaml"), report)
    scored = {"report": blame}
    # read once for both Gram matrices: 400 x 2.4M float32 is 3.9 GB
    rows = np.asarray(case.index.rows_between(0, case.index.num_examples), dtype=np.float32)
    kronecker = fit_preconditioner("kronecker", index_statistics(case.index, "kronecker"))  # as the report fitted it
    for name, pre in (("raw", None), ("kfac", kronecker)):
        products = gram(rows, pre)
        for top, share in FEEDBACK:
            scored[f"feedback {name} m{top} w{share}"] = mix(blame, feedback(blame, products, top), share)
    hidden = hidden_cosine_blame(case)
    for share in HIDDEN:
        scored[f"hidden w{share}"] = mix(blame, hidden, share)
    score_rankings(row, truth, scored)
    print(f"  {directory.name}: " + ", ".join(f"{n} {m['recall_at_k']:.2f}" for n, m in row["methods"].items()),
          flush=True)
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per mix, one column per case, then the tuning and held-out means of recall@k."""
    from finished_cases import rankings_table

    return rankings_table("Re-ranking a report's examples: feedback and hidden-state mixes (recall@k)", "mix",
                          cases, command)


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/ranking_mixes.json and .md."""
    from finished_cases import indexed_case_main

    return indexed_case_main("ranking_mixes", __doc__.splitlines()[0], RESULTS, argv, score_case, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
