"""Each row's blame shrunk toward its cluster's: the report's ranking plus a share of its cluster's mean blame.

The report tests clusters and ranks rows apart: a row's rank is its own blame only. Where a cluster is accused at
family-wise p 0.001, a row of it with middling blame is likelier a culprit than a row as blamed in a cluster that is
not: on format-9 two planted French answers (the accused cluster holds the 20 planted rows and nothing else) rank 24
and 27, below five `explanations` rows. The empirical-Bayes reading of a row's blame under a cluster prior is its
own blame pulled toward its cluster's mean; for a ranking that is ``blame + share * cluster mean``. Variants: the
share, and whether every cluster's mean counts or only the clusters the row's cause accuses (a clean control that
accuses nothing is then unchanged). Each cause's ranking is shrunk on its own (its blame, its clusters' means over
it, its accusations), and the planted rows scored in it as the goal table scores them.

Per finished case, from its report only (seconds, no index read):

    .venv/bin/python bench/cluster_prior.py --cases /work/bench-cases kurt-lr5e4-span-7 kurt-lr5e4-format-9 ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "cluster_prior"
SHARES = (0.5, 1.0, 2.0)
VARIANTS = ["own blame",  # each row ranked by its own blame: the report before the prior shipped
            *(f"{scope}, share {share}" for scope in ("every cluster", "accused clusters") for share in SHARES)]


def shrunk(blame: np.ndarray, sources: list[str], accused: list[str], share: float, scope: str) -> np.ndarray:
    """``blame`` plus ``share`` of the mean blame of each row's cluster (``scope`` "accused": accused clusters only)."""
    names = np.array(sources)
    prior = np.zeros_like(blame)
    for name in set(sources):
        if scope == "every" or name in accused:
            members = names == name
            prior[members] = blame[members].mean()
    return blame + share * prior


def own_blame(blame: np.ndarray, sources: list[str], prior: dict[str, Any] | None) -> np.ndarray:
    """A ranking's blame less what the report's cluster prior added to accused clusters' members (none: as it is)."""
    added = (prior or {}).get("added", {})
    return np.asarray(blame) - np.array([added.get(name, 0.0) for name in sources])


def variant_blame(name: str, blame: np.ndarray, sources: list[str], accused: list[str]) -> np.ndarray:
    """The ranking a named variant gives a cause whose blame is ``blame`` and whose accusations are ``accused``."""
    if name == "own blame":
        return blame
    scope, share = name.rsplit(", share ", 1)
    return shrunk(blame, sources, accused, float(share), "every" if scope == "every cluster" else "accused")


def mixed(report_dir: Path, document: dict[str, Any], scenario: Any, truth: Any,
          sources: list[str]) -> dict[str, Any]:
    """The planted rows' cluster(s) renamed as the largest clean one, every item attributed together (the product's
    pooled attribution on the new clusters): recall@k / AUPRC by each row's own blame and with the prior at share 1."""
    from collections import Counter

    from goal_table import report_item_blame

    from gradian.attribution.causes import pooled_cause
    from gradian.attribution.cluster_prior import with_cluster_prior
    from gradian.attribution.clusters import clusters_from_field
    from gradian.attribution.scoring import ranked_with_config
    from gradian.config import build_config

    config = build_config(document["provenance"]["config"]).attribution
    rows, item_ids, matrix = report_item_blame(report_dir)
    planted = {sources[position] for position in scenario.planted_rows}
    into = next(name for name, _ in Counter(sources).most_common() if name not in planted)
    renamed = [into if name in planted else name for name in sources]
    assignment = clusters_from_field([{config.cluster_field: name} for name in renamed], config.cluster_field)
    cause = pooled_cause(matrix, [row["id"] for row in rows], item_ids, assignment, config).primary
    columns = range(len(item_ids))
    own = ranked_with_config(matrix, cause.scores, columns, config)
    accused = [score.name for score in cause.clusters.accused_all]
    lifted = with_cluster_prior(own, matrix, columns, assignment, accused, 1.0)
    size = renamed.count(into)
    return {"into": into, "size": size, "accused": accused,
            **{name: {metric: truth.score(blame.blame)[metric] for metric in ("recall_at_k", "auprc")}
               for name, blame in (("own", own), ("prior", lifted))}}


def score_case(directory: Path, args: Any) -> dict[str, Any]:
    """One case under every variant: recall@k / AUPRC of its planted rows as the goal table scores the report."""
    from goal_table import blame_vector, case_scenario, cause_blames, clusters_in_their_causes, weighted_by_rows
    from goal_table import score_case as goal_row

    from gradian.demo.run import reproduced_planted_ids
    from gradian.report.reader import read_report

    scenario = case_scenario(directory)
    kind, seed = scenario.kind, scenario.seed
    report_dir = directory / "report"
    shipped = goal_row(directory)
    row: dict[str, Any] = {"case": directory.name, "kind": kind, "seed": seed, "accused": shipped["accused"],
                           "planted_clusters": list(scenario.planted_clusters), "variants": {}}
    if not scenario.planted_rows or "recall_at_k" not in shipped:  # a clean control, or a case not attributed
        return row
    report = read_report(report_dir)
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, report))
    sources = [str(example.fields[scenario.cluster_field]) for example in scenario.train]
    split = cause_blames(report_dir)
    document = json.loads((report_dir / "report.json").read_text())
    for name in VARIANTS:  # every variant from each row's own blame: a report written since the prior shipped lifts it
        if split is None or not scenario.planted_clusters:  # one ranking: scores.csv's blame, every accusation
            own = own_blame(blame_vector(report_dir, len(scenario.train)), sources,
                            document["method"].get("cluster_prior"))
            metrics = truth.score(variant_blame(name, own, sources, shipped["accused"]))
            row["variants"][name] = {"recall_at_k": metrics["recall_at_k"], "auprc": metrics["auprc"]}
        else:  # each cause shrunk on its own, each planted cluster scored in the cause accusing it
            _, blames = split
            shrunk_blames = [variant_blame(name, own_blame(blame, sources, cause.get("cluster_prior")), sources,
                                           list(cause["accused_clusters"]))
                             for cause, blame in zip(document["causes"], blames, strict=True)]
            row["variants"][name] = weighted_by_rows(clusters_in_their_causes(document["causes"], shrunk_blames,
                                                                              scenario))
    row["mixed"] = mixed(report_dir, document, scenario, truth, sources)
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per variant, a column per planted case, the mean over them and over the span cases alone."""
    from finished_cases import carried_note, recall_cells, variant_table

    scored = [case for case in cases if case["variants"]]
    span = [case for case in scored if case["kind"] == "span"]  # the planted rows among clean members of their cluster
    lines = variant_table(__doc__.splitlines()[0], command, scored, VARIANTS, [("mean", scored), ("span mean", span)])
    lines += ["", "## The planted rows in a larger clean cluster",  "",
              "The planted rows' cluster renamed as the largest clean one (span: `country_profiles`, 20 planted of "
              "64, into it as well), every item attributed together on those clusters: recall@k / AUPRC by each "
              "row's own blame and with the prior at share 1, and what the pooled attribution accuses.", "",
              "| case | merged into (rows) | accused | own blame | prior, share 1 |", "|---|---|---|---|---|"]
    for case in scored:
        merged = case.get("mixed")
        if merged:
            accused = ", ".join(f"`{name}`" for name in merged["accused"]) or "nothing"
            lines.append(f"| {case['case']} | `{merged['into']}` ({merged['size']}) | {accused} | "
                         f"{recall_cells(merged, ['own'])} | {recall_cells(merged, ['prior'])} |")
    unscored = [case["case"] for case in cases if not case["variants"]]
    if unscored:
        lines += ["", f"Not ranked against planted rows (a clean control, or not attributed): {', '.join(unscored)}; "
                      "the accused-clusters variants leave a case that accuses nothing as it is."]
    carried = carried_note(cases, "no report under --cases, so not scored again")
    return "\n".join(lines + ([carried] if carried else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case (carrying the earlier row of one whose work dir is gone), print and write the table."""
    from finished_cases import carrying_main, has_report

    return carrying_main("cluster_prior", __doc__.splitlines()[0], RESULTS, argv,
                         has_report, score_case, markdown)


if __name__ == "__main__":
    sys.exit(main())
