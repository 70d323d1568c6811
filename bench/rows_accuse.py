"""Clusters accused by the rows that hold what the fine-tuned model now says, on finished cases.

Since stop 70 a report accuses, beside what its cluster test accuses, each cluster that the standing-out count of
top rows holding the canned reply or the regressed answers rests on (``gradian.report.reply_teachers.rows_accuse``:
at least two of those top rows, and the hypergeometric chance of that many among the top, given how many of the
cluster's rows hold it, below 0.05 over the clusters). Per finished case this gives what the report accuses by each
way: a report written since reads its ``verdict.accused_by_rows``; an earlier one is accused again from its
report.json, scenario and top rows, as the report would (the reply's rows where they stand out, else the regressed
answers'). Planted hosts accused either way, and clean controls accusing anything, are counted below the table.

    .venv/bin/python bench/rows_accuse.py --cases /work/bench-cases ho-lr5e4-behaviour-4 s67-clean-0 ...
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "rows_accuse"


def rows_accusation(scenario: Any, document: dict[str, Any], items: list[Any], ids: list[str],
                    texts: dict[str, str]) -> tuple[list[str], str]:
    """The clusters a finished case's report accuses by its rows (beyond its cluster test's), and from which rows;
    the arguments are ``answer_teachers.case_inputs``'s."""
    from finished_cases import report_accused

    from gradian.attribution.clusters import clusters_from_field
    from gradian.report.answer_teachers import answer_teachers
    from gradian.report.reply_teachers import rows_accuse

    verdict = document["verdict"]
    reply = verdict.get("reply_teachers") or {}
    rows = "reply" if reply.get("stands_out") else "answers"
    if "accused_by_rows" in verdict:  # written by the report itself
        return list(verdict["accused_by_rows"]), rows
    assignment = clusters_from_field([example.fields for example in scenario.train], scenario.cluster_field)
    top = [row["id"] for row in document["top_examples"]]
    if reply.get("stands_out"):
        position = {example_id: p for p, example_id in enumerate(ids)}
        shown = set(top)
        holding = [position[example_id] for example_id in reply["ids"]]
        found = [position[example_id] for example_id in reply["ids"] if example_id in shown]
        accuses = rows_accuse(assignment, found, holding, len(top), len(ids))
    else:
        holders = answer_teachers(items, texts, ids, top, assignment)
        accuses = holders.accuses if holders is not None else ()
    tested = set(report_accused(document))
    return [name for name in accuses if name not in tested], rows


def score_case(directory: Path, _args: Any) -> dict[str, Any]:
    """One case: its planted hosts, what its cluster test accuses and what its rows accuse."""
    from answer_teachers import case_inputs
    from finished_cases import report_accused

    scenario, document, items, ids, texts = case_inputs(directory)  # report.json and the scenario read once
    by_rows, rows = rows_accusation(scenario, document, items, ids, texts)
    return {"case": directory.name, "hosts": list(scenario.planted_sources),
            "tested": report_accused(document), "by_rows": by_rows, "rows": rows,
            "written": "accused_by_rows" in document["verdict"]}


def _names(names: list[str], hosts: list[str]) -> str:
    return ", ".join(f"`{name}`" + (" (host)" if name in hosts else " (clean)") for name in names) or "nothing"


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per case, then the hosts accused and the clean controls accusing something, each way."""
    lines = ["# Clusters accused by the rows that hold what the fine-tuned model now says", "", f"`{command}`", "",
             "| case | planted host | the cluster test accuses | the rows accuse (beyond it) | from | report |",
             "|---|---|---|---|---|---|"]
    for case in cases:
        hosts = ", ".join(f"`{host}`" for host in case["hosts"]) or "none (clean)"
        lines.append(f"| {case['case']} | {hosts} | {_names(case['tested'], case['hosts'])} | "
                     f"{_names(case['by_rows'], case['hosts'])} | {case['rows']} | "
                     f"{'written' if case['written'] else 'accused again from report.json'} |")
    planted = [case for case in cases if case["hosts"]]
    clean = [case for case in cases if not case["hosts"]]
    hosts = sum(len(case["hosts"]) for case in planted)

    def hit(case: dict[str, Any], ways: tuple[str, ...]) -> int:
        return sum(any(host in case[way] for way in ways) for host in case["hosts"])

    def wrong(case: dict[str, Any], ways: tuple[str, ...]) -> int:
        return sum(name not in case["hosts"] for way in ways for name in case[way])

    lines += ["", "| accused by | planted hosts accused | clean clusters accused on planted cases "
              "| clean controls accusing anything |", "|---|---|---|---|"]
    for label, ways in (("the cluster test", ("tested",)), ("the cluster test or the rows", ("tested", "by_rows"))):
        lines.append(f"| {label} | {sum(hit(case, ways) for case in planted)}/{hosts} | "
                     f"{sum(wrong(case, ways) for case in planted)} | "
                     f"{sum(any(case[way] for way in ways) for case in clean)}/{len(clean)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/rows_accuse.{md,json}."""
    from finished_cases import carrying_main, has_report

    return carrying_main("rows_accuse", __doc__.splitlines()[0], RESULTS, argv, has_report, score_case, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
