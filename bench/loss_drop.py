"""How far the fine-tune moved each row, as a prior on blame: does weighting by the row's loss drop find the planted rows?

Influence asks how a row's gradient lines up with the query; it does not ask whether the fine-tune learned the row
at all. A planted row the adapter fitted has a lower loss under the adapter than under the base model, so the
loss drop (base model's mean supervised-token loss on the row minus the adapter's) looks like a cheap prior: it
needs two forward passes, no gradient. For each finished case this measures, by recall@k / AUPRC of the planted
rows and by what the permutation test accuses (``gradian.attribution.clusters``, the case's own cluster field):

- the shipped ensemble's blame and the adapter's alone (saved by bench/base_point.py, scored again if not);
- the loss drop alone, and the drop relative to the base model's loss;
- blame x the positive part of the drop (mean-scaled), and blame x the drop's rank in [0, 1];
- for the adapter and the ensemble, the base point (bench/base_point.py) weighted by the positive drop at share 1/2.

Row losses are saved beside the case (loss-drop/row_loss.npz); a second run re-scores without a model pass.

    .venv/bin/python bench/loss_drop.py --cases /work/bench-cases lr5e4-fact-0 lr5e4-span-0
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # base_point, finished_cases next to this file

RESULTS = Path(__file__).resolve().parent / "results" / "loss_drop"


def row_losses(workdir: Path, base_model: str, config: Any, examples: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's mean supervised-token loss under the base model and under the adapter, saved in the case dir."""
    import torch

    from gradian.data import encode
    from gradian.grads import collate
    from gradian.grads.loss import supervised_loss
    from gradian.model.adapter_swap import base_point_weights
    from gradian.model.loaded import LoadedModel

    saved = workdir / "loss-drop" / "row_loss.npz"
    if saved.is_file():
        with np.load(saved) as held:
            return held["base"], held["adapter"]
    loaded = LoadedModel.load(base_model, workdir / "train" / "adapter")
    tokenizer, grads = loaded.tokenizer, config.grads
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = [encode(example, tokenizer, grads.max_seq_length) for example in examples]

    def losses(model: torch.nn.Module) -> np.ndarray:
        with torch.no_grad():
            return np.concatenate([supervised_loss(model, collate(encoded[at:at + grads.batch_size], pad), "mean")
                                   .per_example.numpy() for at in range(0, len(encoded), grads.batch_size)])

    adapter = losses(loaded.model)
    with base_point_weights(loaded) as view:  # the adapter's B matrices zeroed: exactly the base model
        base = losses(view.model)
    saved.parent.mkdir(parents=True, exist_ok=True)
    np.savez(saved, base=base, adapter=adapter)
    return base, adapter


def score_case(workdir: Path, base_model: str) -> dict[str, Any]:
    """Recall@k / AUPRC and the accused clusters of blame, the loss drop, and blame weighted by the drop."""
    from base_point import _scored_points

    from gradian.attribution.checkpoint_ensemble import with_base_point
    from gradian.attribution.clusters import cluster_blame, clusters_from_field
    from gradian.attribution.scoring import rescore_items
    from gradian.config import load_config
    from gradian.data import load_dataset
    from gradian.demo.run import reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.report.reader import read_report

    kind, seed = workdir.name.rsplit("-", 2)[-2:]
    scenario = make_scenario(kind, int(seed))
    report = read_report(workdir / "report")
    config = load_config(workdir / "config.yaml")
    examples = load_dataset(workdir / "scenario" / "train.jsonl")
    ids = [example.id for example in examples]
    points = _scored_points(workdir, base_model, config, report)
    items = [f"item-{column}" for column in range(points["base"].shape[1])]

    def blame_of(matrix: np.ndarray) -> np.ndarray:
        return np.asarray(rescore_items(matrix, ids, items, range(len(items)),
                                        aggregation=config.attribution.aggregation).blame)

    shipped = blame_of(sum(weight * blame for _, weight, blame in points["members"]))
    adapter, base_point = blame_of(points["members"][-1][2]), blame_of(points["base"])
    before, after = row_losses(workdir, base_model, config, examples)
    drop = before - after
    moved = np.clip(drop, 0.0, None) / (float(np.clip(drop, 0.0, None).mean()) or 1.0)
    drop_rank = np.argsort(np.argsort(drop)) / max(len(drop) - 1, 1)
    rankings = {"shipped ensemble": shipped, "adapter alone": adapter, "loss drop": drop,
                "relative loss drop": drop / np.maximum(before, 1e-6)}
    for name, blame in (("shipped ensemble", shipped), ("adapter alone", adapter)):
        rankings[f"{name} x drop"] = blame * moved
        rankings[f"{name} x drop rank"] = blame * drop_rank
        rankings[f"{name} + base point x drop, share 0.5"] = with_base_point(blame, base_point * moved, 0.5)
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, report)) if kind != "clean" else None
    clusters = clusters_from_field(examples, config.attribution.cluster_field or "source")
    measured = {}
    for name, blame in rankings.items():
        accusation = cluster_blame(blame, clusters, permutations=config.attribution.permutations,
                                   seed=config.attribution.seed)
        scores = truth.score(blame) if truth is not None else {}
        measured[name] = {"recall_at_k": scores.get("recall_at_k"), "auprc": scores.get("auprc"),
                          "accused": [score.name for score in accusation.accused_all]}
    planted = np.zeros(len(ids), dtype=bool)
    planted[list(truth.planted_rows) if truth is not None else []] = True
    print(f"  {workdir.name}: " + "; ".join(f"{k} {v['recall_at_k']} {v['accused']}" for k, v in measured.items()),
          flush=True)
    return {"case": workdir.name, "planted_cluster": scenario.planted_cluster,
            "mean_drop": {"planted": float(drop[planted].mean()) if planted.any() else None,
                          "other": float(drop[~planted].mean())},
            "rankings": measured}


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One table: per case and ranking, recall@k / AUPRC and what the permutation test accuses."""
    names = list(cases[0]["rankings"]) if cases else []
    lines = ["# The row's loss drop (base model -> adapter) as a prior on blame", "", f"`{command}`", "",
             "Each cell: recall@k / AUPRC of the planted rows; the clusters the permutation test accuses.", "",
             "| ranking | " + " | ".join(case["case"] for case in cases) + " |",
             "|---|" + "---|" * len(cases)]

    def cell(row: dict[str, Any]) -> str:
        accused = ", ".join(f"`{name}`" for name in row["accused"]) or "nothing"
        if row["recall_at_k"] is None:
            return accused
        return f"{row['recall_at_k']:.2f} / {row['auprc']:.2f}; {accused}"

    for name in names:
        lines.append(f"| {name} | " + " | ".join(cell(case["rankings"][name]) for case in cases) + " |")
    lines += ["", "| case | planted cluster | mean loss drop, planted rows | mean loss drop, other rows |",
              "|---|---|---|---|"]
    for case in cases:
        planted = case["mean_drop"]["planted"]
        lines.append(f"| {case['case']} | {case['planted_cluster'] or '-'} | "
                     f"{'-' if planted is None else f'{planted:.3f}'} | {case['mean_drop']['other']:.3f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/loss_drop.json and .md."""
    from finished_cases import rescoring_main

    return rescoring_main("loss_drop", __doc__.splitlines()[0], RESULTS, argv,
                          lambda workdir, args: score_case(workdir, args.base_model), markdown)


if __name__ == "__main__":
    raise SystemExit(main())
