"""Weighing the regressed items in the ranking of examples by how few rows carry each item's blame.

A regression that training rows caused shows in its item's blame as a heavy tail: a few rows with z of 12-15 (the
span tuning case's poisoned capitals, kurtosis 70-170). An item the learning rate broke has no such rows (kurtosis
7-18), and its most blamed rows are whatever shares its topic; under equal weights, the smooth maximum lets those
rows in among the planted ones (span-0: clean profiles through "Kuala Philipp" and "Ljubica"; format-0: science
explanations through "Humans need air to breathe."). Per finished case, from the report's saved per-item blame
(no index read), recall@k / AUPRC of the report's ranking (``attribution.ranking``) with every item weighed the
same, and with each item weighed by the kurtosis of its blame (``attribution.item_weights: kurtosis``). Where the
report split the regression into causes, each planted cluster is scored in the ranking of the cause that accuses
it, over that cause's items, weighted by its rows (as bench/goal_table.py does).

Rule, written after looking at span-0 and format-0 only: make kurtosis the default if over the tuning cases
(seeds 0-2) mean recall@k rises by >= 0.03 and no case drops by more than 0.05; the held-out seeds 3-5 are reported
as they fall.

    .venv/bin/python bench/item_weights.py --cases /work/bench-cases rank-lr5e4-span-0 rank-lr5e4-format-0 ...
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "item_weights"
WEIGHTS = ("uniform", "kurtosis")


# (per-item blame [rows, items], each row's cluster, a cause's item columns, its accused clusters) -> columns kept
ItemSelection = Callable[[np.ndarray, np.ndarray, list[int], list[str]], list[int]]


def ranking_scores(report_dir: Path, scenario: Any, truth: Any, item_weights: str,
                   select: ItemSelection | None = None) -> dict[str, float]:
    """recall@k / AUPRC of the report's ranking rescored from its per-item blame with ``item_weights``, over the
    items ``select`` keeps of each cause (all of them by default)."""
    from goal_table import report_item_blame, report_ranking, score_by_cause

    from gradian.attribution.scoring import rescore_items

    document = json.loads((report_dir / "report.json").read_text())
    rows, item_ids, matrix = report_item_blame(report_dir)
    ids = [row["id"] for row in rows]
    clusters = np.array([row["cluster"] for row in rows])
    settings = document["provenance"]["config"]["attribution"]

    def blame(columns: list[int], accused: list[str]) -> Any:
        if select is not None and accused:
            columns = select(matrix, clusters, columns, accused)
        return rescore_items(matrix, ids, item_ids, columns, aggregation=report_ranking(settings),
                             normalize=settings["normalize"], item_weights=item_weights).blame

    return score_by_cause(document, item_ids, scenario, truth, blame)


def score_case(directory: Path, args: Any) -> dict[str, Any]:
    """One case's recall@k / AUPRC under each item weighting, beside the report's own ranking."""
    from finished_cases import planted_case
    from goal_table import case_name
    from goal_table import score_case as goal_row

    from gradian.demo.scenarios import make_scenario

    row, _, truth = planted_case(directory)
    if truth is None:
        return row
    scenario = make_scenario(*case_name(directory))
    goal = goal_row(directory)  # the report's own figure, as the goal table reads it: a check on the rescoring
    row["methods"]["report"] = {"recall_at_k": goal["recall_at_k"], "auprc": goal["auprc"]}
    for weights in WEIGHTS:
        row["methods"][weights] = ranking_scores(directory / "report", scenario, truth, weights)
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per weighting, one column per case, the tuning and held-out means."""
    from finished_cases import rankings_table

    return rankings_table("Items weighed by the kurtosis of their blame (recall@k)", "item weights", cases, command)


def main(argv: list[str] | None = None) -> int:
    """Score each named case (carrying the earlier row of one whose work dir is gone), print and write the table."""
    from finished_cases import carrying_main

    return carrying_main("item_weights", __doc__.splitlines()[0], RESULTS, argv,
                         lambda case: (case / "report" / "scores.csv").is_file(), score_case, markdown)


if __name__ == "__main__":
    sys.exit(main())
