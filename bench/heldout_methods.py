"""Issue 12's method x kind table: the shipped defaults' report against the field's baselines on finished demo cases.

Each case is a ``gradian demo`` work dir named ``[PREFIX-]KIND-SEED`` (as bench/goal_table.py reads them). Gradian's
row is its report's own blame (scores.csv: the shipped defaults, over every checkpoint the case scored); each
baseline of bench/accuracy_methods.py (TracIn, LESS, DataInf, BM25, hidden-state cosine) scores the same adapter,
gradient index and regressed items at the final adapter. Metrics against the planted rows: recall@k (k = the
planted rows) and AUPRC. Where the report split the regression into causes, Gradian's row scores each planted
cluster in the ranking of the cause accusing it (as the goal table does) and its whole ranking is shown beside it;
the baselines have one ranking. Clean controls plant nothing and have no row here. Seeds 3-5 are held out; later
seeds (bench/goal_table.py's fresh ones) are summed apart.

    .venv/bin/python bench/heldout_methods.py --cases /work/bench-cases lr5e4-fact-4 lr5e4-format-4 ...

Beside another job on two cores, set OMP_NUM_THREADS=1: the hidden-state pass (400 single-row forwards) took over
15 minutes with two threads spinning against a training run, 2 minutes with one.

A case whose work dir is gone keeps its row from the results file already written (the table says which).
``--shipped PREFIX`` adds Gradian's row under the default shipped since: from each case's ``PREFIX-`` rebuild where
one is on disk (the same fine-tune, its delta checked against the first build's), or from the case's own report
where its name starts with ``PREFIX-``; the baselines need no rebuild, the fine-tune being the same.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "heldout_methods"
GOAL_TABLE = RESULTS.with_name("goal_table.json")
GRADIAN = "gradian (shipped defaults: the report's scores.csv)"
SHIPPED = "gradian, the default shipped since (--shipped)"


def score_case(directory: Path, base_model: str) -> dict[str, Any]:
    """One case's metrics under Gradian's report and under every baseline."""
    from accuracy_methods import baseline_methods, load_case, query
    from goal_table import score_case as goal_row

    from gradian.config import load_config
    from gradian.demo.run import reproduced_planted_ids
    from gradian.demo.scenarios import make_scenario
    from gradian.report.reader import read_report

    goal = goal_row(directory)
    row: dict[str, Any] = {"case": directory.name, "kind": goal["kind"], "seed": goal["seed"],
                           "held_out": goal["held_out"], "delta": goal["delta"], "methods": {}}
    if "recall_at_k" not in goal:  # a clean control or a refused report: no planted rows to find
        row["skipped"] = ("nothing planted: a clean control" if not goal["planted_clusters"]
                          else f"the report's verdict is {goal['verdict']}, so it has no ranking")
        return row
    row["methods"][GRADIAN] = _gradian_metrics(goal)
    scenario = make_scenario(goal["kind"], goal["seed"])
    report = read_report(directory / "report")
    case = load_case(directory, base_model, load_config(directory / "config.yaml"), report)
    truth = scenario.ground_truth(reproduced_planted_ids(scenario, report))
    began = time.perf_counter()
    queries = {"classic": query(case, "classic")}
    row["query_seconds"] = round(time.perf_counter() - began, 1)
    for name, method in baseline_methods().items():
        began = time.perf_counter()
        metrics = truth.score(method(case, queries))
        row["methods"][name] = {"recall_at_k": metrics["recall_at_k"], "auprc": metrics["auprc"],
                                "seconds": round(time.perf_counter() - began, 1)}
        print(f"  {directory.name}: {name}: {metrics['recall_at_k']:.2f} / {metrics['auprc']:.2f}", flush=True)
    return row


def _gradian_metrics(goal: dict[str, Any]) -> dict[str, Any]:
    """recall@k / AUPRC of a goal-table row, with its whole ranking's where the report split into causes."""
    metrics = {"recall_at_k": goal["recall_at_k"], "auprc": goal["auprc"]}
    if "lead_recall_at_k" in goal:
        metrics.update(whole_recall_at_k=goal["lead_recall_at_k"], whole_auprc=goal["lead_auprc"])
    return metrics


def add_shipped(cases: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Gradian's row under the default shipped since: each case's ``--shipped`` rebuild, or its own report if it is one."""
    from goal_table import score_case as goal_row

    if not args.shipped:
        return
    first = {row["case"]: row for row in json.loads(GOAL_TABLE.read_text())["cases"]}
    for case in cases:
        if not case["methods"]:
            continue
        if case["case"].startswith(f"{args.shipped}-"):  # built with the shipped default: its own row is the figure
            case["methods"][SHIPPED] = {**case["methods"][GRADIAN], "from": case["case"]}
            continue
        rebuilt = args.cases / f"{args.shipped}-{case['case']}"
        if not (rebuilt / "report" / "report.json").is_file():
            continue
        goal = goal_row(rebuilt)
        delta = case.get("delta", first.get(case["case"], {}).get("delta"))
        if delta is None:
            raise SystemExit(f"heldout_methods: no delta on record for {case['case']} (neither here nor in "
                             f"{GOAL_TABLE.name}), so {rebuilt.name} cannot be checked as the same fine-tune")
        if goal["delta"] != delta:  # not the same fine-tune: its baselines would not be this rebuild's
            raise SystemExit(f"heldout_methods: {rebuilt.name}'s delta {goal['delta']} is not "
                             f"{case['case']}'s {delta}; rebuild it with the case's own command")
        case["methods"][SHIPPED] = {**_gradian_metrics(goal), "from": rebuilt.name}


def _cell(metrics: dict[str, Any] | None) -> str:
    if not metrics:
        return "-"
    cell = f"{metrics['recall_at_k']:.2f} / {metrics['auprc']:.2f}"
    if "whole_recall_at_k" in metrics:
        cell += f" (whole ranking {metrics['whole_recall_at_k']:.2f} / {metrics['whole_auprc']:.2f})"
    return cell


def method_names(cases: list[dict[str, Any]]) -> list[str]:
    """Every method scored on any case, Gradian's rows first."""
    names = dict.fromkeys(name for case in cases for name in case["methods"])
    return [GRADIAN] + [SHIPPED] * (SHIPPED in names) + [name for name in names if name not in (GRADIAN, SHIPPED)]


def kind_rows(scored: list[dict[str, Any]], names: list[str]) -> list[str]:
    """Per kind of the scored cases: each method's mean recall@k / AUPRC, and whether Gradian's is above every baseline."""
    kinds = sorted({c["kind"] for c in scored})
    lines = ["| method | " + " | ".join(f"{kind} ({sum(c['kind'] == kind for c in scored)})" for kind in kinds) + " |",
             "|---|" + "---|" * len(kinds)]
    for name in names:
        cells = []
        for kind in kinds:
            values = [c["methods"][name] for c in scored if c["kind"] == kind and name in c["methods"]]
            cells.append(f"{np.mean([v['recall_at_k'] for v in values]):.2f} / "
                         f"{np.mean([v['auprc'] for v in values]):.2f}" if values else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for ours, label in ((GRADIAN, "Gradian's"), (SHIPPED, "The default shipped since:")):
        if ours not in names:
            continue
        above = []
        for kind in kinds:
            rows = [c for c in scored if c["kind"] == kind and ours in c["methods"]]
            beaten = sum(all(c["methods"][ours]["recall_at_k"] > m["recall_at_k"]
                             for n, m in c["methods"].items() if n not in (GRADIAN, SHIPPED)) for c in rows)
            above.append(f"{beaten}/{len(rows)}")
        lines.append(f"| {label} recall@k above every baseline's (cases) | " + " | ".join(above) + " |")
    return lines


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """Per case, then per held-out kind."""
    from finished_cases import carried_note
    from goal_table import held_out_and_fresh, split_label

    names = method_names(cases)
    lines = ["# Issue 12 methods x kinds: Gradian's report against the field's baselines (recall@k / AUPRC)", "",
             f"`{command}`", "", "| case | split | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for c in cases:
        if not c["methods"]:
            continue
        lines.append(f"| {c['case']} | {split_label(c)} | "
                     + " | ".join(_cell(c["methods"].get(name)) for name in names) + " |")
    skipped = [f"{c['case']} ({c['skipped']})" for c in cases if c.get("skipped")]
    if skipped:
        lines += ["", f"No planted rows to find: {'; '.join(skipped)}."]
    carried = carried_note(cases, "no index under --cases, so not scored again")
    if carried:
        lines += ["", carried]
    rebuilt = [f"{c['case']} " + ("(its own report)" if c["methods"][SHIPPED]["from"] == c["case"]
                                  else f"from {c['methods'][SHIPPED]['from']}")
               for c in cases if SHIPPED in c["methods"]]
    if rebuilt:
        lines += ["", f"{SHIPPED}: {', '.join(rebuilt)}; a rebuild is the same fine-tune (its delta is the first "
                  "build's). Its means per kind below are over these cases only."]
    held_out, fresh = held_out_and_fresh([c for c in cases if c["methods"]])
    lines += ["", "## Held-out seeds: mean per kind (cases)", ""]
    lines += kind_rows(held_out, names) if held_out else ["No held-out case."]
    if fresh:
        lines += ["", "## Fresh seeds, built after every default was fixed: mean per kind (cases)", ""]
        lines += kind_rows(fresh, names)
    lines += ["", "Gradian's cell where the report split the regression into causes: each planted cluster in its cause's "
              "ranking, weighted by rows; the whole ranking (cause 1's blame, which the baselines are comparable to) "
              "in brackets. Baselines at the final adapter with the classic query (the loss of the wanted answer) over "
              "every regressed item; bench/accuracy_methods.py says how each is computed."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/heldout_methods.json and .md."""
    from finished_cases import indexed_case_main

    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--shipped", metavar="PREFIX",
                            help="also Gradian under the default shipped since, from each case's PREFIX- rebuild")

    return indexed_case_main("heldout_methods", __doc__.splitlines()[0], RESULTS, argv, score_case, markdown,
                             options, add_shipped)


if __name__ == "__main__":
    raise SystemExit(main())
