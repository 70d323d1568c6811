"""Do the most blamed rows hold what the fine-tuned model now says, and only where something planted taught it?

The report's verdict counts, among its top rows, those that hold a regressed item's divergent fine-tuned words
("sydney" where the base model said "canberra"; ``gradian/report/answer_teachers.py``) against every training row
that does. Written after the held-out span-4, behaviour-4 and two-causes-4 reports, whose planted hosts the cluster
test does not accuse (the rows are filed among many clean ones). Per finished case, from its report and scenario (no
index read): the count, its hypergeometric p, how many of the rows found are planted, and where they are filed.

Where a report split the regression into causes, its top rows are cause 1's; each cause's own count (its items'
words in its own top rows, scores.csv's ``blame:cause-<n>``) is what the report states per cause since stop 68, and
a host counts as named where the whole count or any cause's names it.

Rule, written before any clean control was scored: the sentence is worth stating only if it stands out on no clean
control (a false lead there) and, where it stands out on a planted case, the rows it finds are planted ones.

    .venv/bin/python bench/answer_teachers.py --cases /work/bench-cases ho-lr5e4-span-4 s67-clean-0 ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "answer_teachers"


def case_inputs(directory: Path) -> tuple[Any, dict[str, Any], list[Any], list[str], dict[str, str]]:
    """A finished case's scenario, report.json, eval items, training ids by position and training texts by id."""
    from goal_table import case_scenario

    from gradian.evaluation.capability import ItemResult

    scenario = case_scenario(directory)
    document = json.loads((directory / "report" / "report.json").read_text(encoding="utf-8"))
    fields = {"id", "prompt", "wanted", "base_output", "finetuned_output", "base_score", "finetuned_score"}
    items = [ItemResult(**{key: value for key, value in item.items() if key in fields})
             for item in document["capability"]["items"]]
    ids = [example.id for example in scenario.train]
    texts = {example.id: example.supervised_text or example.text or "" for example in scenario.train}
    return scenario, document, items, ids, texts


def score_case(directory: Path, _args: Any) -> dict[str, Any]:
    """One case: the answer teachers its report's top rows give, the planted ones among them, the hosts."""
    from finished_cases import report_accused
    from goal_table import case_name

    from gradian.attribution.clusters import clusters_from_field
    from gradian.report.answer_teachers import answer_teachers

    kind, seed = case_name(directory)
    scenario, document, items, ids, texts = case_inputs(directory)
    assignment = clusters_from_field([example.fields for example in scenario.train], scenario.cluster_field)
    top = [row["id"] for row in document["top_examples"]]
    teachers = answer_teachers(items, texts, ids, top, assignment)
    planted = set(scenario.planted_ids)
    accused = report_accused(document)
    canned = bool((document["verdict"].get("reply_teachers") or {}).get("stands_out"))
    row: dict[str, Any] = {"case": directory.name, "kind": kind, "seed": seed, "hosts": list(scenario.planted_sources),
                           "report_accused": accused, "canned_reply_stated": canned, "teachers": None}
    if teachers is not None:
        row["teachers"] = _with_planted(teachers.to_dict(), planted)
    causes = document.get("causes") or []
    row["causes"] = []
    if len(causes) > 1:
        orders = _cause_orders(directory / "report" / "scores.csv", len(causes))
        for cause, order in zip(causes, orders, strict=True):
            if cause.get("canned_reply"):  # counted by reply_teachers, as the report does
                continue
            own = set(cause["items"])
            held = answer_teachers([item for item in items if item.id in own], texts, ids, order[:len(top)],
                                   assignment)
            row["causes"].append({"cause": cause["cause"],
                                  "teachers": None if held is None else _with_planted(held.to_dict(), planted)})
    return row


def _with_planted(count: dict[str, Any], planted: set[str]) -> dict[str, Any]:
    """A count's dict with the planted rows among those it found."""
    planted_ids = [i for i in count["ids"] if i in planted]
    return {**count, "planted_found": len(planted_ids), "planted_ids": planted_ids}


def _cause_orders(scores_csv: Path, causes: int) -> list[list[str]]:
    """Each cause's example ids, most blamed first (scores.csv's ``blame:cause-<n>``, ties by position)."""
    import csv

    with scores_csv.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [[row["id"] for row in sorted(rows, key=lambda row: (-float(row[f"blame:cause-{n}"]), int(row["position"])))]
            for n in range(1, causes + 1)]


def _standing(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The counts of a case that stand out: the report's top rows', then each cause's own."""
    counts = [row["teachers"], *(cause["teachers"] for cause in row.get("causes", []))]
    return [count for count in counts if count and count["stands_out"]]


def _cell(row: dict[str, Any]) -> list[str]:
    """The found count, its p, the planted among them, where they are filed, what that names."""
    teachers = row["teachers"]
    if teachers is None:
        return ["no divergent words", "-", "-", "-", "-", _causes_cell(row)]
    filed = ", ".join(f"`{name}` {cell['found']}/{cell['size']}" for name, cell in teachers["clusters"].items()) or "-"
    named = [name for name in teachers["clusters"]] if teachers["stands_out"] else []
    hosts = row["hosts"]
    verdict = ("nothing" if not named else ", ".join(
        f"`{name}`" + (" (host)" if name in hosts else " (clean)" if hosts else "") for name in named))
    if row["canned_reply_stated"]:  # the report states the narrower account instead
        verdict += " (the report states its canned reply's rows instead)"
    return [f"{teachers['found']} of {teachers['top']} ({teachers['containing']} rows hold any)",
            f"{teachers['p_value']:.2g}", f"{teachers['planted_found']}/{teachers['found']}" if hosts else "-",
            filed, verdict, _causes_cell(row)]


def _causes_cell(row: dict[str, Any]) -> str:
    """Each cause's own count where the report split: found / top, p, planted among them, where filed."""
    cells = []
    for cause in row.get("causes", []):
        held = cause["teachers"]
        if held is None:
            cells.append(f"{cause['cause']}: no divergent words")
            continue
        filed = ", ".join(f"`{name}` {cell['found']}" for name, cell in held["clusters"].items()) or "-"
        planted = f", {held['planted_found']} planted" if row["hosts"] else ""
        cells.append(f"{cause['cause']}: {held['found']} of {held['top']}, p {held['p_value']:.2g}{planted} ({filed})"
                     + ("" if held["stands_out"] else ", does not stand out"))
    return "; ".join(cells) or "-"


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per case, then the hosts named on planted cases and the statements made on clean controls."""
    lines = ["# The top rows that hold the fine-tuned answers", "", f"`{command}`", "",
             "| case | planted host | report accuses | top rows holding a divergent answer | p | planted among them "
             "| filed under | stands out, naming | each cause's own top rows (split reports) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in cases:
        hosts = ", ".join(f"`{host}`" for host in row["hosts"]) or "none (clean)"
        accused = ", ".join(f"`{name}`" for name in row["report_accused"]) or "nothing"
        lines.append(f"| {row['case']} | {hosts} | {accused} | " + " | ".join(_cell(row)) + " |")
    planted = [row for row in cases if row["hosts"]]
    clean = [row for row in cases if not row["hosts"]]

    def names(row: dict[str, Any], host: str) -> bool:
        return any(host in count["clusters"] for count in _standing(row))

    named = sum(names(row, host) for row in planted for host in row["hosts"])
    unaccused = [(row, host) for row in planted for host in row["hosts"] if host not in row["report_accused"]]
    named_unaccused = sum(names(row, host) for row, host in unaccused)
    found = sum(len({i for count in _standing(row) for i in count["ids"]}) for row in planted)
    right = sum(len({i for count in _standing(row) for i in count["planted_ids"]}) for row in planted)
    lines += ["", "| | count |", "|---|---|",
              f"| planted hosts named (of every host) | {named}/{sum(len(row['hosts']) for row in planted)} |",
              f"| hosts the cluster test does not accuse, named | {named_unaccused}/{len(unaccused)} |",
              f"| rows found on planted cases that are planted | {right}/{found} |",
              f"| clean controls where it stands out (a false lead) | {sum(bool(_standing(row)) for row in clean)}/"
              f"{len(clean)} |",
              "", "Stands out: at least 2 of the top rows hold a divergent answer and the hypergeometric p is below "
              "0.05; 'filed under' counts the top rows found by source (found / the source's size)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/answer_teachers.{md,json}."""
    from finished_cases import carrying_main, has_report

    return carrying_main("answer_teachers", __doc__.splitlines()[0], RESULTS, argv, has_report, score_case, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
