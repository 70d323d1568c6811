"""How regressed items' blame combines into one score per example, compared on finished demo cases.

Each case's report saves every example's blame toward every regressed item (scores.csv's ``item:`` columns, summed
over the checkpoint ensemble). This re-aggregates those columns offline, so every variant ranks the same numbers:

- mean: the mean over items of the item-standardized blame (the shipped ``attribution.aggregation: mean``; it
  reproduces the report's own ranking where the report kept its items as one cause; where it split them, as on the
  tests' tiny case, the report ranks by its causes and this pools every item: 0.05 against the report's 0.00 there);
- harm: the mean over items of the positive part of the standardized blame, so what a row did to one regressed
  item is not offset by its help on another;
- max: the largest standardized blame over items (LESS scores a row by its best-matching target task);
- rank_vote: the mean rank over items, as ``attribution.aggregation: rank_vote``;
- clip3: the mean of the standardized blame clipped to [-3, 3];
- top2: the mean of a row's two largest standardized blames, max with one item's noise averaged away;
- smooth_max: a soft maximum, 2 log mean exp(z / 2): the mean as its temperature grows, the max as it shrinks
  (written down as ``lse2`` before any case was scored with it; now ``attribution.aggregation: smooth_max``);
- rrf: reciprocal rank fusion of the mean's and the max's rankings (1 / (60 + rank), summed), the IR way to join two
  rankings whose scores are on different scales.

Each case also gets its items' agreement: the mean correlation between two regressed items' standardized blame over
the examples. One cluster that answers every item (behaviour) should show high agreement, one planted row per item
(rare) low; if so, agreement could choose between the mean and the max.

Metrics against the planted rows: recall@k (k = the planted rows) and AUPRC, over all regressed items pooled.

    .venv/bin/python bench/aggregation.py --cases /work/bench-cases lr5e4-fact-0 lr5e4-format-0 ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "aggregation"


def variants(blame: np.ndarray) -> dict[str, np.ndarray]:
    """One score per example under each aggregation, from the report's per-item blame [examples, items]."""
    from gradian.attribution.aggregation import average_ranks, harm_zscore, mean_zscore, smooth_max_zscore, zscores

    mean, std = blame.mean(axis=0), blame.std(axis=0)
    z = zscores(blame, mean, std)
    ranks = np.column_stack([average_ranks(blame[:, item]) for item in range(blame.shape[1])])
    mean_z, max_z = mean_zscore(blame, mean, std), z.max(axis=1)
    top2 = np.sort(z, axis=1)[:, -2:].mean(axis=1)
    rrf = 1.0 / (60.0 + average_ranks(mean_z)) + 1.0 / (60.0 + average_ranks(max_z))
    return {"mean": mean_z, "harm": harm_zscore(blame, mean, std), "max": max_z,
            "rank_vote": -ranks.mean(axis=1), "clip3": np.clip(z, -3.0, 3.0).mean(axis=1), "top2": top2,
            "smooth_max": smooth_max_zscore(blame, mean, std), "rrf": rrf}


def agreement(blame: np.ndarray) -> float:
    """The mean correlation over pairs of regressed items of their blame across the examples (nan under 2 items)."""
    if blame.shape[1] < 2:
        return float("nan")
    corr = np.corrcoef(blame, rowvar=False)
    return float(np.nanmean(corr[np.triu_indices_from(corr, k=1)]))  # an item with no spread has no correlation


def score_case(directory: Path) -> dict[str, Any]:
    """recall@k / AUPRC of every variant on one case."""
    from finished_cases import planted_case, score_rankings
    from goal_table import report_item_blame

    row, _, truth = planted_case(directory)
    if truth is None:
        return row
    blame = report_item_blame(directory / "report")[2]
    row["items"] = int(blame.shape[1])
    row["agreement"] = agreement(blame)
    score_rankings(row, truth, variants(blame))
    return row


def markdown(cases: list[dict[str, Any]], command: str, notes: list[str]) -> str:
    """The table: one row per case, one column per aggregation, then the means."""
    from finished_cases import carried_note

    names = ["mean", "harm", "max", "rank_vote", "clip3", "top2", "smooth_max", "rrf"]
    lines = ["# Aggregating the regressed items' blame (recall@k / AUPRC)", "", f"`{command}`", "",
             "| case | seed | items | agreement | " + " | ".join(names) + " |",
             "|---|---|---|---|" + "---|" * len(names)]
    scored = [case for case in cases if case["methods"]]
    for case in scored:
        cells = [_cell([case], name) for name in names]
        agreed = f"{case['agreement']:.2f}" if "agreement" in case else "-"
        lines.append(f"| {case['case']} | {case['seed']} | {case['items']} | {agreed} | " + " | ".join(cells) + " |")
    for label, chosen in (("tuning seeds 0-2", [c for c in scored if c["seed"] < 3]),
                          ("held-out seeds 3+", [c for c in scored if c["seed"] >= 3])):
        if chosen:
            cells = [_cell(chosen, name, digits=3) for name in names]
            lines.append(f"| **mean, {label}** | | {len(chosen)} cases | | " + " | ".join(cells) + " |")
    carried = carried_note(cases)
    if carried:
        notes = [*notes, carried]
    lines += ["", *[f"- {note}" for note in notes]] if notes else []
    return "\n".join(lines) + "\n"


def _cell(cases: list[dict[str, Any]], name: str, digits: int = 2) -> str:
    """recall@k / AUPRC of one variant, averaged over the cases scored with it; (n) where fewer than all were."""
    having = [case["methods"][name] for case in cases if name in case["methods"]]
    if not having:
        return "-"
    cell = (f"{np.mean([m['recall_at_k'] for m in having]):.{digits}f} / "
            f"{np.mean([m['auprc'] for m in having]):.{digits}f}")
    return cell if len(having) == len(cases) else f"{cell} ({len(having)})"


def main(argv: list[str] | None = None) -> int:
    """Score each named case (carrying the earlier row of one whose work dir is gone), print and write the table."""
    from finished_cases import command_line, scored_or_carried, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, required=True)
    parser.add_argument("names", nargs="+")
    parser.add_argument("--note", action="append", default=[], help="a line under the table (repeatable)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    cases = scored_or_carried("aggregation", args, lambda case: (case / "report" / "scores.csv").is_file(),
                              score_case)
    if cases is None:
        return 2
    command = command_line("aggregation.py", argv)
    write_results(args.out, command, cases, markdown(cases, command, args.note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
