"""What the paired query's generated weight does to the cluster tests: each case re-attributed at other weights.

Each finished case's report is re-attributed through the product with the command it records, ``--set
evaluation.generated_weight=W --set evaluation.accusation_weight=null`` (the clusters tested at W too) and ``--out``
under --workdir (a run already there is reused; checkpoint indexes come
from the index cache, so a re-attribution costs the scoring, not the index builds). Per case and weight: what is
accused, the strongest cluster with its family-wise p, and --cluster's z and family-wise p. Built for the clean
controls, where anything accused is wrong.

    .venv/bin/python bench/query_weight_clusters.py --cases /work/bench-cases gw75-clean-3 gw75-clean-7 --weights 0.5
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # finished_cases, next to this file

from finished_cases import carried_note, carrying_main, has_report  # noqa: E402
from goal_table import tested_weight  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "query_weight_clusters"


def reattributed(case: Path, weight: float, workdir: Path) -> Path:
    """The report of ``case`` attributed again at ``weight`` (run once; its dir under ``workdir``)."""
    from gradian.report.reader import read_report

    out = workdir / f"{case.name}-w{weight:g}" / "report"
    if not (out / "report.json").is_file():
        arguments = shlex.split(read_report(case / "report").provenance.command)
        at = arguments.index("--out")
        arguments[at + 1] = str(out)
        subprocess.run([sys.executable, "-m", "gradian", *arguments[1:], "--set",  # past "gradian"
                        f"evaluation.generated_weight={weight:g}", "--set", "evaluation.accusation_weight=null"],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def cluster_row(report: Path, cluster: str) -> dict[str, Any]:
    """What one report's cluster test says: accused, the strongest cluster, and ``cluster``'s z and p."""
    from gradian.report.reader import read_report

    read = read_report(report)
    weight = tested_weight(read.provenance.config["evaluation"])
    if not read.clusters:  # not attributed: the delta was not significant
        return {"weight": weight, "attributed": False}
    strongest, named = read.clusters[0], read.cluster(cluster)
    return {"weight": weight, "attributed": True, "accused": list(read.accused_names),
            "strongest": strongest.name, "strongest_p": strongest.p_adjusted,
            "z": named.z if named else None, "p": named.p_adjusted if named else None}


def score(case: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The case's own report and each re-attribution at another weight than its own, read."""
    from gradian.report.reader import read_report

    own = tested_weight(read_report(case / "report").provenance.config["evaluation"])
    reports = [case / "report", *(reattributed(case, w, args.workdir) for w in args.weights if w != own)]
    rows = sorted((cluster_row(report, args.cluster) for report in reports), key=lambda row: row["weight"])
    return {"case": case.name, "cluster": args.cluster, "weights": rows}


def _cell(row: dict[str, Any]) -> str:
    """One weight's cell: the named cluster's z / p, the strongest cluster, and what is accused."""
    if not row["attributed"]:
        return "not attributed"
    accused = ", ".join(f"`{name}`" for name in row["accused"]) or "nothing"
    named = f"{row['z']:.2f} / {row['p']:.2f}" if row["z"] is not None else "-"
    return f"{named}; strongest `{row['strongest']}` {row['strongest_p']:.2f}; accused: {accused}"


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per case, one column per weight."""
    weights = sorted({row["weight"] for case in cases for row in case["weights"]})
    cluster = cases[0]["cluster"] if cases else "-"
    lines = ["# The generated weight and the cluster tests", "", f"`{command}`", "",
             f"Each cell: `{cluster}`'s z / family-wise p; the strongest cluster and its family-wise p; what is accused.",
             "", "| case | " + " | ".join(f"weight {w:g}" for w in weights) + " |", "|---|" + "---|" * len(weights)]
    for case in cases:
        by_weight = {row["weight"]: row for row in case["weights"]}
        lines.append(f"| {case['case']} | " + " | ".join(_cell(by_weight[w]) if w in by_weight else "-"
                                                        for w in weights) + " |")
    note = carried_note(cases)
    return "\n".join(lines + ([""] + [note] if note else [])) + "\n"


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", type=float, nargs="+", default=[0.5], help="generated weights to re-attribute at")
    parser.add_argument("--cluster", default="geography_qa", help="the cluster whose z and p each cell shows")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gradian-query-weight-clusters"),
                        help="where the re-attributions are written (reused when there)")


def main(argv: list[str] | None = None) -> int:
    return carrying_main("query_weight_clusters", __doc__.splitlines()[0], RESULTS, argv, has_report, score,
                         markdown, _options)


if __name__ == "__main__":
    sys.exit(main())
