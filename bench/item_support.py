"""Ranking a cause's examples only by the items that point at its accused cluster (not shipped: it lost on span-0).

An item the learning rate broke can sit in a cause whose accused cluster does not explain it: on the held-out
two-causes-5, "What color are strawberries?" and "What shape has four equal sides?" (answered in French) sit with
the wrong capitals and bring geography rows into that cause's top 20. Per finished case, from the report's saved
per-item blame (no index read): the shipped ranking (kurtosis item weights), and the same over only the items whose
z-scored blame averages above zero over the accused cluster's rows (every item where none does).

Rule, written after looking at two-causes-5 and before scoring the tuning cases: ship it if the tuning mean
recall@k does not fall, one tuning case rises and none falls by more than 0.02. Held-out cases are reported.

    .venv/bin/python bench/item_support.py --cases /work/bench-cases rank-lr5e4-fact-0 rank-lr5e4-span-0 ...
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "item_support"


def supporting(matrix: np.ndarray, clusters: np.ndarray, columns: list[int], accused: list[str]) -> list[int]:
    """The columns whose z-scored blame averages above zero over the accused clusters' rows (all when none do)."""
    from gradian.attribution.causes import cluster_support

    support = cluster_support(matrix[:, columns], np.isin(clusters, accused))
    kept = [column for column, value in zip(columns, support, strict=True) if value > 0]
    return kept or columns


def score_case(directory: Path, args: Any) -> dict[str, Any]:
    """One case's recall@k / AUPRC with every item of each cause, and with its supporting items only."""
    from finished_cases import planted_case
    from goal_table import case_name
    from item_weights import ranking_scores

    from gradian.demo.scenarios import make_scenario

    row, _, truth = planted_case(directory)
    if truth is None:
        return row
    scenario = make_scenario(*case_name(directory))
    row["methods"]["every item (shipped)"] = ranking_scores(directory / "report", scenario, truth, "kurtosis")
    row["methods"]["supporting items"] = ranking_scores(directory / "report", scenario, truth, "kurtosis", supporting)
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per item selection, one column per case, the tuning and held-out means."""
    from finished_cases import rankings_table

    return rankings_table("A cause's ranking over the items that point at its accused cluster (recall@k)",
                          "items ranked by", cases, command)


def main(argv: list[str] | None = None) -> int:
    """Score each named case (carrying the earlier row of one whose work dir is gone), print and write the table."""
    from finished_cases import carrying_main

    return carrying_main("item_support", __doc__.splitlines()[0], RESULTS, argv,
                         lambda case: (case / "report" / "scores.csv").is_file(), score_case, markdown)


if __name__ == "__main__":
    sys.exit(main())
