"""Which clusters the report accuses: the top z alone against every family-wise significant cluster (method 6).

On each finished accuracy case the blame of the shipped scoring (default query signal and preconditioner, or the
ones named) is grouped by the scenario's ``source`` field, as the demo does, and the permutation test of
``gradian.attribution.clusters`` runs on it. Two accusation rules are compared:

  top z          the cluster with the largest z, when its family-wise p-value is below alpha (the old rule)
  top effect     every family-wise significant cluster is accused, the one with the largest effect size (mean
                 blame above the overall mean in blame standard deviations) first (the shipped rule)

and the table shows the planted cluster's size, z rank and effect rank, next to the cluster each rule names first,
so the size bias (z grows with sqrt(size)) is visible.

    .venv/bin/python bench/accusation.py --cases /work/bench-cases fact-0 fact-1 format-0 format-1 span-0
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy_methods, projection next to this file

RESULTS = Path(__file__).resolve().parent / "results" / "accusation"


def score_case(workdir: Path, base_model: str, signal: str | None, kind: str | None) -> dict[str, Any]:
    """The cluster table of one case under the shipped scoring, and what each rule accuses."""
    from accuracy_methods import load_case, preconditioner, query
    from projection import exact_config

    from gradian.attribution.clusters import cluster_blame, clusters_from_field
    from gradian.attribution.scoring import score_examples
    from gradian.demo.scenarios import make_scenario
    from gradian.evaluation.query_signal import validate_query_signal
    from gradian.report.reader import read_report

    name, seed = workdir.name.rsplit("-", 1)
    scenario = make_scenario(name, int(seed))
    report = read_report(workdir / "report")
    config = exact_config(scenario)
    kind = kind or config.attribution.preconditioner
    signal = signal or validate_query_signal(config.evaluation.metric, config.evaluation.query_signal).effective
    case = load_case(workdir, base_model, config, report)
    pq = preconditioner(case, kind).apply(query(case, signal))
    blame = np.asarray(score_examples(case.index, pq, aggregation="mean", top_k=20).blame)
    attribution = config.attribution
    result = cluster_blame(blame, clusters_from_field(case.examples, attribution.cluster_field or "source"),
                           permutations=attribution.permutations, seed=attribution.seed)
    by_effect = sorted(result.scores, key=lambda s: -s.effect)
    planted = scenario.planted_cluster
    top = result.scores[0]
    old_rule = top.name if top.p_adjusted < result.alpha and top.z > 0 else None
    row = {"case": workdir.name, "signal": signal, "preconditioner": kind, "planted": planted,
           "planted_size": None, "planted_z_rank": None, "planted_effect_rank": None,
           "top_z": old_rule, "top_effect": result.accused.name if result.accused else None,
           "accused_all": [s.name for s in result.accused_all],
           "clusters": [dataclasses.asdict(s) for s in result.scores]}
    if planted is not None:
        score = result.by_name(planted)
        row.update(planted_size=score.size, planted_z_rank=score.rank,
                   planted_effect_rank=[s.name for s in by_effect].index(planted) + 1)
    print(f"  {workdir.name}: planted {planted} (size {row['planted_size']}, z rank {row['planted_z_rank']}, "
          f"effect rank {row['planted_effect_rank']}); top z accuses {old_rule}, shipped rule accuses "
          f"{row['accused_all']}", flush=True)
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per case: the planted cluster, its ranks, and what each rule accuses."""
    lines = ["# Accusation: top z against every significant cluster, largest effect first (tuning seeds)", "",
             f"`{command}`", "",
             f"Query signal {cases[0]['signal'] if cases else '-'}, preconditioner "
             f"{cases[0]['preconditioner'] if cases else '-'}; clusters from the `source` field; 1000 permutations.",
             "", "| case | planted (size) | planted z rank | planted effect rank | top z accuses | shipped rule "
             "accuses (first, then others) | largest z cluster (size) |", "|---|---|---|---|---|---|---|"]
    for case in cases:
        top = case["clusters"][0] if case["clusters"] else None
        lines.append(f"| {case['case']} | {case['planted'] or '-'} ({case['planted_size'] or '-'}) | "
                     f"{case['planted_z_rank'] or '-'} | {case['planted_effect_rank'] or '-'} | "
                     f"{case['top_z'] or 'none'} | {', '.join(case['accused_all']) or 'none'} | "
                     f"{top['name'] if top else '-'} ({top['size'] if top else '-'}) |")
    with_planted = [c for c in cases if c["planted"]]
    right_old = sum(c["top_z"] == c["planted"] for c in with_planted)
    right_new = sum(c["top_effect"] == c["planted"] for c in with_planted)
    within = sum(c["planted"] in c["accused_all"] for c in with_planted)
    lines += ["", f"Planted cluster accused first: top z {right_old} / {len(with_planted)}, shipped rule "
              f"{right_new} / {len(with_planted)}; among the accused at all: {within} / {len(with_planted)}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/accusation.json and .md."""
    from finished_cases import rescoring_main

    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--signal", default=None, help="query signal (default: the shipped default)")
        parser.add_argument("--preconditioner", default=None, help="preconditioner (default: the shipped default)")

    return rescoring_main("accusation", __doc__.splitlines()[0], RESULTS, argv,
                          lambda workdir, args: score_case(workdir, args.base_model, args.signal, args.preconditioner),
                          markdown, arguments)


if __name__ == "__main__":
    raise SystemExit(main())
