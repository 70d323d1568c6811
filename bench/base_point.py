"""The base model as one more point of the checkpoint ensemble: does blame measured before training help?

TracIn-CP sums influence along the run, and bench/results/checkpoints.md found the earlier checkpoints carry the
signal the final adapter lost (the planted rows are fitted by then). The earliest point of any run is the base
model itself, and it needs no saved checkpoint: the adapter with its B matrices zeroed computes exactly the base
model (B A x = 0), and there the gradient of a LoRA block is dL/dB = dL/dW A^T (and dL/dA = B^T dL/dW = 0), the
base model's full weight gradient seen through the subspace the fine-tune's A matrices picked. For each finished
case this scores that point as the product scores a checkpoint (its own index in the index cache, the same query
signal, preconditioner and items) and compares, by recall@k / AUPRC of the planted rows:

- the shipped ensemble (``attribution.checkpoints`` members, learning-rate weighted, as ``gradian attribute`` ran);
- the shipped ensemble plus the base point, weighted by the learning rate logged first (TracIn-CP's step-0 term,
  which a warmup from 0 makes 0);
- the shipped ensemble and the base point each scaled to unit norm, the base point given a share of 1/4, 1/2, 3/4;
- the base point alone;
- for a run that kept no checkpoints (most users' runs score the adapter alone): the adapter alone, and with the
  base point at the same shares.

Each case's per-item blame at every point is saved in its work dir (base-point/blames.npz), and a second run
re-scores from there without a gradient.

    .venv/bin/python bench/base_point.py --cases /work/bench-cases lr5e4-fact-0
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy_methods, finished_cases next to this file

RESULTS = Path(__file__).resolve().parent / "results" / "base_point"
SHARES = (0.25, 0.5, 0.75)  # the base point's part of the unit-norm blame


def _scored_points(workdir: Path, base_model: str, config: Any, report: Any) -> dict[str, Any]:
    """Each member's and the base point's per-item blame, saved beside the case (base-point/) and reused from there."""
    import dataclasses
    import json

    from accuracy_methods import ensemble_points, item_blame, load_case

    from gradian.evaluation.query_signal import validate_query_signal
    from gradian.grads.capture import GradientCapture
    from gradian.index.build import build_index
    from gradian.model.adapter_swap import base_point_weights

    saved, cost_file = workdir / "base-point" / "blames.npz", workdir / "base-point" / "cost.json"
    if saved.is_file() and cost_file.is_file():
        kept = json.loads(cost_file.read_text())
        with np.load(saved) as held:
            return {"members": [(m["step"], m["weight"], held[f"step_{m['step']}"]) for m in kept["members"]],
                    "base": held["base"], "cost": kept["base_point"]}
    signal = validate_query_signal(config.evaluation.metric, config.evaluation.query_signal).effective
    final = load_case(workdir, base_model, config, report)
    members = []
    for member, case in ensemble_points(final, workdir):
        members.append((member.step, member.weight, item_blame(case, signal)))
        print(f"  {workdir.name} step {member.step}: weight {member.weight:.3g}", flush=True)
    saved.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with base_point_weights(final.loaded) as view:  # what `gradian attribute` scores with attribution.base_point
        index = build_index(view, final.examples, config, None)  # kept in the index cache, as a checkpoint's
        seconds = time.perf_counter() - began
        base_case = dataclasses.replace(final, loaded=view, index=index,
                                        capture=GradientCapture.for_index(view, config.grads, index))
        base = item_blame(base_case, signal)
    print(f"  {workdir.name} base point: index {seconds:.0f} s{' (reused)' if index.reused else ''}", flush=True)
    cost = {"index_seconds": round(seconds, 1), "index_bytes": index.disk_bytes(), "reused": index.reused}
    np.savez(saved, base=base, **{f"step_{step}": blame for step, _, blame in members})
    cost_file.write_text(json.dumps({"members": [{"step": step, "weight": weight} for step, weight, _ in members],
                                     "base_point": cost}))
    return {"members": members, "base": base, "cost": cost}


def score_case(workdir: Path, base_model: str) -> dict[str, Any]:
    """The shipped ensemble's members and the base point, each scored; recall@k / AUPRC of their combinations."""
    from gradian.attribution.checkpoint_ensemble import logged_rates, rate_at, with_base_point
    from gradian.attribution.scoring import rescore_items
    from gradian.config import load_config
    from gradian.data import load_dataset
    from gradian.demo.run import reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.report.reader import read_report
    from gradian.runs import read_run

    kind, seed = workdir.name.rsplit("-", 2)[-2:]
    scenario = make_scenario(kind, int(seed))
    report = read_report(workdir / "report")
    config = load_config(workdir / "config.yaml")  # as the case ran: its points, signal and preconditioner
    points = _scored_points(workdir, base_model, config, report)
    members, base = points["members"], points["base"]
    # TracIn-CP's own weight for the base point: the learning rate at step 0 on the ensemble's lr / sum lr scale
    rates = logged_rates(read_run(workdir / "train" / "run"))
    first_rate = rate_at(rates, 0)
    member_rates = [rate_at(rates, step) for step, _, _ in members]
    lr_share = first_rate / (float(sum(member_rates)) + first_rate)
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, report))
    ids = [example.id for example in load_dataset(workdir / "scenario" / "train.jsonl")]
    item_ids = [f"item-{column}" for column in range(base.shape[1])]

    def measured(matrix: np.ndarray) -> dict[str, float]:
        blame = rescore_items(matrix, ids, item_ids, range(len(item_ids)),
                              aggregation=config.attribution.aggregation).blame
        m = truth.score(np.asarray(blame))
        return {"recall_at_k": m["recall_at_k"], "auprc": m["auprc"]}

    shipped = sum(weight * blame for _, weight, blame in members)
    combos = {"shipped ensemble": measured(shipped),
              "+ base point, TracIn lr share": measured((1 - lr_share) * shipped + lr_share * base)}
    for share in SHARES:  # as attribution.base_point mixes: each side scaled to unit norm first
        combos[f"+ base point, share {share}"] = measured(with_base_point(shipped, base, share))
    combos["base point alone"] = measured(base)
    # a run with no checkpoints kept (most users' runs): the adapter alone (ensemble_points yields it last)
    adapter = members[-1][2]
    combos["adapter alone"] = measured(adapter)
    for share in SHARES:
        combos[f"adapter + base point, share {share}"] = measured(with_base_point(adapter, base, share))
    print(f"  {workdir.name}: " + "; ".join(f"{k} {v['recall_at_k']:.2f} / {v['auprc']:.2f}"
                                             for k, v in combos.items()), flush=True)
    return {"case": workdir.name, "members": [{"step": step, "weight": weight} for step, weight, _ in members],
            "base_point": {"learning_rate": first_rate, "lr_share": lr_share, **points["cost"]},
            "ensembles": combos}


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One table: per case, recall@k / AUPRC of each combination, and the base point's index cost."""
    from finished_cases import recall_cells, recall_table_head

    names = list(cases[0]["ensembles"]) if cases else []
    lines = recall_table_head("The base model as a point of the checkpoint ensemble", command, names,
                              ["TracIn lr share", "base point's index"])
    for case in cases:
        base = case["base_point"]
        cost = f"{base['index_seconds']:.0f} s, {base['index_bytes'] / 1e9:.2f} GB"
        lines.append(f"| {case['case']} | {recall_cells(case['ensembles'], names)} | {base['lr_share']:.2f} | {cost} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/base_point.json and .md."""
    from finished_cases import rescoring_main

    return rescoring_main("base_point", __doc__.splitlines()[0], RESULTS, argv,
                          lambda workdir, args: score_case(workdir, args.base_model), markdown)


if __name__ == "__main__":
    raise SystemExit(main())
