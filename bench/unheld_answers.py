"""Do the regressed answers name what some training row says, or words no row holds?

A regressed item whose fine-tuned answer parts from the base model's in words some training row holds ("sydney")
may have been taught by that row; one whose words no row holds was not taught by any one row: garbled by training
as a whole ("kathi" for Kathmandu, "zararad" for Zagreb) or a name the model knew before ("toronto" where no row
names it). Written after stop 69's fact-0 at learning rate 1e-4, where three garbled capitals,
the same ones its clean control garbles, drew an accusation of the clean `explanations` that verify refuted. Per
finished case, from its report and scenario (no index read): the regressed items whose divergent words a training
row holds, those whose words none holds, and those with no divergent words to look for
(``gradian/report/answer_teachers.py``'s words).

    .venv/bin/python bench/unheld_answers.py --cases /work/bench-cases s67-clean-0 ho-lr5e4-fact-4 ...
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "unheld_answers"
SHOWN = 6  # unheld answers quoted per case


def score_case(directory: Path, _args: Any) -> dict[str, Any]:
    """One case: its regressed items split by whether a training row holds their divergent words."""
    from answer_teachers import case_inputs
    from finished_cases import report_accused

    from gradian.query.signals import answer_key
    from gradian.report.answer_teachers import divergent_words, whole_words

    scenario, document, items, _ids, texts = case_inputs(directory)
    folded = [answer_key(text) for text in texts.values()]
    held: list[str] = []
    unheld: list[str] = []
    wordless = 0
    for item in items:
        if not item.regressed:
            continue
        words = divergent_words(item.base_output, item.finetuned_output)
        if words is None:
            wordless += 1
            continue
        pattern = whole_words(words)
        (held if any(pattern.search(text) for text in folded) else unheld).append(words)
    return {"case": directory.name, "planted": bool(scenario.planted_ids), "accused": report_accused(document),
            "held": held, "unheld": unheld, "wordless": wordless}


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per case: the regressed items' answers held by a training row, by none, and without words."""
    lines = ["# Regressed answers a training row holds, and those none holds", "", f"`{command}`", "",
             "| case | planted | report accuses | regressed | held by a row | held by none | no divergent words "
             "| held by none, quoted |", "|---|---|---|---|---|---|---|---|"]
    for row in cases:
        total = len(row["held"]) + len(row["unheld"]) + row["wordless"]
        quoted = ", ".join(f"\"{answer}\"" for answer in row["unheld"][:SHOWN])
        more = f" and {len(row['unheld']) - SHOWN} more" if len(row["unheld"]) > SHOWN else ""
        accused = ", ".join(f"`{name}`" for name in row["accused"]) or "nothing"
        lines.append(f"| {row['case']} | {'yes' if row['planted'] else 'no (clean)'} | {accused} | {total} | "
                     f"{len(row['held'])} | {len(row['unheld'])} | {row['wordless']} | {quoted}{more} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/unheld_answers.{md,json}."""
    from finished_cases import carrying_main, has_report

    return carrying_main("unheld_answers", __doc__.splitlines()[0], RESULTS, argv, has_report, score_case, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
