"""The divergent-token query's two terms weighed apart: B(beta) = (1 - beta) Bw - beta Bg, on finished cases.

The shipped query of a regressed item is unit(w) - unit(g), w and g the gradients of the wanted and the generated
answer's loss at the first token where the two part. Blame is linear in the query, so each term's per-item blame
(Bw, Bg) is scored once, at every point of the case's checkpoint ensemble (or the adapter alone with
``--final-only``), summed with the ensemble's weights, and mixed per beta: 0.5 is the shipped query up to scale, 1
the generated term alone (what taught the model the answer it now gives), 0 the wanted term alone. Each mix is
ranked as the case's report ranks (ranking, item weights, cluster prior) within the report's causes, as the goal
table scores them (``goal_table.score_by_cause``). With the full ensemble, ``shipped_corr`` is the correlation of
Bw - Bg with the report's own per-item blame (scores.csv): 1.0 when the rescoring reproduces the product.
Each checkpoint's index is built into the index cache and removed once scored (2.2 GB a point at 400 rows).
``--damping-ratios`` scores the same terms again under Kronecker fits damped by other ratios (the sample's moments
fitted once, every ratio's queries in the same pass over the index) and adds their table at the shipped beta.

    .venv/bin/python bench/query_terms.py --final-only --out bench/results/query_terms_tuning \\
        --cases /work/bench-cases shared-lr5e4-format-1 kurt-lr5e4-span-7
    .venv/bin/python bench/query_terms.py --cases /work/bench-cases shared-lr5e4-format-3 s54-lr5e4-span-3
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "query_terms"
BETAS = ("0.0", "0.25", "0.5", "0.75", "1.0")


def term_blames(final: Any, workdir: Path, whole_answer: set[str], final_only: bool,
                damping_ratios: tuple[float | None, ...] = (None,)) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per damping ratio (None: the case's), (Bw, Bg): each term's per-item blame [examples, items], summed over the
    scored points with their weights."""
    from accuracy_methods import damped_preconditioners, ensemble_points, preconditioned_blame

    from gradian.cache import index_cache_dir
    from gradian.query.signals import _divergence_terms, _unit, _wanted

    prompts = final.prompts
    wanted = [(prompts[item.id], _wanted(item, item.base_score > item.finetuned_score)[0]) for item in final.items]
    generated = [(prompts[item.id], item.finetuned_output or "") for item in final.items]
    first_only = [item.id not in whole_answer for item in final.items]  # divergent-token's, as shipped
    item_ids = [item.id for item in final.items]
    points = ([(True, 1.0, final)] if final_only else
              ((member.is_adapter, member.weight, case) for member, case in ensemble_points(final, workdir)))
    sums: Any = 0.0
    for is_adapter, weight, case in points:
        terms = _divergence_terms(case.capture, case.loaded.tokenizer, wanted, generated,
                                  case.config.grads.max_seq_length, case.config.grads.batch_size, first_only=first_only)
        # every ratio's two terms in one pass over the index (2 GB a point), told apart by their columns
        queries = [pre.apply(_unit(rows)) for pre in
                   damped_preconditioners(case, case.config.attribution.preconditioner, damping_ratios)
                   for rows in terms]
        columns = [f"{n}:{item}" for n in range(len(queries)) for item in item_ids]
        sums = sums + weight * preconditioned_blame(case, np.concatenate(queries), columns)
        if not is_adapter and case.index.path.parent == index_cache_dir():  # 2 GB a checkpoint: one on disk at a time
            shutil.rmtree(case.index.path)
    blocks = np.split(np.asarray(sums), 2 * len(damping_ratios), axis=1)
    return [(blocks[2 * n], blocks[2 * n + 1]) for n in range(len(damping_ratios))]


def scored_as_goal_table(document: dict[str, Any], item_ids: list[str], scenario: Any, truth: Any,
                         blame_of: Any) -> dict[str, float]:
    """recall@k / AUPRC as the goal table scores a report: each planted cluster in the cause accusing it, else (one
    cause, or planted rows filed among clean ones) the report's own ranking, the highest standardized blame over two
    or more accusing causes."""
    from goal_table import score_by_cause

    from gradian.attribution.causes import highest_standardized

    causes = document.get("causes") or []
    if len(causes) < 2 or scenario.planted_clusters:
        return score_by_cause(document, item_ids, scenario, truth, blame_of)
    blames = [blame_of([item_ids.index(item) for item in cause["items"]], list(cause["accused_clusters"]))
              for cause in causes]
    accusing = [blame for cause, blame in zip(causes, blames, strict=True) if cause["accused_clusters"]]
    metrics = truth.score(highest_standardized(accusing) if len(accusing) >= 2 else blames[0])
    return {"recall_at_k": metrics["recall_at_k"], "auprc": metrics["auprc"]}


def score_case(workdir: Path, base_model: str, final_only: bool,
               damping_ratios: tuple[float, ...] = ()) -> dict[str, Any]:
    """recall@k / AUPRC per beta on one case (and per beta at each other damping ratio), and how closely beta 0.5
    reproduces the report's blame."""
    from accuracy_methods import load_case
    from cluster_prior import shrunk
    from finished_cases import planted_case
    from goal_table import case_scenario, report_item_blame, report_ranking

    from gradian.attribution.scoring import rescore_items
    from gradian.config import load_config

    started = time.monotonic()
    row, report, truth = planted_case(workdir)
    if truth is None:
        return row
    scenario = case_scenario(workdir)
    document = json.loads((workdir / "report" / "report.json").read_text())
    config = load_config(workdir / "config.yaml")
    # every point, the adapter alone included, fitted as the shipped ensemble fits one (kronecker_wide auto's diagonal
    # wide side), so --final-only isolates the ensemble's own effect
    final = dataclasses.replace(load_case(workdir, base_model, config, report), scored_alone=False)
    whole_answer = set(document["query_signal"].get("whole_answer_items") or ())
    (wanted, generated), *damped = term_blames(final, workdir, whole_answer, final_only, (None, *damping_ratios))
    item_ids = [item.id for item in final.items]
    ids = [example.id for example in final.examples]
    settings = document["provenance"]["config"]["attribution"]
    sources = [str(example.fields.get(settings["cluster_field"], "")) for example in final.examples]

    def ranked(matrix: np.ndarray) -> Any:
        def blame(columns: list[int], accused: list[str]) -> np.ndarray:
            scores = rescore_items(matrix, ids, item_ids, columns, aggregation=report_ranking(settings),
                                   normalize=settings["normalize"], item_weights=settings.get("item_weights", "uniform"))
            prior = settings.get("cluster_prior") or 0.0
            return shrunk(np.asarray(scores.blame), sources, accused, prior, "accused") if prior else scores.blame
        return blame

    def by_beta(wanted: np.ndarray, generated: np.ndarray) -> dict[str, dict[str, float]]:
        return {beta: scored_as_goal_table(document, item_ids, scenario, truth,
                                           ranked((1 - float(beta)) * wanted - float(beta) * generated))
                for beta in BETAS}

    row["betas"] = by_beta(wanted, generated)
    if damping_ratios:
        row["shipped_damping"] = config.attribution.damping_ratio
        row["shipped_beta"] = f"{config.evaluation.generated_weight:g}"  # the generated weight the case runs with
        row["damping"] = {f"{ratio:g}": by_beta(*pair) for ratio, pair in zip(damping_ratios, damped, strict=True)}
    _, report_items, report_matrix = report_item_blame(workdir / "report")
    shared = [item for item in item_ids if item in report_items]
    shipped = (wanted - generated)[:, [item_ids.index(item) for item in shared]]
    row["shipped_corr"] = float(np.corrcoef(shipped.ravel(),
                                            report_matrix[:, [report_items.index(i) for i in shared]].ravel())[0, 1])
    row.update(final_only=final_only, items=len(item_ids), seconds=round(time.monotonic() - started))
    print(f"  {workdir.name}: " + "; ".join(f"beta {beta} {m['recall_at_k']:.3f} / {m['auprc']:.2f}"
                                             for beta, m in row["betas"].items())
          + f" (corr with the report {row['shipped_corr']:.3f}, {row['seconds']} s)", flush=True)
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """recall@k / AUPRC per beta and case, the mean per kind group and over every case."""
    scored = [case for case in cases if "betas" in case]
    points = "the adapter alone" if scored and scored[0]["final_only"] else "every point of the checkpoint ensemble"
    lines = ["# The divergent-token query's two terms weighed apart", "", f"`{command}`", "",
             f"B(beta) = (1 - beta) Bw - beta Bg at {points}, ranked as each report ranks; recall@k / AUPRC. "
             "beta 0.5 is the shipped query; corr: Bw - Bg against the report's per-item blame.", "",
             "| case | " + " | ".join(f"beta {beta}" for beta in BETAS) + " | corr |",
             "|---|" + "---|" * (len(BETAS) + 1)]
    for case in scored:
        lines.append(f"| {case['case']} | " + " | ".join(
            f"{case['betas'][beta]['recall_at_k']:.3f} / {case['betas'][beta]['auprc']:.2f}" for beta in BETAS)
            + f" | {case['shipped_corr']:.3f} |")
    groups = {"format + span": ("format", "span"), "fact + two causes": ("fact", "two_causes"),
              "every case": None}
    for label, kinds in groups.items():
        members = [case for case in scored if kinds is None or case["kind"] in kinds]
        if members:
            lines.append(f"| **mean, {label}** | " + " | ".join(
                f"**{np.mean([c['betas'][beta]['recall_at_k'] for c in members]):.3f} / "
                f"{np.mean([c['betas'][beta]['auprc'] for c in members]):.2f}**" for beta in BETAS) + " | |")
    damped = [case for case in scored if "damping" in case]
    if damped:
        lines += ["", *damping_table(damped)]
    return "\n".join(lines) + "\n"


def damping_table(cases: list[dict[str, Any]]) -> list[str]:
    """recall@k / AUPRC per Kronecker damping ratio at the shipped generated weight, and the mean at every beta."""
    shipped, beta_shipped = f"{cases[0]['shipped_damping']:g}", cases[0]["shipped_beta"]
    ratios = sorted({shipped, *cases[0]["damping"]}, key=float)

    def at(case: dict[str, Any], ratio: str) -> dict[str, dict[str, float]]:
        return case["betas"] if ratio == shipped else case["damping"][ratio]

    names = [f"{ratio} (shipped)" if ratio == shipped else ratio for ratio in ratios]
    lines = [f"The Kronecker fit's damping ratio (lambda = ratio x the mean second moment) at beta {beta_shipped}, "
             "the shipped generated weight; recall@k / AUPRC:", "",
             "| case | " + " | ".join(f"ratio {name}" for name in names) + " |", "|---|" + "---|" * len(ratios)]
    for case in cases:
        lines.append(f"| {case['case']} | " + " | ".join(
            f"{at(case, r)[beta_shipped]['recall_at_k']:.3f} / {at(case, r)[beta_shipped]['auprc']:.2f}"
            for r in ratios) + " |")
    for beta in BETAS:
        lines.append(f"| **mean, beta {beta}** | " + " | ".join(
            f"**{np.mean([at(c, r)[beta]['recall_at_k'] for c in cases]):.3f} / "
            f"{np.mean([at(c, r)[beta]['auprc'] for c in cases]):.2f}**" for r in ratios) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/query_terms.json and .md (or --out)."""
    from finished_cases import indexed_main

    def options(parser: Any) -> None:
        parser.add_argument("--final-only", action="store_true", help="score at the adapter alone, no checkpoints")
        parser.add_argument("--damping-ratios", type=float, nargs="*", default=[],
                            help="score again at these Kronecker damping ratios (the config's is always scored)")

    return indexed_main("query_terms", __doc__.splitlines()[0], RESULTS, argv,
                        lambda workdir, args: score_case(workdir, args.base_model, args.final_only,
                                                         tuple(args.damping_ratios)),
                        markdown, options)


if __name__ == "__main__":
    raise SystemExit(main())
