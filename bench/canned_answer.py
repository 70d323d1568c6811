"""Regressed items that now give one identical answer, attributed as a group of their own, raw and norm-divided.

A behaviour regression (one canned deflection for a whole topic) shows as several regressed items whose fine-tuned
answers are the same text, beside items the learning rate broke. The rows that taught a canned answer all end in
that answer, are fitted within a few steps, and then have small gradients, so a raw dot product ranks them under
long rows that share the topic. Per finished demo case this scores the planted rows' recall@k / AUPRC under the
shipped ranking (``attribution.ranking``) of: every regressed item, as one query; the items sharing the most
common identical answer (at least two of them), as one group; each with every row's blame at each of the
ensemble's points divided by its gradient norm there to the power alpha (0: the shipped raw product; 1: cosine),
summed with the ensemble's weights; under the shipped query signal, and with ``--signals`` under others (a canned
answer's first divergent token, "I" against "The", is one many rows teach; its whole text only the rows that taught
it). Beside them, the goal table's figure for the report itself.

    .venv/bin/python bench/canned_answer.py --cases /work/bench-cases rank-lr5e4-behaviour-0 rank-lr5e4-behaviour-1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "canned_answer"
ALPHAS = (0.0, 0.5, 1.0)
MIXED = "shared answer's items: divergence"


def shared_answer_items(items: list[Any]) -> tuple[str, list[str]] | None:
    """The answer the most items give word for word and their ids, as the product finds it (None: no two agree)."""
    from gradian.query.signals import answer_key, shared_answers

    groups = shared_answers(items)
    if not groups:
        return None
    first = next(item for item in items if item.id == groups[0][0])
    return answer_key(first.finetuned_output), list(groups[0])


def score_case(workdir: Path, base_model: str, signals: list[str]) -> dict[str, Any]:
    """recall@k / AUPRC of every regressed item and of the shared-answer group, per signal and alpha, on one case."""
    from accuracy_methods import ensemble_points, load_case
    from goal_table import score_case as goal_row
    from normalization import point_blame

    from gradian.attribution.scoring import rescore_items
    from gradian.config import load_config
    from gradian.demo.run import reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.evaluation.query_signal import validate_query_signal
    from gradian.report.reader import read_report

    goal = goal_row(workdir)
    row: dict[str, Any] = {"case": workdir.name, "kind": goal["kind"], "held_out": goal["held_out"],
                           "report": {"recall_at_k": goal.get("recall_at_k"), "auprc": goal.get("auprc")}}
    scenario = make_scenario(goal["kind"], goal["seed"])
    if not scenario.planted_ids:
        return {**row, "skipped": "nothing planted: a clean control"} | _shared_only(workdir)
    report = read_report(workdir / "report")
    config = load_config(workdir / "config.yaml")
    final = load_case(workdir, base_model, config, report)
    shipped = validate_query_signal(config.evaluation.metric, config.evaluation.query_signal).effective
    signals = [shipped if name == "auto" else name for name in signals]
    points: dict[str, list[tuple[float, np.ndarray, np.ndarray]]] = {signal: [] for signal in signals}
    for member, case in ensemble_points(final, workdir):
        for signal in signals:
            points[signal].append((member.weight, *point_blame(case, signal)))
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, report))
    ids = [e.id for e in final.examples]
    item_ids = [item.id for item in final.items]

    summed: dict[tuple[str, float], np.ndarray] = {}  # the ensemble's blame per signal and alpha, summed once

    def measured(signal: str, group: list[str], alpha: float) -> dict[str, float]:
        if (signal, alpha) not in summed:
            summed[signal, alpha] = sum(w * raw / np.where(norms > 0, norms, 1.0)[:, None] ** alpha
                                        for w, raw, norms in points[signal])
        matrix = summed[signal, alpha]
        columns = [item_ids.index(item) for item in group]
        blame = rescore_items(matrix[:, columns], ids, group, list(range(len(group))),
                              aggregation=config.attribution.ranking).blame
        metrics = truth.score(np.asarray(blame))
        return {"recall_at_k": metrics["recall_at_k"], "auprc": metrics["auprc"]}

    shared = shared_answer_items(list(final.items))
    if shared is not None and "divergence" in points and shipped in points and shipped != "divergence":
        # what the product would score: the shared answer's items under divergence, every other item as shipped
        columns = [item_ids.index(item) for item in shared[1]]
        signals.append(MIXED)
        points[MIXED] = [(w, _with_columns(raw, other, columns), norms)
                         for (w, raw, norms), (_, other, _) in zip(points[shipped], points["divergence"], strict=True)]
    row |= {"items": len(item_ids), "shipped_signal": shipped, "signals": {signal: {
        "all": {str(a): measured(signal, item_ids, a) for a in ALPHAS},
        **({"shared": {str(a): measured(signal, shared[1], a) for a in ALPHAS}} if shared else {})}
        for signal in signals}}
    if shared is not None:
        row |= {"shared_answer": shared[0], "shared_items": shared[1]}
    print(f"  {workdir.name}: shared {len(shared[1]) if shared else 0} of {len(item_ids)} items", flush=True)
    return row


def _with_columns(matrix: np.ndarray, source: np.ndarray, columns: list[int]) -> np.ndarray:
    """``matrix`` with ``columns`` taken from ``source``."""
    out = matrix.copy()
    out[:, columns] = source[:, columns]
    return out


def _shared_only(workdir: Path) -> dict[str, Any]:
    """Whether a case without planted rows has a shared answer among its regressed items (no scoring)."""
    from gradian.report.reader import read_report

    items = [item for item in read_report(workdir / "report").capability.items if item.regressed]
    shared = shared_answer_items(items)
    return {"items": len(items)} | ({"shared_answer": shared[0], "shared_items": shared[1]} if shared else {})


def _cell(metrics: dict[str, Any] | None) -> str:
    if not metrics or metrics.get("recall_at_k") is None:
        return "-"
    return f"{metrics['recall_at_k']:.2f} / {metrics['auprc']:.2f}"


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """recall@k / AUPRC per case: the report, every regressed item and the shared-answer group at each alpha."""
    heads = [f"{group} alpha {a}" for group in ("all items,", "shared answer,") for a in ALPHAS]
    lines = [f"# {__doc__.splitlines()[0]}", "", f"`{command}`", "",
             "Each cell: recall@k / AUPRC of the planted rows, ranked by the shipped ranking over the group's items. "
             "Shared: regressed items whose fine-tuned answers are one identical text (how many, of the regressed).", "",
             "| case | split | report | shared | query signal | " + " | ".join(heads) + " |",
             "|---|---|---|---|---|" + "---|" * len(heads)]
    for case in cases:
        shared = f"{len(case['shared_items'])} of {case['items']}" if case.get("shared_items") else "none"
        head = (f"| {case['case']}{' (carried)' if case.get('carried') else ''} | "
                f"{'held-out' if case['held_out'] else 'tuning'} | {_cell(case['report'])} | {shared} | ")
        for signal, groups in (case.get("signals") or {"-": {}}).items():
            cells = [_cell(groups.get(group, {}).get(str(a))) for group in ("all", "shared") for a in ALPHAS]
            shipped = " (shipped)" if signal == case.get("shipped_signal") else ""
            lines.append(head + f"{signal}{shipped} | " + " | ".join(cells) + " |")
    answers = [f"- {case['case']}: \"{case['shared_answer']}\"" for case in cases if case.get("shared_answer")]
    return "\n".join(lines + (["", "The shared answers:", "", *answers] if answers else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case (carrying the row of one whose dir is gone) and write bench/results/canned_answer.*."""
    from finished_cases import carrying_main

    from gradian.query.signals import SIGNALS

    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--base-model", default="smollm2-135m-instruct")
        parser.add_argument("--signals", nargs="+", default=["auto"], choices=["auto", *SIGNALS, "generated"],
                            help="query signals to score (auto: the case's own; generated: bench/accuracy_methods.py's)")

    return carrying_main("canned_answer", __doc__.splitlines()[0], RESULTS, argv,
                         lambda case: (case / "index" / "manifest.json").is_file(),
                         lambda case, args: score_case(case, args.base_model, args.signals), markdown, options)


if __name__ == "__main__":
    raise SystemExit(main())
