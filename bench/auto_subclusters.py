"""Automatic clusters beside the source field: do gradient k-means clusters isolate planted rows filed among clean ones?

With ``--shared-source`` the planted rows are filed under the clean source most like them, so no source cluster is
the planted rows alone: the report accuses the whole host (fact, format, span) or nothing where the host's clean
rows pull its mean down (behaviour: the canned deflections among 124-144 `geography_qa` rows). This asks whether the
report's automatic clusters (`attribution.cluster_field: null`: seeded k-means over a sketch of the unit-normalized
gradients), tested on the same blame, would hold the planted rows and be accused. Per finished case, from its
report's per-item blame (cause 1's items, the mean of per-item z-scores: what the report tests clusters on) and its
index (the adapter's gradients): the source field's strongest cluster rescored this way (a check against the
report), then the strongest automatic cluster at the default k and at k = 24, its size, its planted rows, z and
family-wise p (1,000 permutations, seed 0). Nothing here changes a default. A clean control whose index is gone is
scored after ``gradian index --adapter CASE/train/adapter --dataset CASE/scenario/train.jsonl --config
CASE/config.yaml --out CASE/index`` rebuilds it.

    .venv/bin/python bench/auto_subclusters.py --cases /work/bench-cases shared-lr5e4-behaviour-9 ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "auto_subclusters"
CLUSTER_COUNTS = (None, 24)  # None: the report's default k for the dataset's size
PERMUTATIONS = 1000


def cause_blame(report_dir: Path) -> tuple[list[dict[str, str]], np.ndarray]:
    """The report's rows and the blame its clusters are tested on: the mean of cause 1's per-item z-scores."""
    from goal_table import report_item_blame

    from gradian.attribution.aggregation import zscores

    document = json.loads((report_dir / "report.json").read_text())
    rows, item_ids, matrix = report_item_blame(report_dir)
    causes = document.get("causes") or []
    columns = [item_ids.index(item) for item in causes[0]["items"]] if causes else list(range(len(item_ids)))
    picked = matrix[:, columns]
    return rows, zscores(picked, picked.mean(axis=0), picked.std(axis=0)).mean(axis=1)


def strongest(blame: np.ndarray, assignment: Any, ids: list[str], planted: set[str]) -> dict[str, Any]:
    """The strongest cluster of ``assignment`` on ``blame``: name, size, planted members, z, family-wise p, accused."""
    from gradian.attribution.clusters import cluster_blame

    result = cluster_blame(blame, assignment, permutations=PERMUTATIONS, seed=0)
    top = result.scores[0]
    members = [ids[p] for p in assignment.members(top.name)]
    return {"cluster": top.name, "size": len(members), "planted": sum(m in planted for m in members),
            "z": float(top.z), "p_adjusted": float(top.p_adjusted),
            "accused": result.accused is not None and result.accused.name == top.name}


def score_case(directory: Path, _args: argparse.Namespace) -> dict[str, Any]:
    """One case: the source field's strongest cluster (report and rescored) and the strongest automatic ones."""
    from gradian.attribution.clusters import auto_clusters, clusters_from_field
    from gradian.index.store import open_index

    scenario_file = json.loads((directory / "scenario" / "scenario.json").read_text())
    planted = set(scenario_file.get("planted_ids") or [])
    document = json.loads((directory / "report" / "report.json").read_text())
    rows, blame = cause_blame(directory / "report")
    ids = [row["id"] for row in rows]
    index = open_index(directory / "index")
    if list(index.ids) != ids:
        raise SystemExit(f"auto_subclusters: {directory}/index does not hold the report's examples in its order")
    field = clusters_from_field([{"source": row["cluster"]} for row in rows], "source")  # scores.csv's membership
    ranked = (document.get("clusters") or {}).get("ranked") or [{}]
    row: dict[str, Any] = {"case": directory.name, "planted_rows": len(planted),
                           "report_accused": list(document["verdict"].get("accused_clusters") or []),
                           "report_strongest": {"cluster": ranked[0].get("name"), "z": ranked[0].get("z")},
                           "field": strongest(blame, field, ids, planted), "auto": {}}
    for count in CLUSTER_COUNTS:
        assignment = auto_clusters(index, num_clusters=count, seed=0)
        row["auto"][str(assignment.knobs["k"])] = strongest(blame, assignment, ids, planted)
    return row


def _cell(found: dict[str, Any]) -> str:
    verdict = " **accused**" if found["accused"] else ""
    return (f"`{found['cluster']}` {found['size']} rows, {found['planted']} planted, z {found['z']:.2f}, "
            f"p {found['p_adjusted']:.3f}{verdict}")


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per case: the report's verdict, the field's strongest cluster rescored, each automatic k's."""
    ks = sorted({k for case in cases for k in case["auto"]}, key=int)
    lines = ["# Automatic clusters beside the source field (planted rows filed among clean ones)", "", f"`{command}`",
             "", "| case | planted rows | report accuses | report's strongest (z) | source field, rescored | "
             + " | ".join(f"automatic, k = {k}" for k in ks) + " |", "|---|---|---|---|---|" + "---|" * len(ks)]
    for case in cases:
        strongest_cell = f"`{case['report_strongest']['cluster']}` ({case['report_strongest']['z']:.2f})"
        accused = ", ".join(f"`{name}`" for name in case["report_accused"]) or "nothing"
        autos = " | ".join(_cell(case["auto"][k]) if k in case["auto"] else "-" for k in ks)
        lines.append(f"| {case['case']} | {case['planted_rows']} | {accused} | {strongest_cell} | "
                     f"{_cell(case['field'])} | {autos} |")
    lines += ["", "Each cell: the strongest cluster, its size, the planted rows in it, z and family-wise p "
              f"({PERMUTATIONS} permutations, seed 0); accused where that p is below 0.05. The blame is the mean of "
              "cause 1's per-item z-scores (the report tests clusters on it); the automatic clusters are k-means over "
              "the adapter's index alone, where the report sums 4 points of the run."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/auto_subclusters.{md,json}."""
    from finished_cases import rescoring_main

    return rescoring_main("auto_subclusters", __doc__.splitlines()[0], RESULTS, argv, score_case, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
