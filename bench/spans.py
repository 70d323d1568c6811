"""Span top-1 localization under the shipped defaults against the drill-down's first configuration.

For each planted span-kind row whose attacked eval item regressed, the drill-down scores every sentence of the row
against that one item's query; a hit is the planted wrong sentence ranked first. The shipped default (the case
config's query signal and preconditioner) is compared with contrastive + diagonal, what the drill-down used first.

    .venv/bin/python bench/spans.py --cases /work/bench-cases span-0
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # accuracy_methods next to this file

RESULTS = Path(__file__).resolve().parent / "results" / "spans"
VARIANTS = {"shipped default": (None, None), "contrastive, diagonal": ("contrastive", "diagonal")}


def score_case(workdir: Path, base_model: str) -> dict[str, Any]:
    """Top-1 localization per variant on one span case."""
    from accuracy_methods import load_case, span_localization

    from gradian.demo.run import demo_config
    from gradian.demo.scenarios import make_scenario
    from gradian.report.reader import read_report

    kind, seed = workdir.name.rsplit("-", 2)[-2:]
    scenario = make_scenario(kind, int(seed))
    report = read_report(workdir / "report")
    case = load_case(workdir, base_model, demo_config(scenario), report)
    variants = {name: span_localization(case, scenario, signal, kind_name)
                for name, (signal, kind_name) in VARIANTS.items()}
    print(f"  {workdir.name}: " + "; ".join(f"{name} {v['top1_hits']}/{v['checked']}" for name, v in variants.items()),
          flush=True)
    return {"case": workdir.name, "variants": variants}


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """Hits / checked per case and variant, and the totals."""
    names = list(VARIANTS)
    lines = ["# Span top-1 localization", "", f"`{command}`", "",
             "| case | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for case in cases:
        lines.append(f"| {case['case']} | " + " | ".join(
            f"{case['variants'][n]['top1_hits']}/{case['variants'][n]['checked']}" for n in names) + " |")
    totals = {n: (sum(c["variants"][n]["top1_hits"] for c in cases), sum(c["variants"][n]["checked"] for c in cases))
              for n in names}
    lines.append("| **all** | " + " | ".join(f"**{h}/{c} ({h / c:.0%})**" if c else "-"
                                           for h, c in totals.values()) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/spans.json and .md."""
    from finished_cases import rescoring_main

    return rescoring_main("spans", __doc__.splitlines()[0], RESULTS, argv,
                          lambda workdir, args: score_case(workdir, args.base_model), markdown)


if __name__ == "__main__":
    raise SystemExit(main())
