"""What each verify retrain answers on the regressed items no retrain gave back: the fine-tune's wrong answer, or another.

verify counts a regressed item back only when a retrained model gives the wanted answer again; an item it calls stuck
scores at or under the fine-tune in every retrain. This asks what those retrains answer there. Where the model
trained without the accused rows answers otherwise than the fine-tune while a random drop keeps the fine-tune's answer,
the accused rows caused the fine-tune's answer and something every retrain shares (the training settings) broke the
item anyway, which caps what any drop can recover.

    .venv/bin/python bench/stuck_answers.py --cases /work/bench-cases rank-lr5e4-format-4 rank-lr5e4-two_causes-4
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "stuck_answers"


def retrain_answers(verify_dir: Path, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """Per retrained model of a verify run (dropped, control-N), its answer to each of the eval items ``ids``."""
    from gradian.config import build_config
    from gradian.counterfactual.verify import evaluate_adapter
    from gradian.data import load_eval_dataset

    result = json.loads((verify_dir / "verify.json").read_text())
    config = build_config(result["config"])
    wanted = set(ids)
    items = [item for item in load_eval_dataset(Path(result["inputs"]["eval_dataset"])) if item.id in wanted]
    answers: dict[str, dict[str, str]] = {}
    for model in result["models"]:
        if model["role"] == "full" or not items:
            continue
        evaluation = evaluate_adapter(result["inputs"]["base_model"], Path(model["training"]["adapter_dir"]), items,
                                      config)
        answers[model["name"]] = {item.id: item.finetuned_output or "" for item in evaluation.items}
    return answers


def same_answer(first: str, second: str) -> bool:
    """Two outputs say the same, as the eval metrics compare text (case, punctuation and articles aside)."""
    from gradian.evaluation.metrics import normalize_answer

    return normalize_answer(first) == normalize_answer(second)


def score_case(directory: Path) -> dict[str, Any]:
    """One case's row: each stuck item's answers, and how many each retrain answers otherwise than the fine-tune."""
    from goal_table import verify_items

    from gradian.report.reader import read_report

    result = json.loads((directory / "verify" / "verify.json").read_text())
    # As the goal table counts them: a verify run before it named its stuck items counts too.
    _, _, by_item = verify_items(result)
    stuck = by_item.stuck
    capability = read_report(Path(result["inputs"]["report"])).capability
    scored = {item.id: item for item in capability.items} if capability else {}
    answers = retrain_answers(directory / "verify", stuck)
    items = []
    for item_id in stuck:
        report_item = scored[item_id]
        items.append({"id": item_id, "prompt": report_item.prompt, "wanted": report_item.wanted,
                      "base": report_item.base_output, "full": report_item.finetuned_output,
                      **{name: by_id[item_id] for name, by_id in answers.items()}})
    changed = {name: sum(not same_answer(item[name], item["full"] or "") for item in items) for name in answers}
    return {"case": directory.name, "regressed": len(by_item.regressed), "stuck": len(stuck),
            "changed": changed, "items": items}


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """The count per case, then every stuck item's answers."""
    from finished_cases import carried_note

    lines = ["# The regressed items no verify retrain gave back: what the retrains answer there", "", f"`{command}`", "",
             "A stuck item scores at or under the fine-tune in every retrain (the drop of the accused clusters and a "
             "random drop as large). Answers compare as the eval metrics compare text, so a respelling (\"St.\" for "
             "\"Saint\") counts as another answer.", "",
             "| case | regressed | stuck | stuck items answered otherwise than the fine-tune: without the accused | "
             "random drop |", "|---|---|---|---|---|"]
    for case in cases:
        changed = case["changed"]
        controls = [name for name in changed if name != "dropped"]
        lines.append(f"| {case['case']} | {case['regressed']} | {case['stuck']} | "
                     f"{changed.get('dropped', '-')} of {case['stuck']} | "
                     + ", ".join(f"{changed[name]} of {case['stuck']}" for name in controls) + " |")
    for case in cases:
        if not case["items"]:
            continue
        names = [name for name in case["items"][0] if name == "dropped" or name.startswith("control-")]
        lines += ["", f"## {case['case']}", "", "| wanted | base | fine-tune | " + " | ".join(names) + " |",
                  "|---|---|---|" + "---|" * len(names)]
        lines += [f"| {_cell(item['wanted'])} | {_cell(item['base'])} | {_cell(item['full'])} | "
                  + " | ".join(_cell(item[name]) for name in names) + " |" for item in case["items"]]
    carried = carried_note(cases)
    if carried:
        lines += ["", carried]
    return "\n".join(lines) + "\n"


def _cell(text: str | None) -> str:
    flat = " ".join((text or "").split()).replace("|", "\\|")
    return flat if len(flat) <= 50 else flat[:49] + "…"


def main(argv: list[str] | None = None) -> int:
    """Answer the stuck items of each named case's verify retrains and write bench/results/stuck_answers.*."""
    from finished_cases import carrying_main

    return carrying_main("stuck_answers", __doc__.splitlines()[0], RESULTS, argv,
                         lambda directory: (directory / "verify" / "verify.json").is_file(),
                         lambda directory, args: score_case(directory), markdown)


if __name__ == "__main__":
    raise SystemExit(main())
