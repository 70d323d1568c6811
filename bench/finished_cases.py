"""Shared by the benchmarks that re-score finished cases: which named cases are missing, earlier rows, the results."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def missing_cases(tool: str, cases: Path, names: list[str]) -> bool:
    """Say which named cases have no finished index under ``cases`` (on stderr); True when any is missing."""
    missing = [name for name in names if not (cases / name / "index" / "manifest.json").is_file()]
    if missing:
        print(f"{tool}: no finished case {', '.join(missing)} under {cases}", file=sys.stderr)
    return bool(missing)


def write_results(out: Path, command: str, cases: list[dict[str, Any]], text: str) -> None:
    """``out``.json (the command and every case) and ``out``.md (``text``), and print the markdown."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"command": command, "cases": cases}, indent=2) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)


def recall_cells(metrics: dict[str, dict[str, float]], names: list[str]) -> str:
    """``recall@k / AUPRC`` of each named ranking, as the cells of one markdown table row."""
    return " | ".join(f"{metrics[name]['recall_at_k']:.2f} / {metrics[name]['auprc']:.2f}" for name in names)


def recall_table_head(title: str, command: str, names: list[str], extra: list[str]) -> list[str]:
    """The title, the command and the header of a table of cases x rankings (recall@k / AUPRC) + ``extra`` columns."""
    return [f"# {title}", "", f"`{command}`", "", "Each cell: recall@k / AUPRC of the planted rows.", "",
            "| case | " + " | ".join([*names, *extra]) + " |", "|---|" + "---|" * (len(names) + len(extra))]


def variant_table(title: str, command: str, scored: list[dict[str, Any]], variants: list[str],
                  means: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """The title, the command and a table of variants x cases (each case's ``variants`` recall@k / AUPRC), with a
    column of mean recall@k over each named group of cases."""
    import numpy as np

    lines = recall_table_head(title, command, [case["case"] for case in scored], [])
    lines[-2:] = ["| variant | " + " | ".join([*(case["case"] for case in scored), *(name for name, _ in means)]) + " |",
                  "|---|" + "---|" * (len(scored) + len(means))]

    def mean(group: list[dict[str, Any]], name: str) -> str:
        return f"{np.mean([case['variants'][name]['recall_at_k'] for case in group]):.3f}" if group else "-"

    for name in variants:
        cells = [recall_cells(case["variants"], [name]) for case in scored] + [mean(group, name) for _, group in means]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def command_line(script: str, argv: list[str] | None) -> str:
    """``python bench/<script> <arguments>`` as a results file quotes it, each ``--note`` and its text left out."""
    given = list(argv if argv is not None else sys.argv[1:])
    shown = [arg for i, arg in enumerate(given) if arg != "--note" and (i == 0 or given[i - 1] != "--note")]
    return " ".join([f"python bench/{script}", *shown])


def named_twice(tool: str, names: list[str]) -> bool:
    """Say so and return True when a case is named more than once: it would count twice in its kind's rows."""
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        print(f"{tool}: {', '.join(twice)} named more than once; name each case once", file=sys.stderr)
    return bool(twice)


def _parser(description: str, results: Path, names_help: str,
            add_arguments: Callable[[argparse.ArgumentParser], None] | None) -> argparse.ArgumentParser:
    """--cases, the case names, --out (default ``results``) and the benchmark's own options."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--cases", type=Path, required=True, help="the directory holding the case work dirs")
    parser.add_argument("names", nargs="+", help=names_help)
    parser.add_argument("--out", type=Path, default=results)
    parser.add_argument("--keep-scored", action="store_true",
                        help="carry a case's row already in --out instead of scoring it again (to add a case)")
    parser.add_argument("--rescore", nargs="+", default=[], metavar="NAME",
                        help="with --keep-scored, score these named cases again all the same (a verify added to one)")
    if add_arguments is not None:
        add_arguments(parser)
    return parser


def has_report(case: Path) -> bool:
    """Whether a case dir holds a finished report (what the tables that read reports only need)."""
    return (case / "report" / "report.json").is_file()


def report_accused(document: dict[str, Any]) -> list[str]:
    """The clusters a report.json accuses, over its causes where it split, else its verdict's; sorted."""
    return sorted({name for cause in document.get("causes") or [document["verdict"]]
                   for name in cause.get("accused_clusters") or [] if name})


def carried_note(cases: list[dict[str, Any]], why: str = "work dir no longer on disk") -> str | None:
    """The line naming the cases whose rows came from the earlier results file; None where every case was scored."""
    carried = [case["case"] for case in cases if case.get("carried") and not case.get("kept")]
    kept = [case["case"] for case in cases if case.get("kept")]
    lines = ([f"Carried from the earlier results file ({why}): {', '.join(carried)}."] if carried else []) + (
        [f"Kept from the earlier results file (scored there; --keep-scored): {', '.join(kept)}."] if kept else [])
    return " ".join(lines) or None


def planted_case(directory: Path) -> tuple[dict[str, Any], Any, Any]:
    """A case's row head, its report and its ground truth; the row says it is skipped when nothing is planted.

    The ground truth counts the planted rows the fine-tune reproduced, as the goal table does.
    """
    from goal_table import case_name, case_scenario

    from gradian.demo.run import reproduced_planted_ids
    from gradian.report.reader import read_report

    kind, seed = case_name(directory)
    scenario = case_scenario(directory)
    row: dict[str, Any] = {"case": directory.name, "kind": kind, "seed": seed, "methods": {}}
    if not scenario.planted_rows:
        row["skipped"] = "nothing planted: a clean control"
        return row, None, None
    report = read_report(directory / "report")
    return row, report, scenario.ground_truth(reproduced_planted_ids(scenario, report))


def score_rankings(row: dict[str, Any], truth: Any, rankings: dict[str, Any]) -> None:
    """recall@k / AUPRC of each named ranking into ``row["methods"]``."""
    for name, scores in rankings.items():
        metrics = truth.score(scores)
        row["methods"][name] = {"recall_at_k": metrics["recall_at_k"], "auprc": metrics["auprc"]}


def rankings_table(title: str, first_column: str, cases: list[dict[str, Any]], command: str) -> str:
    """One row per ranking of the cases' ``methods``, one column per case, then the tuning and held-out means (and
    the fresh cases', apart, where there are any)."""
    import numpy as np
    from goal_table import is_fresh, split_label

    scored = [case for case in cases if case["methods"]]
    names = list(scored[0]["methods"]) if scored else []
    splits = ["tuning", "held-out"] + (["fresh"] if any(is_fresh(case) for case in scored) else [])

    lines = [f"# {title}", "", f"`{command}`", "",
             f"| {first_column} | " + " | ".join(case["case"] for case in scored) + " | "
             + " | ".join(f"{part} mean" for part in splits) + " |",
             "|---|" + "---|" * (len(scored) + len(splits))]
    for name in names:
        recalls = [case["methods"][name]["recall_at_k"] for case in scored]
        means = [[r for r, case in zip(recalls, scored, strict=True) if split_label(case) == part] for part in splits]
        means = [f"{np.mean(part):.3f}" if part else "-" for part in means]
        lines.append(f"| {name} | " + " | ".join(f"{r:.2f}" for r in recalls) + " | " + " | ".join(means) + " |")
    skipped = [f"{case['case']} ({case['skipped']})" for case in cases if case.get("skipped")]
    if skipped:
        lines += ["", "Not scored: " + ", ".join(skipped) + "."]
    carried = carried_note(cases, "no index under --cases, so not scored again")
    if carried:
        lines += ["", carried]
    return "\n".join(lines) + "\n"


def _write(tool: str, argv: list[str] | None, out: Path, cases: list[dict[str, Any]],
           markdown: Callable[[list[dict[str, Any]], str], str]) -> int:
    """Write the results with the command line that produced them; exit code 0."""
    command = f"python bench/{tool}.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_results(out, command, cases, markdown(cases, command))
    return 0


def rescoring_main(tool: str, description: str, results: Path, argv: list[str] | None,
                   score: Callable[[Path, argparse.Namespace], dict[str, Any]],
                   markdown: Callable[[list[dict[str, Any]], str], str],
                   add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    """A re-scoring benchmark's command line: parse, check the cases, score each, write bench/results/<tool>.*."""
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--base-model", default="smollm2-135m-instruct")
        if add_arguments is not None:
            add_arguments(parser)

    args = _parser(description, results, "case names, e.g. fact-0 format-0", options).parse_args(argv)
    if missing_cases(tool, args.cases, args.names):
        return 2
    return _write(tool, argv, args.out, [score(args.cases / name, args) for name in args.names], markdown)


def earlier_rows(results: Path) -> dict[str, dict[str, Any]]:
    """The rows of a results file already written, by case name (none when there is no results file)."""
    path = results.with_suffix(".json")
    if not path.is_file():
        return {}
    return {row["case"]: row for row in json.loads(path.read_text())["cases"]}


def carrying_main(tool: str, description: str, results: Path, argv: list[str] | None,
                  finished: Callable[[Path], bool], score: Callable[[Path, argparse.Namespace], dict[str, Any]],
                  markdown: Callable[[list[dict[str, Any]], str], str],
                  add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                  amend: Callable[[list[dict[str, Any]], argparse.Namespace], None] | None = None) -> int:
    """A case table's command line: score each finished case, carry the earlier row of one whose work dir is gone.

    A case dir is ~8 GB and machines are not kept, so a row once measured stays in the table, marked ``carried``.
    ``amend`` adds to the rows, scored and carried alike, before they are written.
    """
    args = _parser(description, results, "case dirs, e.g. lr5e4-fact-3 clean-3", add_arguments).parse_args(argv)
    cases = scored_or_carried(tool, args, finished, lambda case: score(case, args))
    if cases is None:
        return 2
    if amend is not None:
        amend(cases, args)
    return _write(tool, argv, args.out, cases, markdown)


def scored_or_carried(tool: str, args: argparse.Namespace, finished: Callable[[Path], bool],
                      score: Callable[[Path], dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Each of ``args.names`` scored where its case is finished, else its row in ``args.out`` marked ``carried``.

    None, said on stderr, when a case is named twice or is neither finished nor in the earlier results.
    """
    if named_twice(tool, args.names):
        return None
    earlier = earlier_rows(args.out)
    here = {name for name in args.names if finished(args.cases / name)}
    missing = [name for name in args.names if name not in here and name not in earlier]
    if missing:
        print(f"{tool}: no finished case under {args.cases} and no earlier row for {', '.join(missing)}",
              file=sys.stderr)
        return None
    unnamed = sorted(set(getattr(args, "rescore", ())) - set(args.names))
    if unnamed:
        print(f"{tool}: --rescore names {', '.join(unnamed)}, which is not among the cases", file=sys.stderr)
        return None
    kept = {name for name in here & earlier.keys() if getattr(args, "keep_scored", False)} - set(
        getattr(args, "rescore", ()))
    return [score(args.cases / name) if name in here - kept
            else {**earlier[name], "carried": True, **({"kept": True} if name in kept else {})} for name in args.names]


def indexed_case_main(tool: str, description: str, results: Path, argv: list[str] | None,
                      score: Callable[[Path, str], dict[str, Any]],
                      markdown: Callable[[list[dict[str, Any]], str], str],
                      add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                      amend: Callable[[list[dict[str, Any]], argparse.Namespace], None] | None = None) -> int:
    """``indexed_main`` for a table whose scoring needs only the case and its --base-model."""
    return indexed_main(tool, description, results, argv, lambda case, args: score(case, args.base_model), markdown,
                        add_arguments, amend)


def indexed_main(tool: str, description: str, results: Path, argv: list[str] | None,
                 score: Callable[[Path, argparse.Namespace], dict[str, Any]],
                 markdown: Callable[[list[dict[str, Any]], str], str],
                 add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                 amend: Callable[[list[dict[str, Any]], argparse.Namespace], None] | None = None) -> int:
    """``carrying_main`` for a table that loads each case's index and model: --base-model; finished = indexed."""
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--base-model", default="smollm2-135m-instruct")
        if add_arguments is not None:
            add_arguments(parser)

    return carrying_main(tool, description, results, argv, lambda case: (case / "index" / "manifest.json").is_file(),
                         score, markdown, options, amend)
