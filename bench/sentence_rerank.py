"""Rows ranked by their most blamed sentence: does the span drill-down, run over a shortlist, lift recall@k?

A planted wrong sentence inside a long entry shares the entry's gradient with six true sentences, so the whole row's
blame is diluted (span cases: recall@k 0.60-0.85), while the drill-down finds the planted sentence within a planted
row almost always (bench/results/spans_checkpoints.md). This drills every row of a shortlist (the top
``--shortlist`` rows of the shipped ensemble's blame), at every point of the case's ensemble and against every
regressed item, under both sentence measures of ``gradian.query.spans`` (restricted: the sentence's own tokens in
the whole row; alone: the sentence as the whole answer). A sentence's blame is standardized per item with the
rows' mean and spread (the `mean` aggregation's z-score) and averaged over items, so it is on the rows' scale.
Rankings compared by recall@k / AUPRC of the planted rows:

- the rows' blame (the shipped ensemble, as `gradian attribute` ranks);
- each shortlisted row scored by its most blamed sentence;
- each shortlisted row scored by the larger of its own blame and its most blamed sentence's.

Sentence blames are saved in the case dir (sentence-rerank/); a second run re-scores without a gradient.

    .venv/bin/python bench/sentence_rerank.py --cases /work/bench-cases lr5e4-span-0 --shortlist 60
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy_methods, base_point, finished_cases

RESULTS = Path(__file__).resolve().parent / "results" / "sentence_rerank"
MEASURES = ("restricted", "alone")


def sentence_raw(case: Any, queries: np.ndarray, position: int) -> dict[str, np.ndarray]:
    """Raw blame -(query . g) [sentences, items] of each sentence of one row, under each measure."""
    import torch

    from gradian.data import encode
    from gradian.grads import collate, restrict_labels
    from gradian.query.spans import _alone, _token_spans

    tokenizer, width = case.loaded.tokenizer, case.config.grads.max_seq_length
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    example = case.examples[position]
    encoded = encode(example, tokenizer, width)
    spans = _token_spans(example, encoded)
    if not spans:
        return {measure: np.zeros((0, len(queries))) for measure in MEASURES}

    def blame(batch: Any) -> np.ndarray:
        return -(case.capture.capture(batch).detach().numpy().astype(np.float64) @ queries.T)

    alone, restricted, whole = [], [], collate([encoded], pad)
    for start in range(0, len(spans), 8):
        chunk = spans[start:start + 8]
        alone.append(blame(collate([encode(_alone(example, s[5], s[1], s[2]), tokenizer, width) for s in chunk], pad)))
        keep = torch.zeros((len(chunk), whole.labels.shape[1]), dtype=torch.bool)
        for row, span in enumerate(chunk):
            keep[row, span[3]:span[4]] = True
        restricted.append(blame(type(whole)(whole.input_ids.expand(len(chunk), -1),
                                            whole.attention_mask.expand(len(chunk), -1),
                                            restrict_labels(whole.labels.expand(len(chunk), -1), keep))))
    return {"alone": np.concatenate(alone), "restricted": np.concatenate(restricted)}


def _sentence_blames(workdir: Path, base_model: str, config: Any, report: Any, shortlist: np.ndarray,
                     steps: list[int]) -> dict[str, np.ndarray]:
    """``{measure}_{step}_{row}`` -> raw sentence blame, from sentence-rerank/ or computed and saved there."""
    from accuracy_methods import ensemble_points, load_case, preconditioner, query

    from gradian.evaluation.query_signal import validate_query_signal

    saved = workdir / "sentence-rerank" / "blames.npz"
    if saved.is_file():
        with np.load(saved) as held:
            if np.array_equal(held["shortlist"], shortlist):
                return {key: held[key] for key in held.files}
    signal = validate_query_signal(config.evaluation.metric, config.evaluation.query_signal).effective
    final, began, blames = load_case(workdir, base_model, config, report), time.perf_counter(), {}
    for (member, case), step in zip(ensemble_points(final, workdir), steps, strict=True):
        queries = preconditioner(case, config.attribution.preconditioner).apply(query(case, signal))
        for position in shortlist:
            for measure, raw in sentence_raw(case, queries, int(position)).items():
                blames[f"{measure}_{step}_{position}"] = raw
        print(f"  {workdir.name} step {member.step}: {time.perf_counter() - began:.0f} s", flush=True)
    saved.parent.mkdir(parents=True, exist_ok=True)
    np.savez(saved, shortlist=shortlist, **blames)
    (saved.parent / "cost.json").write_text(json.dumps({"seconds": round(time.perf_counter() - began, 1)}))
    return {"shortlist": shortlist, **blames}


def rankings(workdir: Path, base_model: str, shortlist_size: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Each ranking's per-row scores, and the shortlist drilled (the top rows of the shipped ensemble's blame)."""
    from base_point import _scored_points

    from gradian.attribution.aggregation import zscores
    from gradian.config import load_config
    from gradian.report.reader import read_report

    report = read_report(workdir / "report")
    config = load_config(workdir / "config.yaml")
    points = _scored_points(workdir, base_model, config, report)  # each member's per-item blame, saved
    summed = sum(weight * blame for _, weight, blame in points["members"])
    mean, spread = summed.mean(axis=0), summed.std(axis=0)
    rows = zscores(summed, mean, spread).mean(axis=1)  # the `mean` aggregation of the shipped ensemble
    shortlist = np.argsort(-rows, kind="stable")[:shortlist_size]
    steps = [step for step, _, _ in points["members"]]
    blames = _sentence_blames(workdir, base_model, config, report, shortlist, steps)
    ranked: dict[str, np.ndarray] = {"rows' blame (shipped)": rows}
    for measure in MEASURES:
        best, larger = rows.copy(), rows.copy()
        for position in shortlist:
            sentences = sum(weight * blames[f"{measure}_{step}_{position}"] for step, weight, _ in points["members"])
            if len(sentences):
                best[position] = zscores(sentences, mean, spread).mean(axis=1).max()
                larger[position] = max(best[position], rows[position])
        ranked[f"{measure}: most blamed sentence"] = best
        ranked[f"{measure}: max(row, sentence)"] = larger
    return ranked, shortlist


def score_case(workdir: Path, base_model: str, shortlist_size: int) -> dict[str, Any]:
    """Recall@k / AUPRC of the rows' blame and of the shortlist re-ranked by its rows' most blamed sentence."""
    from gradian.demo.run import reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.report.reader import read_report

    kind, seed = workdir.name.rsplit("-", 2)[-2:]
    scenario = make_scenario(kind, int(seed))
    ranked, shortlist = rankings(workdir, base_model, shortlist_size)
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, read_report(workdir / "report")))
    measured = {name: {k: truth.score(blame)[k] for k in ("recall_at_k", "auprc")} for name, blame in ranked.items()}
    in_shortlist = len(set(truth.planted_rows) & {int(p) for p in shortlist}) / max(len(truth.planted_rows), 1)
    cost = json.loads((workdir / "sentence-rerank" / "cost.json").read_text())
    print(f"  {workdir.name}: " + "; ".join(f"{k} {v['recall_at_k']:.2f}" for k, v in measured.items()), flush=True)
    return {"case": workdir.name, "shortlist": shortlist_size, "planted_in_shortlist": in_shortlist,
            "seconds": cost["seconds"], "rankings": measured}


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One table: per case, recall@k / AUPRC of each ranking, the planted share of the shortlist and its cost."""
    from finished_cases import recall_cells, recall_table_head

    names = list(cases[0]["rankings"]) if cases else []
    lines = recall_table_head("Rows ranked by their most blamed sentence", command, names,
                              ["planted rows in the shortlist", "sentence blames"])
    for case in cases:
        lines.append(f"| {case['case']} | {recall_cells(case['rankings'], names)} | {case['planted_in_shortlist']:.2f} "
                     f"of them in the top {case['shortlist']} | {case['seconds']:.0f} s |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/sentence_rerank.json and .md."""
    from finished_cases import rescoring_main

    def options(parser: Any) -> None:
        parser.add_argument("--shortlist", type=int, default=60, help="rows drilled: the top N of the rows' blame")

    return rescoring_main("sentence_rerank", __doc__.splitlines()[0], RESULTS, argv,
                          lambda workdir, args: score_case(workdir, args.base_model, args.shortlist), markdown,
                          options)


if __name__ == "__main__":
    raise SystemExit(main())
