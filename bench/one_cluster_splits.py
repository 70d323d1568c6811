"""Splits left accusing one cluster after their correction: kept as the report keeps them, or every item pooled.

``find_causes`` keeps a split of the regressed items only when its groups accuse two or more distinct clusters
(splitting one cause's items only makes each query noisier), then holds what the kept split accuses to alpha / k.
Where that correction leaves one accused cluster, the report still keeps the split and ranks by the accusing
cause's items alone: on span-7 a 4-item cause accusing `country_profiles` beside a silent 8-item one, 0.60 recall@k.
The alternative: such a split gives way to every item attributed together, as a split that accuses nothing does.

Per finished case, from its report only (seconds, no index read): whether the alternative fires (a k-means split,
not a canned reply, whose causes accuse fewer than two distinct clusters), and recall@k / AUPRC and the accused
clusters under the report and under the alternative (the same where it does not fire; a clean control's accusations
only). The pooled attribution is rebuilt from scores.csv's per-item blame with the product's own functions;
"reproduced" is the largest difference between cause 1's blame rebuilt the same way and scores.csv's own.

    .venv/bin/python bench/one_cluster_splits.py --cases /work/bench-cases kurt-lr5e4-span-7 kurt-lr5e4-format-1 ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "one_cluster_splits"


def fires(causes: list[dict[str, Any]]) -> bool:
    """Whether the report kept a k-means split whose causes accuse fewer than two distinct clusters."""
    accused = {name for cause in causes for name in cause["accused_clusters"]}
    return len(causes) >= 2 and not any(cause.get("canned_reply") for cause in causes) and len(accused) < 2


def pooled(report_dir: Path, document: dict[str, Any], scenario: Any) -> tuple[np.ndarray, list[str], float]:
    """Every item attributed together: its ranking blame by position, what it accuses, and the reproduction check."""
    from goal_table import report_item_blame

    from gradian.attribution.causes import pooled_cause
    from gradian.attribution.clusters import clusters_from_field
    from gradian.attribution.scoring import ranked_with_config, rescore_items
    from gradian.config import build_config
    from gradian.report.scores import CAUSE_PREFIX

    config = build_config(document["provenance"]["config"]).attribution
    rows, item_ids, matrix = report_item_blame(report_dir)
    ids = [row["id"] for row in rows]
    assignment = clusters_from_field(scenario.train, config.cluster_field, ids=ids)
    cause = pooled_cause(matrix, ids, item_ids, assignment, config).primary
    ranked = ranked_with_config(matrix, cause.scores, range(len(item_ids)), config)
    first = [item_ids.index(item) for item in document["causes"][0]["items"]]
    rebuilt = ranked_with_config(matrix, rescore_items(matrix, ids, item_ids, first, aggregation=config.aggregation,
                                                       normalize=config.normalize, top_k=config.top_k), first, config)
    saved = np.array([float(row[f"{CAUSE_PREFIX}1"]) for row in rows])
    difference = float(np.max(np.abs(rebuilt.blame - saved)))  # rescored blame keeps the order of ``ids``
    return np.asarray(ranked.blame), [score.name for score in cause.clusters.accused_all], difference


def score_case(directory: Path, args: Any) -> dict[str, Any]:
    """One case under the report and under the alternative."""
    from goal_table import case_name, case_scenario
    from goal_table import score_case as goal_row

    from gradian.demo.run import reproduced_planted_ids
    from gradian.report.reader import read_report

    kind, seed = case_name(directory)
    scenario = case_scenario(directory)
    report_dir = directory / "report"
    document = json.loads((report_dir / "report.json").read_text())
    causes = document.get("causes") or []
    shipped = goal_row(directory)
    row: dict[str, Any] = {"case": directory.name, "kind": kind, "seed": seed, "fires": fires(causes),
                           "causes": [{"items": len(cause["items"]), "accused": cause["accused_clusters"]}
                                      for cause in causes],
                           "planted_clusters": list(scenario.planted_clusters)}
    row["report"] = {"accused": shipped["accused"], "recall_at_k": shipped.get("recall_at_k"),
                     "auprc": shipped.get("auprc")}
    if not row["fires"]:
        row["pooled"] = row["report"]
        return row
    blame, accused, difference = pooled(report_dir, document, scenario)
    row["reproduced"] = difference
    row["pooled"] = {"accused": accused, "recall_at_k": None, "auprc": None}
    if scenario.planted_rows:  # one cause: every planted row in its ranking, as the goal table scores such a report
        metrics = scenario.ground_truth(reproduced_planted_ids(scenario, read_report(report_dir))).score(blame)
        row["pooled"].update(recall_at_k=metrics["recall_at_k"], auprc=metrics["auprc"])
    return row


def _cell(result: dict[str, Any]) -> str:
    accused = ", ".join(f"`{name}`" for name in result["accused"]) or "nothing"
    if result["recall_at_k"] is None:
        return accused
    return f"{result['recall_at_k']:.2f} / {result['auprc']:.2f}; {accused}"


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per case: its causes, the report's figures, the alternative's, and the reproduction check."""
    from finished_cases import carried_note
    from goal_table import split_label

    lines = [f"# {__doc__.splitlines()[0]}", "", f"`{command}`", "",
             "recall@k / AUPRC of the planted rows; the accused clusters.", "",
             "| case | split | causes: items, accused | fires | report | every item pooled | reproduced |",
             "|---|---|---|---|---|---|---|"]
    for case in cases:
        causes = "; ".join(f"{c['items']}, {', '.join(c['accused']) or 'nothing'}" for c in case["causes"]) or "one"
        reproduced = f"{case['reproduced']:.1e}" if "reproduced" in case else "-"
        lines.append(f"| {case['case']} | {split_label(case)} | {causes} | {'yes' if case['fires'] else 'no'} | "
                     f"{_cell(case['report'])} | {_cell(case['pooled'])} | {reproduced} |")
    scored = [case for case in cases if case["report"]["recall_at_k"] is not None]
    fired = [case for case in scored if case["fires"]]
    if scored:
        lines += ["", "| mean recall@k | report | every item pooled |", "|---|---|---|"]
        for label, group in ((f"the {len(scored)} planted cases", scored), (f"the {len(fired)} it fires on", fired)):
            if group:
                lines.append(f"| {label} | " + " | ".join(
                    f"{np.mean([case[name]['recall_at_k'] for case in group]):.3f}" for name in ("report", "pooled"))
                    + " |")
    carried = carried_note(cases, "no report under --cases, so not scored again")
    return "\n".join(lines + ([carried] if carried else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case (carrying the earlier row of one whose work dir is gone), print and write the table."""
    from finished_cases import carrying_main, has_report

    return carrying_main("one_cluster_splits", __doc__.splitlines()[0], RESULTS, argv,
                         has_report, score_case, markdown)


if __name__ == "__main__":
    sys.exit(main())
