"""Span drill-down at the checkpoint ensemble's points: sentence blame per point and summed by learning rate.

At the final adapter the planted sentence is fitted and its gradient small; the example-level ensemble
(TracIn-CP, ``attribution.checkpoints``) sums blame over the adapter and the run's checkpoints, and
`gradian attribute` drills spans over the same points (gradian/pipelines/span_drill.py). For each planted span
row whose attacked item regressed (every one, not only the report's top five), every sentence's blame against
that one item's query is taken at each point the ensemble plans (its own index, preconditioner and query there),
alone and summed with the ensemble's weights; a hit is the planted sentence ranked first.

    .venv/bin/python bench/spans_checkpoints.py --cases /work/bench-cases ckpt-span-0 lr5e4-span-0
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy_methods next to this file

RESULTS = Path(__file__).resolve().parent / "results" / "spans_checkpoints"


def sentence_blames(case: Any, signal: str, kind: str, example: Any, item: Any) -> list[Any]:
    """Every sentence's blame of ``example`` against ``item``'s query, under the case's weights and index."""
    from accuracy_methods import preconditioner, query

    from gradian.query import span_blames

    q = preconditioner(case, kind).apply(query(case, signal, [item]))[0]
    return span_blames(case.capture, case.loaded.tokenizer, example, q, max_seq_length=case.config.grads.max_seq_length,
                       batch_size=case.config.grads.batch_size)


def score_case(workdir: Path, base_model: str) -> dict[str, Any]:
    """Top-1 hits per point and for the learning-rate-weighted sum."""
    from accuracy_methods import load_case

    from gradian.attribution.checkpoint_ensemble import plan_ensemble
    from gradian.demo.run import demo_config
    from gradian.demo.scenarios import make_scenario
    from gradian.evaluation.query_signal import validate_query_signal
    from gradian.grads.capture import GradientCapture
    from gradian.index.build import build_index
    from gradian.model.adapter_swap import checkpoint_weights
    from gradian.report.reader import read_report

    kind, seed = workdir.name.rsplit("-", 2)[-2:]
    scenario = make_scenario(kind, int(seed))
    config = demo_config(scenario)
    final = load_case(workdir, base_model, config, read_report(workdir / "report"))
    signal = validate_query_signal(config.evaluation.metric, config.evaluation.query_signal).effective
    plan = plan_ensemble(4, workdir / "train" / "run", workdir / "train" / "adapter", final.loaded.adapter_hash)
    regressed = {item.id: item for item in final.items}
    targets = [(span, regressed[t]) for span, t in zip(scenario.planted_spans, scenario.planted_targets, strict=True)
               if t in regressed]

    def at_point(case: Any) -> list[tuple[np.ndarray, np.ndarray]]:
        rows = []
        for span, item in targets:
            spans = sentence_blames(case, signal, config.attribution.preconditioner, final.examples[span.row], item)
            planted = [span.found_at(s.message_index, s.char_start, s.char_end) for s in spans]
            rows.append((np.array([s.blame for s in spans]), np.array(planted)))
        return rows

    points = []
    for member in plan.members:
        if member.is_adapter:
            rows = at_point(final)
        else:
            with checkpoint_weights(final.loaded, member.adapter_dir) as view:
                index = build_index(view, final.examples, config, None)  # the ensemble's own, from the cache
                rows = at_point(dataclasses.replace(final, loaded=view, index=index,
                                                    capture=GradientCapture.for_index(view, config.grads, index)))
        hits = sum(int(planted[int(np.argmax(blame))]) for blame, planted in rows)
        points.append({"step": member.step, "weight": member.weight, "top1_hits": hits, "rows": rows})
        print(f"  {workdir.name} step {member.step} (weight {member.weight:.3f}): {hits}/{len(rows)}", flush=True)
    summed = [sum(p["weight"] * p["rows"][i][0] for p in points) for i in range(len(targets))]
    hits = sum(int(points[0]["rows"][i][1][int(np.argmax(blame))]) for i, blame in enumerate(summed))
    print(f"  {workdir.name} learning-rate-weighted sum: {hits}/{len(targets)}", flush=True)
    return {"case": workdir.name, "checked": len(targets), "summed_top1_hits": hits,
            "points": [{key: p[key] for key in ("step", "weight", "top1_hits")} for p in points]}


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """Top-1 hits per point and summed, per case; each case's points are its own steps."""
    width = max(len(case["points"]) for case in cases)
    lines = ["# Span top-1 localization at the checkpoint ensemble's points", "", f"`{command}`", "",
             "Each point alone: top-1 hits (its step, its weight); the last point is the adapter.", "",
             "| case | " + " | ".join(f"point {j + 1} alone" for j in range(width))
             + " | learning-rate-weighted sum |", "|---|" + "---|" * (width + 1)]
    for case in cases:
        cells = [f"{p['top1_hits']}/{case['checked']} (step {p['step']}, {p['weight']:.3f})" for p in case["points"]]
        cells += ["-"] * (width - len(cells))
        lines.append(f"| {case['case']} | " + " | ".join(cells) + f" | **{case['summed_top1_hits']}/{case['checked']}** |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/spans_checkpoints.json and .md."""
    from finished_cases import rescoring_main

    return rescoring_main("spans_checkpoints", __doc__.splitlines()[0], RESULTS, argv,
                          lambda workdir, args: score_case(workdir, args.base_model), markdown)


if __name__ == "__main__":
    raise SystemExit(main())
