"""Other cluster tests on the blame the shipped one reads: would any accuse the planted host and no clean control?

With the planted rows filed under a clean source (``--shared-source``, and span always), the report accuses the host
only where its mean blame stands out over the host's clean rows. Each finished case's scores.csv keeps the per-item
blame its clusters were tested on (its ``tested:`` columns where ``evaluation.accusation_weight`` differs from the
ranking's weight, else its ``item:`` columns). Aggregated over every item as the report does (the causes' groups and
the jackknife left out), three tests give each source cluster a family-wise p:

- ``mean``: the shipped permutation test of the cluster's mean blame (max-z over the clusters), before the jackknife;
- ``ranks``: the same test on the blame's ranks, so a few heavy-tailed rows cannot carry it;
- ``top-k``: the cluster's rows among the k most blamed (k = ``attribution.top_k``), hypergeometric, Bonferroni over
  the clusters: an accusation the planted rows' lead in the ranking alone could make.

Nothing here changes a default; it reads reports only.

    .venv/bin/python bench/cluster_tests.py --cases /work/bench-cases r1a-lr5e4-span-13 r1a-clean-7 ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "cluster_tests"
TESTS = ("mean", "ranks", "top-k")
ALPHA = 0.05


def tested_blame(report_dir: Path) -> tuple[list[dict[str, str]], np.ndarray, float]:
    """The rows by position, the blame the report's clusters were tested on, and that query's generated weight."""
    from goal_table import report_item_blame, tested_weight

    from gradian.attribution.scoring import rescore_items
    from gradian.report.scores import TESTED_PREFIX

    document = json.loads((report_dir / "report.json").read_text())
    config = document["provenance"]["config"]
    rows, item_ids, matrix = report_item_blame(report_dir, TESTED_PREFIX)
    if not item_ids:  # tested at the ranking's own weight: the item columns
        rows, item_ids, matrix = report_item_blame(report_dir)
    settings = config["attribution"]
    scores = rescore_items(matrix, [row["id"] for row in rows], item_ids, range(len(item_ids)),
                           aggregation=settings["aggregation"], normalize=settings["normalize"],
                           top_k=settings["top_k"])
    return rows, np.asarray(scores.blame), tested_weight(config["evaluation"])


def family_wise(blame: np.ndarray, assignment: Any, test: str, top_k: int, seed: int) -> dict[str, float]:
    """Each cluster's family-wise p under ``test``."""
    from scipy.stats import hypergeom, rankdata

    from gradian.attribution.clusters import cluster_blame

    if test == "top-k":
        top = np.argsort(-blame, kind="stable")[:top_k]
        found = np.bincount(assignment.labels[top], minlength=len(assignment.names))
        sizes = assignment.sizes
        return {name: min(1.0, float(hypergeom.sf(found[c] - 1, len(blame), sizes[c], top_k)) * len(sizes))
                for c, name in enumerate(assignment.names) if sizes[c]}
    values = rankdata(blame) if test == "ranks" else blame
    result = cluster_blame(values, assignment, permutations=1000, seed=seed)
    return {score.name: score.p_adjusted for score in result.scores}


def score_case(directory: Path, _args: argparse.Namespace) -> dict[str, Any]:
    """One case: its planted host(s), the report's verdict, and each test's family-wise p of every cluster."""
    from finished_cases import report_accused
    from goal_table import case_name, case_scenario

    from gradian.attribution.clusters import clusters_from_field

    kind, seed = case_name(directory)
    hosts = list(case_scenario(directory).planted_sources)
    document = json.loads((directory / "report" / "report.json").read_text())
    rows, blame, weight = tested_blame(directory / "report")
    assignment = clusters_from_field([{"source": row["cluster"]} for row in rows], "source")
    settings = document["provenance"]["config"]["attribution"]
    row: dict[str, Any] = {"case": directory.name, "kind": kind, "seed": seed, "hosts": hosts, "weight": weight,
                           "report_accused": report_accused(document),
                           "tests": {}}
    for test in TESTS:
        p = family_wise(blame, assignment, test, settings["top_k"], settings["seed"])
        strongest = min(p, key=lambda name: (p[name], name))
        row["tests"][test] = {"strongest": strongest, "p": p,
                              "accused": sorted(name for name, value in p.items() if value < ALPHA)}
    return row


def _cell(test: dict[str, Any], hosts: list[str]) -> str:
    """What a test accuses (the hosts marked), then the family-wise p of each host it does not accuse."""
    accused = ", ".join(f"`{name}`" + (" (host)" if name in hosts else "") for name in test["accused"]) or "nothing"
    missed = "; ".join(f"`{host}` p {test['p'][host]:.2g}" for host in hosts if host not in test["accused"])
    return accused + (f" ({missed})" if missed else "")


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per case, then per test the planted hosts accused and the clean controls accused."""
    lines = ["# Other cluster tests on the blame the shipped one reads", "", f"`{command}`", "",
             "| case | tested at | planted host | report accuses | " + " | ".join(TESTS) + " |",
             "|---|---|---|---|" + "---|" * len(TESTS)]
    for case in cases:
        hosts = ", ".join(f"`{host}`" for host in case["hosts"]) or "none (clean)"
        accused = ", ".join(f"`{name}`" for name in case["report_accused"]) or "nothing"
        cells = " | ".join(_cell(case["tests"][test], case["hosts"]) for test in TESTS)
        lines.append(f"| {case['case']} | {case['weight']:g} | {hosts} | {accused} | {cells} |")
    planted = [case for case in cases if case["hosts"]]
    clean = [case for case in cases if not case["hosts"]]
    lines += ["", "| test | planted hosts accused | clean controls accusing anything |", "|---|---|---|"]
    for test in ("report", *TESTS):
        accused = {case["case"]: case["report_accused"] if test == "report" else case["tests"][test]["accused"]
                   for case in cases}
        hit = sum(host in accused[case["case"]] for case in planted for host in case["hosts"])
        false = sum(bool(accused[case["case"]]) for case in clean)
        lines.append(f"| {test} | {hit}/{sum(len(case['hosts']) for case in planted)} | {false}/{len(clean)} |")
    lines += ["", f"Family-wise p below {ALPHA} accuses. `mean` and `ranks`: 1,000 permutations at the report's seed; "
              "the report's own test is `mean` per cause with each accusation held without the item that supports it "
              "most (the jackknife), so `report` can accuse less than `mean`."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/cluster_tests.{md,json}."""
    from finished_cases import carrying_main, has_report

    return carrying_main("cluster_tests", __doc__.splitlines()[0], RESULTS, argv, has_report, score_case, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
