"""Query signals and self-influence normalization on finished accuracy cases (issue 12's methods 1 and 5).

For each finished case (a demo work dir of bench/accuracy.py: the trained adapter, the report, the exact index),
the training rows are ranked by the default scoring (diagonal preconditioner, mean of item z-scores) under:

- query signals: contrastive (whole answers, unit terms), divergence (the same pair supervised from its first
  differing token, conditioned on the shared prefix), divergent-token (that token alone, unit terms), margin (that
  token alone, raw), generated (minus the fine-tuned answer's loss alone: what taught the model what it now says);
- self-influence normalization of the contrastive blame: blame_i / (g_i P g_i)^(alpha / 2) for several alpha
  (0 = raw dot, the default; 1 = RelatIF's theta-relative influence, a cosine in the preconditioner's metric).

Cases are the tuning seeds (0-2): this chooses, it does not report final numbers.

    .venv/bin/python bench/query_signals.py --cases /work/bench-cases fact-0 fact-1 format-0 span-0
    .venv/bin/python bench/query_signals.py --cases /work/bench-cases lr5e4-behaviour-0 --preconditioner kronecker
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy, accuracy_methods, projection next to this file

RESULTS = Path(__file__).resolve().parent / "results" / "query_signals"
SIGNALS = ("contrastive", "divergence", "divergent-token", "margin", "generated")
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
ROWS_PER_READ = 32  # exact SmolLM2 rows are ~10 MB each


def item_scores(case: Any, queries: np.ndarray, pre: Any,
                known: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Raw blame [n, items] and each row's self-influence g P g, in one pass over the exact index.

    Self-influence depends on the rows alone, so a second signal passes the first one's as ``known``.
    """
    pq = pre.apply(queries).astype(np.float32)
    scale = np.asarray(getattr(pre, "scale", None), dtype=np.float32)  # a diagonal's; kronecker has no vector
    raw, self_influence = [], []
    for _, chunk in case.index.iter_chunks(ROWS_PER_READ):
        raw.append(-(chunk @ pq.T).astype(np.float64))
        if known is not None:
            continue
        if scale.ndim == 1:
            self_influence.append(np.einsum("ij,ij,j->i", chunk, chunk, scale, dtype=np.float64))
        else:
            self_influence.append(np.einsum("ij,ij->i", chunk, pre.apply(chunk), dtype=np.float64))
    return np.concatenate(raw), known if known is not None else np.concatenate(self_influence)


def aggregated(raw: np.ndarray, self_influence: np.ndarray, alpha: float) -> np.ndarray:
    """Mean over items of the item-standardized blame after dividing each row by its self-influence^(alpha / 2)."""
    from gradian.attribution.aggregation import mean_zscore

    touched = self_influence > 0
    blame = np.where(touched[:, None], raw / np.where(touched, self_influence, 1.0)[:, None] ** (alpha / 2), 0.0)
    return mean_zscore(blame, blame.mean(axis=0), blame.std(axis=0))


def score_case(workdir: Path, base_model: str, preconditioner_kind: str = "diagonal") -> dict[str, Any]:
    """recall@k and AUPRC of every signal and every alpha on one case."""
    from accuracy_methods import load_case, preconditioner, query
    from goal_table import case_name
    from projection import exact_config

    from gradian.demo.run import reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.report.reader import read_report

    kind, seed = case_name(workdir)  # fact-0, or a demo case dir such as lr5e4-behaviour-0
    scenario = make_scenario(kind, seed)
    report = read_report(workdir / "report")
    case = load_case(workdir, base_model, exact_config(scenario), report)
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, report))
    pre = preconditioner(case, preconditioner_kind)

    def measured(blame: np.ndarray) -> dict[str, float]:
        metrics = truth.score(blame)
        return {"recall_at_k": metrics["recall_at_k"], "auprc": metrics["auprc"]}

    out: dict[str, Any] = {"case": workdir.name, "kind": kind, "seed": seed, "items": len(case.items),
                           "preconditioner": preconditioner_kind, "signals": {}, "alphas": {}}
    self_influence = None
    for signal in SIGNALS:
        raw, self_influence = item_scores(case, query(case, signal), pre, self_influence)
        out["signals"][signal] = measured(aggregated(raw, self_influence, 0.0))
        if signal == "contrastive":
            out["alphas"] = {str(alpha): measured(aggregated(raw, self_influence, alpha)) for alpha in ALPHAS}
    print(f"  {workdir.name}: " + "; ".join(f"{name} {m['recall_at_k']:.2f} / {m['auprc']:.2f}"
                                             for name, m in out["signals"].items())
          + " | alpha " + "; ".join(f"{a} {m['recall_at_k']:.2f} / {m['auprc']:.2f}" for a, m in out["alphas"].items()),
          flush=True)
    return out


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """Two tables (signals, alphas): recall@k / AUPRC per case and the mean over cases."""
    lines = ["# Query signals and self-influence normalization (tuning seeds)", "", f"`{command}`", "",
             f"Exact index at the final adapter, {cases[0].get('preconditioner', 'diagonal')} preconditioner, mean of "
             "item z-scores; recall@k / AUPRC per case.", ""]
    for title, key, names in (("Query signal", "signals", list(SIGNALS)),
                              ("Self-influence power alpha (contrastive query)", "alphas", [str(a) for a in ALPHAS])):
        lines += [f"## {title}", "", "| case | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for case in cases:
            lines.append(f"| {case['case']} | " + " | ".join(
                f"{case[key][n]['recall_at_k']:.2f} / {case[key][n]['auprc']:.2f}" if n in case[key] else "-"
                for n in names) + " |")
        means = [(np.mean([c[key][n]["recall_at_k"] for c in cases if n in c[key]] or [np.nan]),
                  np.mean([c[key][n]["auprc"] for c in cases if n in c[key]] or [np.nan])) for n in names]
        lines += ["| **mean** | " + " | ".join(f"**{r:.3f} / {p:.3f}**" for r, p in means) + " |", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/query_signals.json and .md."""
    from finished_cases import rescoring_main

    def options(parser: Any) -> None:
        parser.add_argument("--preconditioner", default="diagonal", help="diagonal (the earlier runs) or kronecker")

    return rescoring_main("query_signals", __doc__.splitlines()[0], RESULTS, argv,
                          lambda workdir, args: score_case(workdir, args.base_model, args.preconditioner), markdown,
                          options)


if __name__ == "__main__":
    raise SystemExit(main())
