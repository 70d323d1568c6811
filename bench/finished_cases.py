"""Shared by the benchmarks that re-score finished accuracy cases: which named cases are missing, and the results."""

from __future__ import annotations

import json
import sys
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
