"""Other ways to combine the regressed items' blame into one ranking, beside the shipped weighted soft maximum.

Written after bench/misses.py showed span's Australia profiles top on their own item and 25th overall (that item's
blame is shared by other poisoned profiles, so its kurtosis weight is small). Per finished case, from the report's
saved per-item blame (no index read), recall@k of:

- shipped: the soft maximum of the item-standardized blame, items weighed by their kurtosis (the default);
- kurtosis^p: the same with each weight raised to p (0 is equal weights, 1 the default);
- soft max T: the shipped ranking at another temperature;
- rrf c, equal / kurtosis: reciprocal rank fusion over items, the sum of w / (c + the row's rank on the item);
- best rank: the row's best rank over the items (the shipped score breaks ties).

Each cause of a split report is scored on its own items, as bench/goal_table.py does. Scored on the tuning cases
only (seeds 0-2); a variant would need +0.03 on their mean, none lower by more than 0.05, to be tried held out.

    .venv/bin/python bench/item_fusion.py --cases /work/bench-cases rank-lr5e4-fact-0 rank-lr5e4-span-0 ...
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "item_fusion"


def weighted_soft_max(matrix: np.ndarray, power: float = 1.0, temperature: float = 2.0) -> np.ndarray:
    """The shipped ranking's score with the kurtosis weights raised to ``power``, at ``temperature``."""
    from gradian.attribution.aggregation import kurtosis_weights, smooth_max_zscore

    weights = kurtosis_weights(matrix) ** power
    return smooth_max_zscore(matrix, matrix.mean(axis=0), matrix.std(axis=0), weights, temperature=temperature)


def item_ranks(matrix: np.ndarray) -> np.ndarray:
    """Each row's 1-based rank on each item, 1 = most blamed (ties: the earlier row first)."""
    from gradian.attribution.aggregation import ranks_of

    return np.stack([ranks_of(matrix[:, column]) for column in range(matrix.shape[1])], axis=1)


def reciprocal_rank_fusion(matrix: np.ndarray, c: float, kurtosis: bool) -> np.ndarray:
    """The sum over items of weight / (c + rank), the weights equal or the kurtosis of each item's blame."""
    from gradian.attribution.aggregation import kurtosis_weights

    weights = kurtosis_weights(matrix) if kurtosis else np.ones(matrix.shape[1])
    return (weights / (c + item_ranks(matrix))).sum(axis=1)


def best_rank(matrix: np.ndarray) -> np.ndarray:
    """Minus the row's best rank over the items, the shipped score (below one rank step) breaking ties."""
    shipped = weighted_soft_max(matrix)
    spread = np.ptp(shipped) or 1.0
    return -item_ranks(matrix).min(axis=1) + 0.5 * (shipped - shipped.min()) / spread


VARIANTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "shipped": weighted_soft_max,
    **{f"kurtosis^{p:g}": (lambda m, p=p: weighted_soft_max(m, power=p)) for p in (0.0, 0.5, 1.5, 2.0)},
    **{f"soft max T {t:g}": (lambda m, t=t: weighted_soft_max(m, temperature=t)) for t in (1.0, 4.0)},
    **{f"rrf {c}, {name}": (lambda m, c=c, k=k: reciprocal_rank_fusion(m, c, k))
       for c in (5, 20, 60) for name, k in (("equal", False), ("kurtosis", True))},
    "best rank": best_rank,
}


def score_case(directory: Path, args: Any) -> dict[str, Any]:
    """One case's recall@k under every variant."""
    from finished_cases import planted_case
    from goal_table import case_name, report_item_blame, score_by_cause

    from gradian.demo.scenarios import make_scenario

    row, _, truth = planted_case(directory)
    if truth is None:
        return row
    scenario = make_scenario(*case_name(directory))
    document = json.loads((directory / "report" / "report.json").read_text())
    _, item_ids, matrix = report_item_blame(directory / "report")  # read once, for every variant
    for name, combine in VARIANTS.items():
        metrics = score_by_cause(document, item_ids, scenario, truth,
                                 lambda columns, _accused, combine=combine: combine(matrix[:, columns]))
        row["methods"][name] = {"recall_at_k": metrics["recall_at_k"]}
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per variant, one column per case, the tuning and held-out means."""
    from finished_cases import rankings_table

    return rankings_table("Combining the items' blame other ways (recall@k)", "ranking", cases, command)


def main(argv: list[str] | None = None) -> int:
    """Score each named case (carrying the earlier row of one whose work dir is gone), print and write the table."""
    from finished_cases import carrying_main

    return carrying_main("item_fusion", __doc__.splitlines()[0], RESULTS, argv,
                         lambda case: (case / "report" / "scores.csv").is_file(), score_case, markdown)


if __name__ == "__main__":
    sys.exit(main())
