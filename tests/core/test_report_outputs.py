"""What `gradian attribute` leaves a user: every score, report.html, machine-readable output, progress in a log."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from gradian.cli.app import main
from gradian.data import load_dataset
from tests.core.counterfactual_reports import write_dataset, write_eval
from tests.core.test_report_files import _html_structure, _read_scores_csv


@pytest.fixture(scope="module")
def attributed(tiny_base_dir, tiny_adapter_dir, tmp_path_factory):
    """One real `gradian attribute --format json` run on the tiny Llama, its stdout and (non-terminal) stderr."""
    root = tmp_path_factory.mktemp("attributed")
    train, evals = write_dataset(root / "train.jsonl"), write_eval(root / "eval.jsonl")
    out, stdout, stderr = root / "report", io.StringIO(), io.StringIO()
    argv = ["attribute", "--base-model", str(tiny_base_dir), "--adapter", str(tiny_adapter_dir), "--dataset",
            str(train), "--eval-dataset", str(evals), "--out", str(out), "--index", str(root / "index"),
            "--set", "attribution.cluster_field=source", "--set", "evaluation.require_significant=false",
            "--format", "json"]
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    assert code == 0, stderr.getvalue()
    return {"train": train, "out": out, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


def test_format_json_prints_report_json_and_nothing_else_on_stdout(attributed):
    printed = json.loads(attributed["stdout"])
    assert printed == json.loads((attributed["out"] / "report.json").read_text())
    assert printed["scores"]["files"][0] == "scores.csv"


def test_scores_csv_has_every_training_example_and_agrees_with_report_json(attributed):
    report = json.loads((attributed["out"] / "report.json").read_text())
    rows = _read_scores_csv(attributed["out"] / "scores.csv")
    examples = load_dataset(attributed["train"])
    assert sorted(row["id"] for row in rows) == sorted(examples.ids)
    assert [int(row["rank"]) for row in rows] == list(range(1, len(examples) + 1))
    items = report["method"]["query_items"]
    for top, row in zip(report["top_examples"], rows, strict=False):
        assert row["id"] == top["id"] and int(row["position"]) == top["position"] and row["cluster"] == top["cluster"]
        assert float(row["blame"]) == pytest.approx(top["blame"], rel=1e-12)
        assert [float(row[f"item:{item}"]) for item in items] == pytest.approx(top["item_blame"], rel=1e-12)


def test_report_html_of_a_real_run_parses_with_the_verdict_before_any_table(attributed):
    headings, refs, _ = _html_structure((attributed["out"] / "report.html").read_text(encoding="utf-8"))
    assert headings[0] == "h2:Verdict" and headings.index("h2:Verdict") < headings.index("table")
    assert [src[:22] for tag, src in refs if tag == "img"] == ["data:image/png;base64,"] * 2


def test_report_md_links_the_manifest_instead_of_inlining_it(attributed):
    md = (attributed["out"] / "report.md").read_text()
    manifest = (attributed["out"] / "manifest.json").read_text()
    assert "[manifest.json](manifest.json)" in md and '"lora_blocks"' in manifest and '"lora_blocks"' not in md


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(attributed):
    lines = attributed["stderr"].splitlines()
    assert "gradian: index 30/30 (100%)" in "\n".join(lines)
    assert any(line.startswith("gradian: evaluate base ") for line in lines)
    assert "━" not in attributed["stderr"]  # no progress bar drawn into a log


def test_export_top_k_round_trips_through_gradians_own_loader(attributed, tmp_path, capsys):
    out = tmp_path / "clean.jsonl"
    assert main(["export", "--report", str(attributed["out"]), "--drop", "top:3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((attributed["out"] / "report.json").read_text())
    dropped = [row["id"] for row in report["top_examples"][:3]]
    assert "dropped 3 of 30 rows" in printed and all(i in printed for i in dropped) and "wrote 27 rows" in printed
    original, clean = load_dataset(attributed["train"]), load_dataset(out)
    kept = [e for e in original if e.id not in dropped]
    assert [(e.messages, dict(e.fields)) for e in clean] == [(e.messages, dict(e.fields)) for e in kept]
    lines = attributed["train"].read_bytes().splitlines(keepends=True)
    assert out.read_bytes() == b"".join(lines[e.index] for e in kept)  # the user's own bytes, not re-serialized
