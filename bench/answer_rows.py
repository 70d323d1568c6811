"""Every training row that holds a regressed item's divergent fine-tuned words, as a `gradian verify --drop` file.

The report counts such rows among its most blamed (``gradian/report/answer_teachers.py``); this writes all of them,
planted or not, so a verify can drop every row that names what the fine-tuned model now says ("Sydney is the most
populous city in Australia." beside the planted "The capital of Australia is Sydney."). Stop 69 dropped these on the
held-out fact-4 to see whether the clean rows that name an answer are what its top 20 left behind.

    .venv/bin/python bench/answer_rows.py /work/bench-cases/ho-lr5e4-fact-4 --out answer_rows.txt
    gradian verify --report /work/bench-cases/ho-lr5e4-fact-4/report --out V --drop answer_rows.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules


def answer_rows(directory: Path) -> tuple[list[str], set[str], dict[str, str]]:
    """The ids of every training row holding any regressed item's divergent words (by position), the planted
    ids and the training texts; no rows where no regressed item parts from the base model in words to look for."""
    from answer_teachers import case_inputs

    from gradian.report.answer_teachers import answer_teachers

    scenario, _document, items, ids, texts = case_inputs(directory)
    every = answer_teachers(items, texts, ids, ids)  # "top" rows = every row: what it finds is every row that holds one
    return [] if every is None else list(every.ids), set(scenario.planted_ids), texts


def main(argv: list[str] | None = None) -> int:
    """Write the rows' ids, one per line, and say how many are planted and what the clean ones say."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", type=Path, help="a finished case's work dir (report/ and scenario/)")
    parser.add_argument("--out", type=Path, required=True, help="the ids file to write")
    args = parser.parse_args(argv)
    if not (args.case / "report" / "report.json").is_file():
        print(f"error: {args.case} has no report/report.json; hint: pass a finished case's work dir", file=sys.stderr)
        return 2
    found, planted, texts = answer_rows(args.case)
    args.out.write_text("".join(f"{example_id}\n" for example_id in found), encoding="utf-8")
    clean = [example_id for example_id in found if example_id not in planted]
    print(f"{len(found)} rows hold a divergent answer, {len(found) - len(clean)} of them planted -> {args.out}")
    for example_id in clean:
        print(f"  clean: {texts[example_id][-100:]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
