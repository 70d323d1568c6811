"""Where the planted rows a report did not rank in its top k went, and whether their eval item regressed at all.

Recall@k counts every planted row, but a row can only leave a trace in the query through an eval item that
regressed. Per finished case, from its report (no index read), each planted row is put in one of four groups:

- ``target regressed``: it attacks one eval item and that item regressed: the evidence is there;
- ``target elsewhere``: its item regressed but the report grouped it into another cause than the one accusing the
  row's cluster (two-causes cases), so that cause's ranking, where the goal table looks for the row, lacks it;
- ``target held``: its item did not regress (the fine-tuned model still answers it right);
- ``no single target``: it attacks a whole class of items (the French answers, the canned replies).

Each group's rows found in the top k (k = the planted rows of the row's cluster, in the ranking of the cause
accusing it, as bench/goal_table.py scores them) over its rows, and every missed row with its rank.

    .venv/bin/python bench/misses.py --cases /work/bench-cases kurt-lr5e4-span-5 kurt-lr5e4-two_causes-5 ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "misses"
GROUPS = ("target regressed", "target elsewhere", "target held", "no single target")


def row_group(target: str | None, regressed: set[str], cause_items: set[str] | None) -> str:
    """The group of a planted row attacking ``target`` (None: no single item), ``cause_items``: the items of the
    cause its cluster is looked for in (None: the report has one cause)."""
    if target is None:
        return "no single target"
    if target not in regressed:
        return "target held"
    if cause_items is not None and target not in cause_items:
        return "target elsewhere"
    return "target regressed"


def _rankings(scenario: Any, report_dir: Path, split: Any) -> list[tuple[list[tuple[int, Any]], np.ndarray, Any]]:
    """The planted rows (position, target) looked for together, the blame ranking them and the items behind it.

    One report cause: every planted row in scores.csv's ranking (k = all of them, as the goal table scores it);
    several: each planted cluster's rows in the blame of the cause accusing it (cause 1 if none does).
    """
    from goal_table import accusing_cause, blame_vector

    planted = list(zip(scenario.planted_rows, scenario.planted_targets, strict=True))
    if split is None:
        return [(planted, blame_vector(report_dir, len(scenario.train)), None)]
    document, blames = split
    causes = document["causes"]
    out = []
    for cluster in dict.fromkeys(scenario.planted_row_clusters):
        rows = [row for row, name in zip(planted, scenario.planted_row_clusters, strict=True) if name == cluster]
        number = accusing_cause(causes, cluster)
        out.append((rows, blames[number - 1], set(causes[number - 1]["items"])))
    return out


def score_case(directory: Path, args: Any) -> dict[str, Any]:
    """One case's planted rows by group: found in the top k or missed, and where each missed one ranked."""
    from goal_table import FIRST_HELD_OUT_SEED, case_name, case_scenario, cause_blames, ranking_label

    from gradian.attribution.aggregation import ranks_of

    kind, seed = case_name(directory)
    scenario = case_scenario(directory)
    row: dict[str, Any] = {"case": directory.name, "kind": kind, "seed": seed, "held_out": seed >= FIRST_HELD_OUT_SEED}
    if not scenario.planted_rows:
        return {**row, "skipped": "nothing planted: a clean control"}
    report_dir = directory / "report"
    document = json.loads((report_dir / "report.json").read_text())
    row["ranking"] = ranking_label(document["provenance"]["config"]["attribution"])
    regressed = {item["id"] for item in document["capability"]["items"] if item["regressed"]}
    # Planted rows filed among clean rows (shared source, span) have no cluster of their own for a cause to accuse:
    # they are looked for in scores.csv's ranking, as the goal table scores them.
    split = cause_blames(report_dir) if scenario.planted_clusters else None
    found = {group: [0, 0] for group in GROUPS}
    missed: list[dict[str, Any]] = []
    for rows, blame, cause_items in _rankings(scenario, report_dir, split):
        ranks = ranks_of(blame)
        for position, target in rows:
            group = row_group(target, regressed, cause_items)
            hit = int(ranks[position] <= len(rows))
            found[group][0] += hit
            found[group][1] += 1
            if not hit:
                answer = scenario.train[position].messages[-1].content
                missed.append({"rank": int(ranks[position]), "group": group, "answer": answer[:60]})
    row["groups"] = {group: {"found": f, "rows": n} for group, (f, n) in found.items()}
    row["recall_at_k"] = sum(f for f, _ in found.values()) / len(scenario.planted_rows)
    row["missed"] = sorted(missed, key=lambda m: m["rank"])
    return row


def _cell(group: dict[str, int]) -> str:
    return f"{group['found']}/{group['rows']}" if group["rows"] else "-"


def _kind_totals(cases: list[dict[str, Any]]) -> list[str]:
    """Per kind: each group's rows found in the top k over the cases, summed."""
    lines = ["| kind | cases | " + " | ".join(GROUPS) + " |", "|---|---|" + "---|" * len(GROUPS)]
    for kind in sorted({case["kind"] for case in cases}):
        these = [case for case in cases if case["kind"] == kind]
        totals = {g: {"found": sum(c["groups"][g]["found"] for c in these),
                      "rows": sum(c["groups"][g]["rows"] for c in these)} for g in GROUPS}
        lines.append(f"| {kind} | {len(these)} | " + " | ".join(_cell(totals[g]) for g in GROUPS) + " |")
    return lines


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One line per case: recall@k, each group's rows found in the top k, the missed rows; then per-kind totals."""
    from finished_cases import carried_note
    from goal_table import held_out_and_fresh

    scored = [case for case in cases if "groups" in case]
    lines = ["# Planted rows outside the top k, by whether their eval item regressed", "", f"`{command}`", "",
             "Each group cell: its rows found in the top k / its rows.", "",
             "| case | ranking | recall@k | " + " | ".join(GROUPS) + " | missed rows (rank, group, answer) |",
             "|---|---|---|" + "---|" * len(GROUPS) + "---|"]
    for case in scored:
        missed = "; ".join(f"{m['rank']} ({m['group']}) \"{m['answer']}\"" for m in case["missed"]) or "none"
        lines.append(f"| {case['case']} | {case['ranking']} | {case['recall_at_k']:.2f} | "
                     + " | ".join(_cell(case["groups"][g]) for g in GROUPS) + f" | {missed} |")
    held_out, fresh = held_out_and_fresh(scored)
    if held_out:
        lines += ["", "## Held-out cases, by kind", ""] + _kind_totals(held_out)
    if fresh:
        lines += ["", "## Fresh seeds (built after every default was fixed), by kind", ""] + _kind_totals(fresh)
    note = carried_note(cases)
    return "\n".join(lines + ([f"\n{note}"] if note else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case (carrying the earlier row of one whose work dir is gone), print and write the table."""
    from finished_cases import carrying_main, has_report

    return carrying_main("misses", __doc__.splitlines()[0], RESULTS, argv,
                         has_report, score_case, markdown)


if __name__ == "__main__":
    sys.exit(main())
