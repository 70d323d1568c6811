"""Self-influence normalization at the checkpoint ensemble's points (issue 12's method 5), with the shipped defaults.

RelatIF-style: each training row's blame at a point is divided by its gradient norm there to the power alpha
(0: the shipped raw dot product; 1: cosine, ``attribution.normalize``), then summed over the ensemble's points
with its learning-rate weights and aggregated as shipped (mean of per-item z-scores). Per finished demo case:
recall@k / AUPRC per alpha, beside them the same metrics of the report's own per-item blame (scores.csv, every
regressed item, before any split into causes), which alpha 0 reproduces, and whether the regressed items all
generated one identical answer, the mark of a behaviour regression (a canned deflection), where raw blame favours
long high-loss rows that happen to share the topic.

    .venv/bin/python bench/normalization.py --cases /work/bench-cases lr5e4-behaviour-0 lr5e4-behaviour-1
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "normalization"
ALPHAS = (0.0, 0.5, 1.0)
ROWS_PER_READ = 32  # exact SmolLM2 rows are ~10 MB each


def point_blame(case: Any, signal: str) -> tuple[np.ndarray, np.ndarray]:
    """Raw per-item blame [examples, items] and each row's gradient norm at one point, in one pass over its index."""
    from accuracy_methods import preconditioner, query

    pq = preconditioner(case, case.config.attribution.preconditioner).apply(query(case, signal)).astype(np.float32)
    raw, norms = [], []
    for _, chunk in case.index.iter_chunks(ROWS_PER_READ):
        raw.append(-(chunk @ pq.T).astype(np.float64))
        norms.append(np.linalg.norm(chunk.astype(np.float64), axis=1))
    return np.concatenate(raw), np.concatenate(norms)


def score_case(workdir: Path, base_model: str) -> dict[str, Any]:
    """recall@k / AUPRC of the ensemble's blame per alpha on one case."""
    from accuracy_methods import ensemble_points, load_case
    from goal_table import report_item_blame
    from goal_table import score_case as goal_row

    from gradian.attribution.scoring import rescore_items
    from gradian.config import load_config
    from gradian.demo.run import reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.evaluation.query_signal import validate_query_signal
    from gradian.report.reader import read_report

    goal = goal_row(workdir)  # kind, seed, held out
    scenario = make_scenario(goal["kind"], goal["seed"])
    report = read_report(workdir / "report")
    config = load_config(workdir / "config.yaml")
    final = load_case(workdir, base_model, config, report)
    signal = validate_query_signal(config.evaluation.metric, config.evaluation.query_signal).effective
    points = []
    for member, case in ensemble_points(final, workdir):
        raw, norms = point_blame(case, signal)
        points.append((member.weight, raw, norms))
        print(f"  {workdir.name} step {member.step}: scored", flush=True)
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, report))
    ids = [e.id for e in final.examples]

    def measured(item_ids: list[str], matrix: np.ndarray) -> dict[str, float]:
        blame = rescore_items(matrix, ids, item_ids, list(range(len(item_ids))),
                              aggregation=config.attribution.aggregation).blame
        metrics = truth.score(np.asarray(blame))
        return {"recall_at_k": metrics["recall_at_k"], "auprc": metrics["auprc"]}

    item_ids = [item.id for item in final.items]
    alphas = {str(alpha): measured(item_ids, sum(w * raw / np.where(norms > 0, norms, 1.0)[:, None] ** alpha
                                                 for w, raw, norms in points)) for alpha in ALPHAS}
    answers = {(item.finetuned_output or "").strip() for item in final.items}
    row = {"case": workdir.name, "kind": goal["kind"], "held_out": goal["held_out"], "alphas": alphas,
           "report": measured(*report_item_blame(workdir / "report")[1:]),
           "one_answer": len(answers) == 1, "items": len(final.items)}
    print(f"  {workdir.name}: " + "; ".join(f"alpha {a} {m['recall_at_k']:.2f} / {m['auprc']:.2f}"
                                             for a, m in alphas.items()), flush=True)
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """recall@k / AUPRC per alpha and case, the report's item blame's, and whether the items gave one answer."""
    lines = ["# Self-influence normalization at the checkpoint ensemble's points", "", f"`{command}`", "",
             "Blame at each point divided by the row's gradient norm^alpha, summed with the ensemble's weights, mean "
             "of item z-scores; recall@k / AUPRC. Report: its scores.csv per-item blame over every regressed item, "
             "aggregated the same way. One answer: every regressed item now generates the same text.", "",
             "| case | split | one answer | report's item blame | " + " | ".join(f"alpha {a}" for a in ALPHAS) + " |",
             "|---|---|---|---|" + "---|" * len(ALPHAS)]
    for case in cases:
        shown = f"{case['report']['recall_at_k']:.2f} / {case['report']['auprc']:.2f}"
        cells = [f"{case['alphas'][str(a)]['recall_at_k']:.2f} / {case['alphas'][str(a)]['auprc']:.2f}" for a in ALPHAS]
        lines.append(f"| {case['case']}{' (carried)' if case.get('carried') else ''} | "
                     f"{'held-out' if case['held_out'] else 'tuning'} | {'yes' if case['one_answer'] else 'no'} | "
                     f"{shown} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case (carrying the row of one whose dir is gone) and write bench/results/normalization.*."""
    from finished_cases import indexed_case_main

    return indexed_case_main("normalization", __doc__.splitlines()[0], RESULTS, argv, score_case, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
