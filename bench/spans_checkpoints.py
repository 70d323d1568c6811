"""Span drill-down at the checkpoint ensemble's points: sentence blame per point and summed by learning rate.

At the final adapter the planted sentence is fitted and its gradient small; the example-level ensemble
(TracIn-CP, ``attribution.checkpoints``) sums blame over the adapter and the run's checkpoints, and
`gradian attribute` drills spans over the same points (gradian/pipelines/span_drill.py). For each planted span
row whose attacked item regressed (every one, not only the report's top five), every sentence's blame against
that one item's query is taken at each point the ensemble plans (its own index, preconditioner and query there),
alone and summed with the ensemble's weights; a hit is the planted sentence ranked first. The report's own drilled
planted rows, each against the item that drilled it, are scored the same way (the goal table's span top-1).

The three sentence blames of ``attribution.span_blame`` are compared (``VARIANTS``, gradian/query/spans.py):
``restricted`` (the default until stop 50), the gradient of the sentence's own tokens' loss in the whole example; ``removed``, the
example's blame minus its blame with the sentence deleted; ``alone``, the blame of the example with the sentence as
its whole answer. A true sentence naming the planted city
("Its largest city is Karachi.") can carry the restricted blame when the wrong capital sentence after it copies
the city from it.

    .venv/bin/python bench/spans_checkpoints.py --cases /work/bench-cases ckpt-span-0 lr5e4-span-0 lr5e4-span-1 lr5e4-span-3
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy_methods next to this file

RESULTS = Path(__file__).resolve().parent / "results" / "spans_checkpoints"


VARIANTS = ("restricted", "removed", "alone")  # the old default first: rows of earlier cases hold its hits only


def sentence_blames(case: Any, signal: str, kind: str, example: Any, item: Any) -> tuple[list[Any], dict[str, Any]]:
    """Every sentence of ``example`` and its blame against ``item``'s query under each of ``VARIANTS``."""
    from accuracy_methods import preconditioner, query

    from gradian.data.loss_mask import concrete_encoding
    from gradian.query import span_blames

    q = preconditioner(case, kind).apply(query(case, signal, [item]))[0]
    grads = case.config.grads
    blames = {}
    for measure in VARIANTS:
        spans = span_blames(case.capture, case.loaded.tokenizer, example, q, max_seq_length=grads.max_seq_length,
                            batch_size=grads.batch_size, measure=measure, **concrete_encoding(grads))
        blames[measure] = np.array([s.blame for s in spans])
    return spans, blames


def score_case(workdir: Path, base_model: str) -> dict[str, Any]:
    """Top-1 hits per point and for the learning-rate-weighted sum."""
    from accuracy_methods import ensemble_points, load_case

    from gradian.config import load_config
    from gradian.demo.scenarios import make_scenario
    from gradian.evaluation.query_signal import validate_query_signal
    from gradian.report.reader import read_report

    kind, seed = workdir.name.rsplit("-", 2)[-2:]
    scenario = make_scenario(kind, int(seed))
    config = load_config(workdir / "config.yaml")  # the case's own, its checkpoint ensemble included
    report = read_report(workdir / "report")
    final = load_case(workdir, base_model, config, report)
    signal = validate_query_signal(config.evaluation.metric, config.evaluation.query_signal).effective
    regressed = {item.id: item for item in final.items}
    targets = [(span, regressed[t]) for span, t in zip(scenario.planted_spans, scenario.planted_targets, strict=True)
               if t in regressed]
    # the report's own drill: its top planted examples, each against the item that blamed it most (the goal table's
    # span top-1), scored after the targets in the same passes
    by_id = {span.example_id: span for span in scenario.planted_spans}
    drilled = [(by_id[drill.example_id], regressed[drill.query_item]) for drill in report.spans
               if drill.example_id in by_id]
    # a drilled row is mostly a target too (the same row against the same item): each pair is drilled once a point
    pairs = {(span.row, item.id): (span, item) for span, item in targets + drilled}

    def at_point(case: Any) -> list[tuple[np.ndarray, np.ndarray]]:
        drilled_once = {}
        for key, (span, item) in pairs.items():
            spans, blames = sentence_blames(case, signal, config.attribution.preconditioner,
                                            final.examples[span.row], item)
            planted = np.array([span.found_at(s.message_index, s.char_start, s.char_end) for s in spans])
            drilled_once[key] = ({variant: blames[variant] for variant in VARIANTS}, planted)
        return [drilled_once[(span.row, item.id)] for span, item in targets + drilled]

    points = []
    for member, case in ensemble_points(final, workdir):
        rows = at_point(case)
        hits = {v: sum(int(hit[int(np.argmax(blame[v]))]) for blame, hit in rows[:len(targets)]) for v in VARIANTS}
        points.append({"step": member.step, "weight": member.weight, "top1_hits": hits, "rows": rows})
        print(f"  {workdir.name} step {member.step} (weight {member.weight:.3f}): {hits} of {len(targets)}",
              flush=True)
    summed = {v: sum(_summed_hits(points, i, v) for i in range(len(targets))) for v in VARIANTS}
    drill = {v: sum(_summed_hits(points, i, v) for i in range(len(targets), len(targets) + len(drilled)))
             for v in VARIANTS}
    print(f"  {workdir.name} learning-rate-weighted sum: {summed} of {len(targets)}; the report's drill: {drill} of "
          f"{len(drilled)}", flush=True)
    return {"case": workdir.name, "checked": len(targets), "summed_top1_hits": summed,
            "drill_checked": len(drilled), "drill_top1_hits": drill,
            "points": [{key: p[key] for key in ("step", "weight", "top1_hits")} for p in points]}


def _summed_hits(points: list[dict[str, Any]], row: int, variant: str) -> int:
    """1 when the planted sentence of target ``row`` leads ``variant``'s blame summed over the points by weight."""
    blame = sum(p["weight"] * p["rows"][row][0][variant] for p in points)
    return int(points[0]["rows"][row][1][int(np.argmax(blame))])


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """Top-1 hits per point and summed, per case; each case's points are its own steps."""
    width = max(len(case["points"]) for case in cases)
    lines = ["# Span top-1 localization at the checkpoint ensemble's points", "", f"`{command}`", "",
             "Each point alone: top-1 hits (its step, its weight); the last point is the adapter. Sentence blame:",
             "restricted (the default until stop 50) = the sentence's own tokens' loss in the whole example; removed = the",
             "example's blame minus its blame without the sentence; alone (the default) = the sentence as the whole answer.", "",
             "The last column is the report's own drill (its top planted examples, each against the regressed item",
             "that blamed it most: the goal table's span top-1) under each sentence blame, summed the same way.", "",
             "| case | sentence blame | " + " | ".join(f"point {j + 1} alone" for j in range(width))
             + " | learning-rate-weighted sum | the report's drill, summed |", "|---|---|" + "---|" * (width + 2)]
    for case in map(_by_variant, cases):
        for variant in VARIANTS:
            if variant not in case["summed_top1_hits"]:
                continue
            cells = [f"{p['top1_hits'][variant]}/{case['checked']} (step {p['step']}, {p['weight']:.3f})"
                     for p in case["points"]] + ["-"] * (width - len(case["points"]))
            drill = (f"{case['drill_top1_hits'][variant]}/{case['drill_checked']}" if "drill_top1_hits" in case
                     else "-")
            lines.append(f"| {case['case']} | {variant} | " + " | ".join(cells)
                         + f" | **{case['summed_top1_hits'][variant]}/{case['checked']}** | {drill} |")
    return "\n".join(lines) + "\n"


def _by_variant(case: dict[str, Any]) -> dict[str, Any]:
    """A row with its hits per sentence-blame variant; a row measured before the variants has restricted's."""
    if isinstance(case["summed_top1_hits"], dict):
        return case
    points = [{**p, "top1_hits": {"restricted": p["top1_hits"]}} for p in case["points"]]
    return {**case, "summed_top1_hits": {"restricted": case["summed_top1_hits"]}, "points": points}


def main(argv: list[str] | None = None) -> int:
    """Score each named case (carrying the row of one whose dir is gone) and write bench/results/spans_checkpoints.*."""
    from finished_cases import indexed_case_main

    return indexed_case_main("spans_checkpoints", __doc__.splitlines()[0], RESULTS, argv, score_case, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
