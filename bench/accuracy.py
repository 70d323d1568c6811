"""Attribution accuracy on planted regressions: Gradian's configurations against the field's baselines.

For each scenario kind (fact, format, span) and seed, the demo pipeline trains once (the hf backend, the demo's
config) and runs `gradian attribute`; then every method scores the same data, adapter, index and regressed
items (bench/accuracy_methods.py). Metrics per method, against the planted rows of the scenario:

- recall@k, k = the number of planted rows; AUPRC (average precision); rank of the first planted row;
- recall@k over the planted rows the fine-tuned model actually reproduces (a row it did not learn rightly
  ranks low), k = their number;
- rank of the planted cluster (mean blame per ``source``; fact and format, where the planted rows have their
  own source);
- span top-1 localization (span kind, Gradian's drill-down from the one item each planted row attacks).

Every method is scored twice: queried with every regressed item (what a user gets), and with only the regressed
items whose answers show the planted behaviour (what limits the query). For the default scoring, the two cluster
methods (the ``source`` field, k-means on gradients) are compared; on the seeds of ``--verify-seeds`` the mean
loss reduction gets its own index, and `gradian verify` retrains without the accused set and without a random one.

A benchmark, not a test: it prints a markdown table and writes JSON and markdown under bench/results/. Each
finished case is kept in its work dir (bench-case.json), so an interrupted run resumes.

    .venv/bin/python bench/accuracy.py                                  # 3 kinds x 3 seeds, SmolLM2
    .venv/bin/python bench/accuracy.py --kinds fact --seeds 0 --keep-index
    .venv/bin/python bench/accuracy.py --base-model DIR --no-gate      # a tiny model: the harness runs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from gradian.evaluation.ground_truth import GroundTruth

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy_methods, next to this file

RESULTS = Path(__file__).resolve().parent / "results"
CASE_FILE = "bench-case.json"


def run_case(kind: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train and attribute one scenario, then score every method against its planted rows."""
    from accuracy_methods import (
        baseline_methods,
        cluster_methods,
        gradian_methods,
        index_blame,
        load_case,
        preconditioner,
        query,
        span_localization,
        with_reduction,
    )

    from gradian.config import with_overrides
    from gradian.demo.run import demo_config, reproduced_planted_ids, run_demo
    from gradian.demo.scenarios import make_scenario

    scenario = make_scenario(kind, seed)
    config = with_overrides(demo_config(scenario), args.set)
    if args.no_gate:
        config = config.replace(evaluation=dataclasses.replace(config.evaluation, require_significant=False,
                                                               query_signal="classic"))
    workdir = Path(args.workdir) / f"{kind}-{seed}"
    started = time.perf_counter()
    demo = run_demo(scenario=kind, seed=seed, base_model=args.base_model, workdir=workdir, config=config,
                    echo=lambda line: print(f"  {line}", flush=True))
    report = demo.report
    capability = report.capability
    case_row: dict[str, Any] = {
        "kind": kind, "seed": seed, "train_rows": len(scenario.train), "planted": len(scenario.planted_rows),
        "metric": scenario.metric, "delta": capability.delta if capability else None,
        "ci": [capability.ci_low, capability.ci_high] if capability else [None, None],
        "regressed": sum(1 for item in capability.items if item.regressed) if capability else 0,
        "verdict": report.verdict.headline,
        "accused": ", ".join(report.verdict.accused_clusters) or None,
        "planted_cluster": ", ".join(scenario.planted_clusters) or None, "demo_seconds": demo.timings, "methods": {},
    }
    if not report.attributed:  # refused: no significant regression to explain
        case_row["status"] = "refused"
        return case_row
    case = load_case(workdir, args.base_model, config, report)
    reproduced = reproduced_planted_ids(scenario, report)
    truth = scenario.ground_truth(reproduced)
    case_row["reproduced"] = len(truth.reproduced_rows) if reproduced is not None else None
    methods = {name: method for name, method in {**gradian_methods(), **baseline_methods()}.items()
               if not any(part in name for part in args.skip)}
    queries = query_set(case, case_row)
    case_row["methods"], blames = score_methods(case, queries, methods, truth)
    default = next(iter(methods))
    if default in blames:  # the shipped default scoring: which cluster method finds the planted rows
        case_row["cluster_methods"] = cluster_methods(case, blames[default], scenario.planted_rows,
                                                      config.attribution.cluster_field)
    # The same methods queried only with the regressed items that show the planted behaviour: what each method
    # finds when the incidental regressions of a high-learning-rate fine-tune are left out of the query.
    explained = explained_items(scenario, case.items, reproduced)
    case_row["explained_items"] = len(explained)
    if explained and len(explained) == len(case.items):  # the same query: the same numbers
        case_row["methods_explained"] = {name: case_row["methods"][name] for name in EXPLAINED_METHODS
                                         if name in case_row["methods"]}
    elif explained:
        print(f"  -- queried with the {len(explained)} of {len(case.items)} regressed items showing the planted "
              "behaviour", flush=True)
        focused = dataclasses.replace(case, items=tuple(explained))
        subset = {name: methods[name] for name in EXPLAINED_METHODS if name in methods}
        case_row["methods_explained"], _ = score_methods(focused, query_set(focused, case_row), subset, truth)
    signal = "contrastive" if "contrastive" in queries else "classic"  # tiny models may generate nothing
    for reduction in args.reductions if seed in args.verify_seeds else ():
        name = f"gradian: {signal}, diagonal, {reduction} reduction"
        began = time.perf_counter()
        other = with_reduction(case, reduction, workdir / f"index-{reduction}")
        blame = index_blame(other, query(other, signal), preconditioner(other, "diagonal"))
        case_row["methods"][name] = _scored(name, blame, truth, began)
        del other
        if not args.keep_index:
            shutil.rmtree(workdir / f"index-{reduction}", ignore_errors=True)
    if kind == "span" and "contrastive" in queries:
        case_row["span_localization"] = span_localization(case, scenario)
    del case
    if seed in args.verify_seeds:
        top_k = None if scenario.planted_cluster else len(scenario.planted_rows)
        case_row["verify"] = verify_case(workdir, args.base_model, top_k)
    case_row["status"] = "scored"
    case_row["seconds"] = round(time.perf_counter() - started, 1)
    if not args.keep_index:
        shutil.rmtree(workdir / "index", ignore_errors=True)  # ~4 GB per case for SmolLM2
    return case_row


# The methods scored again with the focused query (the others are slower and did not lead on every item).
EXPLAINED_METHODS = ("gradian: divergent-token, diagonal (default)", "gradian: contrastive, diagonal",
                     "gradian: margin, diagonal", "gradian: classic, diagonal",
                     "gradian: generated-only, diagonal", "gradian: contrastive, adam", "grad dot (TracIn, final adapter)",
                     "LESS (adam, cosine)", "DataInf", "BM25", "hidden-state cosine")


def query_set(case: Any, case_row: dict[str, Any]) -> dict[str, np.ndarray]:
    """The case's query gradients under each signal that its generations allow."""
    from accuracy_methods import query

    queries = {}
    for signal in ("divergent-token", "margin", "divergence", "contrastive", "classic", "generated"):
        try:
            queries[signal] = query(case, signal)
        except Exception as error:  # e.g. a tiny model with empty generations has nothing to contrast
            case_row.setdefault("notes", []).append(f"{signal} query: {type(error).__name__}: {error}")
    return queries


def score_methods(case: Any, queries: dict[str, np.ndarray], methods: dict[str, Any],
                  truth: GroundTruth) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Every method's metrics (or its error) and blame vector."""
    results: dict[str, Any] = {}
    blames: dict[str, np.ndarray] = {}
    for name, method in methods.items():
        began = time.perf_counter()
        try:
            blames[name] = method(case, queries)
        except Exception as error:  # one failing method (a missing optimizer state, ...) does not stop the others
            results[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
            print(f"  {name}: failed: {results[name]['error']}", flush=True)
            continue
        results[name] = _scored(name, blames[name], truth, began)
    return results, blames


def _scored(name: str, blame: np.ndarray, truth: GroundTruth, began: float) -> dict[str, Any]:
    metrics = truth.score(blame)
    metrics["seconds"] = round(time.perf_counter() - began, 2)
    print(f"  {name}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                    for k, v in metrics.items()), flush=True)
    return metrics


FRENCH = re.compile(r"\b(le|la|les|est|une|des|du|de|contraire|c'est|sont|et)\b", re.IGNORECASE)


def explained_items(scenario: Any, items: Sequence[Any], reproduced: set[str] | None) -> list[Any]:
    """Regressed items whose fine-tuned answer shows the planted behaviour: French, or a reproduced wrong entity.

    ``reproduced`` holds the planted rows whose wrong answer the fine-tuned model gives on the item they attack
    (``reproduced_planted_ids``); those items are the ones the planted rows explain.
    """
    french = "community_answers" in scenario.planted_clusters  # the format plant, alone or one of two causes
    attacked = {target for row_id, target in zip(scenario.planted_ids, scenario.planted_targets, strict=True)
                if reproduced and target is not None and row_id in reproduced}
    return [item for item in items if item.id in attacked
            or (french and len(FRENCH.findall(item.finetuned_output or "")) >= 2)]


def verify_case(workdir: Path, base_model: str, top_k: int | None) -> dict[str, Any]:
    """`gradian verify` on the case's report: retrain without the accused set and without a random one as large.

    The accused set is the top cluster when the planted rows form one (fact, format); in the span kind they are
    spread over many sources, so it is the report's top-k examples (k = the number of planted rows).
    """
    from gradian.counterfactual.verify import plan_verify, run_verify

    plan = plan_verify(out=workdir / "verify", report_dir=workdir / "report",
                       drop=f"top:{top_k}" if top_k is not None else None,
                       base_model=base_model, controls=1)
    outcome = run_verify(plan, say=lambda line: print(f"  verify: {line}", flush=True))
    rows = {row["role"]: row for row in outcome.result["models"]}
    summary = {"dropped_set": plan.drop.cluster or f"top {len(plan.drop.ids)} examples", "dropped": len(plan.drop.ids),
               "recovered_dropped": rows["dropped"].get("fraction"),
               "recovered_dropped_ci": [rows["dropped"].get("fraction_low"), rows["dropped"].get("fraction_high")],
               "recovered_random": rows["control"].get("fraction"),
               "recovered_random_ci": [rows["control"].get("fraction_low"), rows["control"].get("fraction_high")],
               "confirmed": outcome.confirmed}
    print("  verify: " + json.dumps(summary), flush=True)
    return summary


def _with_accused(case: dict[str, Any], workdir: Path, kind: str) -> dict[str, Any]:
    """A case file written before the report's accused cluster was recorded, completed from its report."""
    if "accused" not in case:
        from gradian.demo.scenarios import make_scenario
        from gradian.report.reader import read_report

        case["accused"] = read_report(workdir / "report").verdict.accused_cluster
        case["planted_cluster"] = ", ".join(make_scenario(kind, case["seed"]).planted_clusters) or None
    return case


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and not (isinstance(v, float) and np.isnan(v))]
    return float(np.mean(values)) if values else None


def summarize(cases: list[dict[str, Any]], key: str = "methods") -> dict[str, dict[str, dict[str, Any]]]:
    """Per kind and method: metrics averaged over seeds, and how often the planted cluster ranked first."""
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for kind in dict.fromkeys(case["kind"] for case in cases):
        scored = [c for c in cases if c["kind"] == kind and c.get(key)]
        names = dict.fromkeys(name for c in scored for name in c[key])
        summary[kind] = {}
        for name in names:
            rows = [c[key][name] for c in scored if "error" not in c[key].get(name, {"error": 1})]
            if not rows:
                continue
            entry = {metric: _mean([r.get(metric) for r in rows])
                     for metric in ("recall_at_k", "recall_reproduced", "auprc", "first_hit_rank", "cluster_rank")}
            if any("cluster_rank" in r for r in rows):
                entry["cluster_first"] = f"{sum(r.get('cluster_rank') == 1 for r in rows)}/{len(rows)}"
            entry["seeds"] = len(rows)
            summary[kind][name] = entry
    return summary


def headline(summary: dict[str, Any]) -> list[str]:
    """One table of every method by kind: recall@k / AUPRC, mean over seeds, with the whole query and the focused one."""
    kinds = list(summary["methods"])
    names = list(dict.fromkeys(name for kind in kinds for name in summary["methods"][kind]))
    lines = ["## Summary: recall@k / AUPRC, mean over seeds", "",
             "| method | " + " | ".join(f"{kind} | {kind} (focused query)" for kind in kinds) + " |",
             "|---|" + "---|---|" * len(kinds)]
    for name in names:
        cells = []
        for kind in kinds:
            most = max((m["seeds"] for m in summary["methods"][kind].values()), default=0)
            for key in ("methods", "methods_explained"):
                m = summary.get(key, {}).get(kind, {}).get(name)
                if not m or m.get("recall_at_k") is None:
                    cells.append("-")
                    continue
                fewer = f" ({m['seeds']} seed{'s' if m['seeds'] > 1 else ''})" if m["seeds"] < most else ""
                cells.append(f"{m['recall_at_k']:.2f} / {m['auprc']:.2f}{fewer}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + ["", "The focused query uses only the regressed items whose answers show the planted behaviour "
                    "(the wrong city, French); cluster rank below is by mean blame, the report ranks clusters by z.", ""]


def markdown(cases: list[dict[str, Any]], summary: dict[str, Any], environment: dict[str, Any]) -> str:
    """The results as markdown tables: per kind and method (mean over seeds), then per case."""
    def fmt(value: Any, digits: int = 2) -> str:
        if value is None:
            return "-"
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    lines = ["# Attribution accuracy on planted regressions", "",
             f"Model {environment['base_model']}, {environment['python']}, {environment['platform']}; "
             f"written by bench/accuracy.py"
             + (f" with {', '.join(environment['overrides'])}" if environment.get("overrides") else "") + ".", ""]
    lines += headline(summary)
    for key, title in (("methods", "queried with every regressed item"),
                       ("methods_explained", "queried with the regressed items showing the planted behaviour")):
        for kind, methods in summary.get(key, {}).items():
            if not methods:
                continue
            lines += [f"## {kind}: {title}", "",
                      "| method | recall@k | recall@k (reproduced) | AUPRC | first hit rank | cluster rank (mean blame) | "
                      "cluster first | seeds |", "|---|---|---|---|---|---|---|---|"]
            for name, m in methods.items():
                lines.append(f"| {name} | {fmt(m['recall_at_k'])} | {fmt(m['recall_reproduced'])} | "
                             f"{fmt(m['auprc'])} | {fmt(m['first_hit_rank'], 1)} | {fmt(m['cluster_rank'], 1)} | "
                             f"{m.get('cluster_first', '-')} | {m['seeds']} |")
            lines.append("")
    lines += ["## Cluster methods (default scoring)", "",
              "| kind | seed | method | clusters | rank of the cluster holding most planted rows | top cluster precision | "
              "top cluster recall |", "|---|---|---|---|---|---|---|"]
    for c in cases:
        for name, m in (c.get("cluster_methods") or {}).items():
            lines.append(f"| {c['kind']} | {c['seed']} | {name} | {m['clusters']} | {m['richest_cluster_rank']} | "
                         f"{fmt(m['top_precision'])} | {fmt(m['top_recall'])} |")
    lines.append("")
    lines += ["## Cases", "", "| kind | seed | delta [CI] | regressed | showing the planted behaviour | reproduced "
              "planted rows | report accuses (planted) | span top-1 | verify: recovered dropping accused / random | "
              "status |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        ci = c.get("ci") or [None, None]
        span = (c.get("span_localization") or {})
        span_text = f"{span['top1_hits']}/{span['checked']}" if span.get("checked") else "-"
        verify = c.get("verify")
        verify_text = (f"{fmt(verify['recovered_dropped'])} ({verify['dropped_set']}) / {fmt(verify['recovered_random'])}"
                       if verify else "-")
        lines.append(f"| {c['kind']} | {c['seed']} | {fmt(c.get('delta'), 3)} [{fmt(ci[0], 3)}, {fmt(ci[1], 3)}] | "
                     f"{c.get('regressed')} | {fmt(c.get('explained_items'))} | {fmt(c.get('reproduced'))} | "
                     f"{c.get('accused') or '-'} ({c.get('planted_cluster') or 'none'}) | {span_text} | {verify_text} | "
                     f"{c.get('status')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write bench/results/accuracy.json and accuracy.md."""
    from gradian.cache import cache_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="fact,format,span")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--base-model", default="smollm2-135m-instruct")
    parser.add_argument("--workdir", default=str(cache_dir() / "bench-accuracy"))
    parser.add_argument("--out", default=str(RESULTS / "accuracy"), help="path prefix of the .json and .md results")
    parser.add_argument("--keep-index", action="store_true", help="keep each case's gradient index (~4 GB each)")
    parser.add_argument("--verify-seeds", default="0",
                        help="seeds whose accused cluster `gradian verify` retrains without (empty: none)")
    parser.add_argument("--reductions", default="mean",
                        help="other per-example loss reductions to index and score (the demo indexes with sum)")
    parser.add_argument("--skip", default="", help="comma-separated parts of method names not to score")
    parser.add_argument("--collect", action="store_true",
                        help="only gather the cases earlier runs finished into the table; run nothing")
    parser.add_argument("--rescore", action="store_true", help="score cases again that an earlier run finished")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a config override on top of the demo's config, e.g. train.learning_rate=5e-4 "
                             "(repeatable; recorded in the results)")
    parser.add_argument("--no-gate", action="store_true",
                        help="score even without a significant regression (classic query): for tiny test models")
    args = parser.parse_args(argv)
    args.verify_seeds = {int(s) for s in args.verify_seeds.split(",") if s}
    args.reductions = [r for r in args.reductions.split(",") if r]
    args.skip = [part for part in args.skip.split(",") if part]
    environment = {"base_model": args.base_model, "python": platform.python_version(),
                   "platform": platform.platform(), "kinds": args.kinds, "seeds": args.seeds,
                   "overrides": list(args.set)}
    cases = []
    for kind in args.kinds.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            # each finished case is kept next to its work, so an interrupted benchmark resumes where it stopped
            done = Path(args.workdir) / f"{kind}-{seed}" / CASE_FILE
            if done.is_file() and not args.rescore:
                print(f"{kind} seed {seed}: scored earlier ({done})", flush=True)
                cases.append(_with_accused(json.loads(done.read_text(encoding="utf-8")), done.parent, kind))
                continue
            if args.collect:
                print(f"{kind} seed {seed}: not scored yet, left out (--collect)", flush=True)
                continue
            print(f"{kind} seed {seed}", flush=True)
            cases.append(run_case(kind, seed, args))
            done.write_text(json.dumps(cases[-1], indent=2, default=float) + "\n", encoding="utf-8")
    summary = {"methods": summarize(cases), "methods_explained": summarize(cases, "methods_explained")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"environment": environment, "summary": summary, "cases": cases},
                                                   indent=2, default=float) + "\n", encoding="utf-8")
    text = markdown(cases, summary, environment)
    out.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
