"""The eval items that did not regress as a control query: does blame on them sharpen the ranking of the examples?

A row that moves every answer of the eval set (on fact cases, the correct capital rows that rank among the planted
ones) is not specific to the regression. This scores, at the final adapter, each row's per-item blame on the regressed
items (the report's query signal, ranked by smooth_max as the report ranks) and on the items that did not regress
(the classic signal: the loss of the wanted answer), and subtracts the control from the ranking, each side centred and
scaled to unit norm (bench/ranking_mixes.mix with the control negated):

- ``abs control``: the row's mean |z| over the control items, how hard it moves answers that did not change;
- ``signed control``: the row's mean z over them, signed (harm to the items that held up).

The checkpoints are left out, so the ``adapter alone`` row, not the report, is what each variant is measured against.
Rule (the project's: bench/ranking_mixes.py): keep a variant only if it lifts the tuning cases' mean recall@k by 0.05
with no tuning case 0.05 lower. A first probe of the ``abs control`` variant on the tuning cases came before this script.

    OMP_NUM_THREADS=1 .venv/bin/python bench/control_items.py --cases /work/bench-cases lr5e4-fact-0 ...
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "control_items"
SHARES = (0.2, 1 / 3, 0.5)  # the control's share of the mix: 1/4, 1/2 and 1 times the ranking's own scale


def split_items(items: list[Any]) -> tuple[list[Any], list[Any]]:
    """(the items the report queried: the regressed ones, or all when none regressed; the rest, the control)."""
    regressed = [item for item in items if item.regressed]
    if not regressed:
        return list(items), []
    return regressed, [item for item in items if not item.regressed]


def blame_on(case: Any, items: list[Any], signal: str) -> np.ndarray:
    """Per-item blame [examples, items] at the case's adapter, scored as `gradian attribute` scores a point."""
    from accuracy_methods import item_blame

    return item_blame(dataclasses.replace(case, items=tuple(items)), signal)


def column_z(blame: np.ndarray) -> np.ndarray:
    """Each item's blame z-scored over the examples, so every control item counts alike."""
    std = blame.std(axis=0)
    return (blame - blame.mean(axis=0)) / np.where(std > 0, std, 1.0)


def rankings(regressed: np.ndarray, control: np.ndarray) -> dict[str, np.ndarray]:
    """The adapter alone's smooth_max ranking and each variant with a control subtracted."""
    from ranking_mixes import mix

    from gradian.attribution.aggregation import smooth_max_zscore

    alone = smooth_max_zscore(regressed, regressed.mean(axis=0), regressed.std(axis=0))
    scored = {"adapter alone (smooth_max)": alone}
    for name, penalty in (("abs control", np.abs(column_z(control)).mean(axis=1)),
                          ("signed control", column_z(control).mean(axis=1))):
        for share in SHARES:
            scored[f"minus {name} at {share:.2f}"] = mix(alone, -penalty, share)
    return scored


def score_case(directory: Path, base_model: str) -> dict[str, Any]:
    """recall@k / AUPRC of the adapter alone's ranking and of every variant on one case."""
    from accuracy_methods import load_case, report_items
    from finished_cases import planted_case, score_rankings

    from gradian.config import load_config

    row, report, truth = planted_case(directory)
    if truth is None:
        return row
    queried, control = split_items(report_items(report))
    if not control:
        row["skipped"] = "no control: the report queried every eval item"
        return row
    case = load_case(directory, base_model, load_config(directory / "config.yaml"), report)
    signal = json.loads((directory / "report" / "report.json").read_text())["query_signal"]["effective"]
    row.update(regressed_items=len(queried), control_items=len(control))
    score_rankings(row, truth, rankings(blame_on(case, queried, signal), blame_on(case, control, "classic")))
    print(f"  {directory.name}: " + ", ".join(f"{n} {m['recall_at_k']:.2f}" for n, m in row["methods"].items()),
          flush=True)
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per ranking, one column per case, then the tuning and held-out means of recall@k."""
    from finished_cases import rankings_table

    return rankings_table("The eval items that did not regress as a control query (recall@k, the final adapter alone)",
                          "ranking", cases, command)


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/control_items.json and .md."""
    from finished_cases import indexed_case_main

    return indexed_case_main("control_items", __doc__.splitlines()[0], RESULTS, argv, score_case, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
