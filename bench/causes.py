"""Regressed items grouped into causes (issue 12's method 2): what the split finds and what it does to recall@k.

On each finished accuracy case, the shipped scoring (default query signal and preconditioner) ranks the training
rows against all regressed items, then ``gradian.attribution.causes.find_causes`` groups the items by their
preconditioned query gradients and attributes each group. The table shows the causes found (items, accused
cluster) and recall@k / AUPRC of the report's lead attribution (cause 1) against pooling every item.

    .venv/bin/python bench/causes.py --cases /work/bench-cases fact-0 fact-1 format-0 format-1 span-0
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy, accuracy_methods, projection next to this file

RESULTS = Path(__file__).resolve().parent / "results" / "causes"


def score_case(workdir: Path, base_model: str) -> dict[str, Any]:
    """The causes of one case and the lead attribution's ranking metrics next to the pooled one's."""
    from accuracy_methods import load_case, preconditioner, query
    from projection import exact_config

    from gradian.attribution.causes import find_causes
    from gradian.attribution.clusters import cluster_blame, clusters_from_field
    from gradian.attribution.scoring import ItemBlameCollector, score_with_config
    from gradian.demo.run import reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.evaluation.query_signal import validate_query_signal
    from gradian.report.reader import read_report

    kind, seed = workdir.name.rsplit("-", 1)
    scenario = make_scenario(kind, int(seed))
    report = read_report(workdir / "report")
    config = exact_config(scenario)
    attribution = config.attribution
    signal = validate_query_signal(config.evaluation.metric, config.evaluation.query_signal).effective
    case = load_case(workdir, base_model, config, report)
    queries = query(case, signal)
    pq = preconditioner(case, attribution.preconditioner).apply(queries)
    item_ids = [item.id for item in case.items]
    collector = ItemBlameCollector()
    whole = score_with_config(case.index, pq, attribution, item_ids=item_ids, item_sink=collector)
    assignment = clusters_from_field(case.examples, attribution.cluster_field or "source")
    clusters = cluster_blame(np.asarray(whole.blame), assignment, permutations=attribution.permutations,
                             seed=attribution.seed)
    split = find_causes(collector.matrix(), whole.ids, item_ids, pq @ queries.T, assignment, attribution, whole,
                        clusters)
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, report))

    def metrics(blame: Any) -> dict[str, float]:
        m = truth.score(np.asarray(blame))
        return {"recall_at_k": m["recall_at_k"], "auprc": m["auprc"]}

    row = {"case": workdir.name, "signal": signal, "preconditioner": attribution.preconditioner,
           "items": len(item_ids), "groups": split.groups, "pooled": metrics(whole.blame),
           "lead": metrics(split.primary.scores.blame),
           "causes": [{"items": len(c.item_ids), "accused": c.accused.name if c.accused else None,
                       "z": c.accused.z if c.accused else None, **metrics(c.scores.blame)} for c in split.causes]}
    print(f"  {workdir.name}: {len(split.causes)} cause(s) " + "; ".join(
        f"{c['items']} items -> {c['accused']}" for c in row["causes"])
        + f"; lead {row['lead']['recall_at_k']:.2f} / {row['lead']['auprc']:.2f}, pooled "
          f"{row['pooled']['recall_at_k']:.2f} / {row['pooled']['auprc']:.2f}", flush=True)
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per case: the causes and the lead attribution against the pooled one."""
    lines = ["# Regressed items grouped into causes (tuning seeds)", "", f"`{command}`", "",
             f"Query signal {cases[0]['signal'] if cases else '-'}, preconditioner "
             f"{cases[0]['preconditioner'] if cases else '-'}; recall@k / AUPRC of the planted rows.", "",
             "| case | regressed items | causes (items -> accused cluster) | lead (cause 1) | all items pooled |",
             "|---|---|---|---|---|"]
    for case in cases:
        causes = "; ".join(f"{c['items']} -> {c['accused'] or 'nothing'}" for c in case["causes"])
        lines.append(f"| {case['case']} | {case['items']} | {causes} | {case['lead']['recall_at_k']:.2f} / "
                     f"{case['lead']['auprc']:.2f} | {case['pooled']['recall_at_k']:.2f} / "
                     f"{case['pooled']['auprc']:.2f} |")
    lead = [c["lead"] for c in cases]
    pooled = [c["pooled"] for c in cases]
    lines.append(f"| **mean** | | | **{np.mean([m['recall_at_k'] for m in lead]):.3f} / "
                 f"{np.mean([m['auprc'] for m in lead]):.3f}** | **{np.mean([m['recall_at_k'] for m in pooled]):.3f} / "
                 f"{np.mean([m['auprc'] for m in pooled]):.3f}** |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/causes.json and .md."""
    from finished_cases import rescoring_main

    return rescoring_main("causes", __doc__.splitlines()[0], RESULTS, argv,
                          lambda workdir, args: score_case(workdir, args.base_model), markdown)


if __name__ == "__main__":
    raise SystemExit(main())
