"""Scoring with gradients at several of the run's checkpoints (TracIn-CP, issue 12's method 3): gain and cost.

By the end of training the planted rows are fitted and their gradients are small; TracIn-CP (Pruthi et al. 2020)
sums the influence over checkpoints along the run, each weighted by the learning rate there. For a finished
accuracy case whose run kept several checkpoints (``train.checkpoints``), every checkpoint's adapter gets its own
index and its own query gradients (the same base / fine-tuned answer pair, the shipped default signal and
preconditioner); the per-item blame [examples, items] of checkpoint c is B_c, and the ensemble scores
sum_c w_c B_c with the default aggregation (mean of per-item z-scores), w_c the logged learning rate at c
(``lr``) or 1 (``uniform``). The table shows recall@k / AUPRC for the final checkpoint alone and for the last
1..k checkpoints, and each checkpoint index's build time and size.

    .venv/bin/python bench/checkpoints.py --cases /work/bench-cases lr5e4-fact-0
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy, accuracy_methods next to this file

RESULTS = Path(__file__).resolve().parent / "results" / "checkpoints"


def run_checkpoints(run: Path) -> list[tuple[int, Path, float]]:
    """(step, dir, learning rate logged at that step) of every checkpoint of a run that holds an adapter."""
    from gradian.attribution.checkpoint_ensemble import logged_rates, rate_at
    from gradian.runs import read_run
    from gradian.runs.hf_trainer import checkpoints

    found = [(int(folder.name.split("-")[1]), folder) for folder in checkpoints(run)
             if (folder / "adapter_model.safetensors").is_file()]
    rates = logged_rates(read_run(run))
    return [(step, folder, rate_at(rates, step)) for step, folder in found]


def score_case(workdir: Path, base_model: str) -> dict[str, Any]:
    """Each checkpoint's per-item blame, then recall@k / AUPRC of the ensembles of the last 1..k checkpoints."""
    from accuracy_methods import item_blame, load_case

    from gradian.attribution.checkpoint_ensemble import plan_ensemble
    from gradian.attribution.scoring import rescore_items
    from gradian.demo.run import demo_config, reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.evaluation.query_signal import validate_query_signal
    from gradian.grads.capture import GradientCapture
    from gradian.index.build import build_index
    from gradian.model.loaded import LoadedModel
    from gradian.report.reader import read_report

    kind, seed = workdir.name.rsplit("-", 2)[-2:]
    scenario = make_scenario(kind, int(seed))
    report = read_report(workdir / "report")
    config = demo_config(scenario)  # the case's own index settings (exact, float16)
    attribution = config.attribution
    signal = validate_query_signal(config.evaluation.metric, config.evaluation.query_signal).effective
    final = load_case(workdir, base_model, config, report)
    item_ids = [item.id for item in final.items]
    checkpoints = run_checkpoints(workdir / "train" / "run")
    blames, built = [], []
    for step, folder, rate in checkpoints:
        began = time.perf_counter()
        loaded = LoadedModel.load(base_model, folder)
        index = build_index(loaded, final.examples, config, workdir / "checkpoint-indexes" / folder.name)
        seconds = time.perf_counter() - began
        case = dataclasses.replace(final, loaded=loaded, index=index,
                                   capture=GradientCapture.for_index(loaded, config.grads, index))
        blames.append(item_blame(case, signal))
        built.append({"step": step, "learning_rate": rate, "index_seconds": round(seconds, 1),
                      "index_bytes": index.disk_bytes(), "reused": index.reused})
        print(f"  {workdir.name} checkpoint-{step}: lr {rate:.3g}, index {seconds:.0f} s", flush=True)
        del loaded, case, index
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, report))
    ids = [e.id for e in final.examples]
    columns = list(range(len(item_ids)))

    def measured(weights: list[float], chosen: list[int]) -> dict[str, float]:
        matrix = sum(w * blames[c] for w, c in zip(weights, chosen, strict=True))
        blame = rescore_items(matrix, ids, item_ids, columns, aggregation=attribution.aggregation).blame
        m = truth.score(np.asarray(blame))
        return {"recall_at_k": m["recall_at_k"], "auprc": m["auprc"]}

    ensembles = {}
    for count in range(2, len(checkpoints) + 1):  # the shipped choice of points and weights (plan_ensemble)
        plan = plan_ensemble(count, workdir / "train" / "run", workdir / "train" / "adapter", final.loaded.adapter_hash)
        steps = [member.step for member in plan.members]
        chosen = [next(c for c, (step, _, _) in enumerate(checkpoints) if step == wanted) for wanted in steps]
        ensembles[f"attribution.checkpoints={count} (steps {', '.join(map(str, steps))})"] = measured(
            [member.weight for member in plan.members], chosen)
    for count in range(1, len(checkpoints) + 1):
        chosen = list(range(len(checkpoints) - count, len(checkpoints)))
        ensembles[f"last {count}, lr"] = measured([checkpoints[c][2] for c in chosen], chosen)
        ensembles[f"last {count}, uniform"] = measured([1.0] * count, chosen)
    print(f"  {workdir.name}: " + "; ".join(f"{k} {v['recall_at_k']:.2f} / {v['auprc']:.2f}"
                                             for k, v in ensembles.items()), flush=True)
    return {"case": workdir.name, "signal": signal, "preconditioner": attribution.preconditioner,
            "checkpoints": built, "ensembles": ensembles}


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """Per case: each checkpoint's index cost, and recall@k / AUPRC per ensemble."""
    lines = ["# Scoring with gradients at several checkpoints (TracIn-CP)", "", f"`{command}`", ""]
    for case in cases:
        lines += [f"## {case['case']}", "", f"Query signal {case['signal']}, preconditioner {case['preconditioner']}.",
                  "", "| checkpoint step | learning rate | index build (s) | index size |", "|---|---|---|---|"]
        for c in case["checkpoints"]:
            lines.append(f"| {c['step']} | {c['learning_rate']:.3g} | {c['index_seconds']:.0f}"
                         f"{' (reused)' if c['reused'] else ''} | {c['index_bytes'] / 1e9:.2f} GB |")
        lines += ["", "| checkpoints scored | recall@k / AUPRC |", "|---|---|"]
        lines += [f"| {name} | {m['recall_at_k']:.2f} / {m['auprc']:.2f} |" for name, m in case["ensembles"].items()]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/checkpoints.json and .md."""
    from finished_cases import rescoring_main

    return rescoring_main("checkpoints", __doc__.splitlines()[0], RESULTS, argv,
                          lambda workdir, args: score_case(workdir, args.base_model), markdown)


if __name__ == "__main__":
    raise SystemExit(main())
