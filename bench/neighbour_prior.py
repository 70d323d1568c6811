"""The cluster prior from each row's nearest fellow members instead of its whole accused cluster.

`attribution.cluster_prior` adds to each member of an accused cluster the cluster's mean blame. Where the cluster
is the planted rows alone that puts them first; where they share it with clean rows (span's `country_profiles`,
any kind built with `shared_source`), every member is lifted alike and the order inside the cluster is each row's
own blame. Variant: each member lifted by the mean own blame of its k nearest other members, nearness the cosine of
their per-item blame over the ranking's items (rows that move the same items the same way), so a weakly blamed
planted row whose fellows are the strongly blamed planted ones rises above a clean row of the same source. A cluster
of only planted rows gives nearly the cluster's mean; k at least the cluster's size gives its mean without the row.

Per finished case, from its report only (seconds, no index read); the "cluster mean" variant must reproduce the
report's ranking (the "reproduced" column: the largest difference from scores.csv's blame, one-ranking cases):

    .venv/bin/python bench/neighbour_prior.py --cases /work/bench-cases shared-lr5e4-format-9 kurt-lr5e4-span-13 ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "neighbour_prior"
NEIGHBOURS = (5, 10, 20)
VARIANTS = ["own blame", "cluster mean (shipped)", *(f"{k} nearest" for k in NEIGHBOURS)]


def neighbour_lift(own: np.ndarray, profiles: np.ndarray, members: np.ndarray, k: int) -> np.ndarray:
    """Per member (positions ``members``), the mean ``own`` blame of its ``k`` most cosine-alike other members."""
    rows = profiles[members]
    unit = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)  # a row is not its own neighbour: its own blame is counted once
    count = min(k, len(members) - 1)
    if count < 1:
        return np.zeros(len(members))
    nearest = np.argsort(-similarity, axis=1, kind="stable")[:, :count]
    return own[members][nearest].mean(axis=1)


def variant_blame(name: str, own: np.ndarray, profiles: np.ndarray, sources: list[str],
                  accused: list[str]) -> np.ndarray:
    """The ranking a named variant gives one cause: ``own`` blame, its item ``profiles`` and its ``accused``."""
    if name == "own blame":
        return own
    names = np.array(sources)
    prior = np.zeros_like(own)
    for cluster in accused:
        members = np.flatnonzero(names == cluster)
        if name.startswith("cluster mean"):
            prior[members] = own[members].mean()
        else:
            prior[members] = neighbour_lift(own, profiles, members, int(name.split()[0]))
    return own + prior


def score_case(directory: Path, args: Any) -> dict[str, Any]:
    """One case under every variant: recall@k / AUPRC of its planted rows as the goal table scores the report."""
    from cluster_prior import own_blame
    from goal_table import (
        blame_vector,
        case_scenario,
        cause_blames,
        clusters_in_their_causes,
        report_item_blame,
        weighted_by_rows,
    )
    from goal_table import score_case as goal_row

    from gradian.attribution.causes import highest_standardized
    from gradian.demo.run import reproduced_planted_ids
    from gradian.report.reader import read_report

    scenario = case_scenario(directory)
    report_dir = directory / "report"
    shipped = goal_row(directory)
    row: dict[str, Any] = {"case": directory.name, "kind": scenario.kind, "seed": scenario.seed,
                           "shared_source": scenario.shared_source, "accused": shipped["accused"], "variants": {}}
    if not scenario.planted_rows or "recall_at_k" not in shipped:  # a clean control, or a case not attributed
        return row
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, read_report(report_dir)))
    sources = [str(example.fields[scenario.cluster_field]) for example in scenario.train]
    document = json.loads((report_dir / "report.json").read_text())
    _, item_ids, matrix = report_item_blame(report_dir)
    split = cause_blames(report_dir)
    for name in VARIANTS:
        if split is None:  # one ranking over every item column
            own = own_blame(blame_vector(report_dir, len(scenario.train)), sources,
                            document["method"].get("cluster_prior"))
            blame = variant_blame(name, own, matrix, sources, shipped["accused"])
            if name.startswith("cluster mean"):
                row["reproduced"] = float(np.abs(blame - blame_vector(report_dir, len(scenario.train))).max())
            row["variants"][name] = {key: truth.score(blame)[key] for key in ("recall_at_k", "auprc")}
            continue
        causes = split[0]["causes"]
        lifted = []
        for cause, blame in zip(causes, split[1], strict=True):  # each cause on its own items and accusations
            columns = [item_ids.index(item) for item in cause["items"]]
            lifted.append(variant_blame(name, own_blame(blame, sources, cause.get("cluster_prior")),
                                        matrix[:, columns], sources, list(cause["accused_clusters"])))
        if scenario.planted_clusters:  # each planted cluster in the ranking of the cause accusing it
            row["variants"][name] = weighted_by_rows(clusters_in_their_causes(causes, lifted, scenario))
        else:  # scores.csv's ranking: every row by its highest standardized blame over the accusing causes
            accusing = [blame for cause, blame in zip(causes, lifted, strict=True) if cause["accused_clusters"]]
            overall = highest_standardized(accusing) if len(accusing) >= 2 else lifted[0]
            row["variants"][name] = {key: truth.score(overall)[key] for key in ("recall_at_k", "auprc")}
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per variant, a column per planted case; means over the shared-source cases (span's included) and the
    cases whose planted rows are a cluster of their own."""
    from finished_cases import carried_note, variant_table

    scored = [case for case in cases if case["variants"]]
    shared = [case for case in scored if case["shared_source"] or case["kind"] == "span"]
    own = [case for case in scored if case not in shared]
    lines = variant_table(__doc__.splitlines()[0], command, scored, VARIANTS,
                          [("mean, planted rows among clean ones", shared),
                           ("mean, planted rows a cluster of their own", own)])
    reproduced = [f"{case['case']} {case['reproduced']:.1e}" for case in scored if "reproduced" in case]
    if reproduced:
        lines += ["", "The cluster-mean variant against scores.csv's blame, largest difference: " + ", ".join(reproduced)
                  + "."]
    unscored = [case["case"] for case in cases if not case["variants"]]
    if unscored:
        lines += ["", f"Not ranked against planted rows (a clean control, or not attributed): {', '.join(unscored)}."]
    carried = carried_note(cases, "no report under --cases, so not scored again")
    return "\n".join(lines + ([carried] if carried else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case (carrying the earlier row of one whose work dir is gone), print and write the table."""
    from finished_cases import carrying_main, has_report

    return carrying_main("neighbour_prior", __doc__.splitlines()[0], RESULTS, argv, has_report, score_case,
                         markdown)


if __name__ == "__main__":
    sys.exit(main())
