"""Reports: verdict first, provenance present, byte-identical across runs, refusal and no-capability-target kinds."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from gradian.attribution import (
    ArraySource,
    SpanDrill,
    cluster_blame,
    clusters_from_field,
    diagonal_preconditioner,
    score_examples,
)
from gradian.config import EvaluationConfig, GradianConfig
from gradian.data.examples import Message, make_example
from gradian.evaluation import capability_from_scores
from gradian.query.spans import SpanBlame
from gradian.report import (
    NO_CAPABILITY_TARGET_TEXT,
    SCHEMA,
    ItemColumns,
    Provenance,
    ReportWarning,
    attribution_report,
    no_capability_target_report,
    refusal_report,
    render_json,
    render_markdown,
    write_report,
)
from gradian.report import plots as report_plots
from gradian.report.scores import parquet_available

STAMP = "2025-01-01T00:00:00+00:00"
COMMAND = "gradian attribute --base-model tiny --adapter out/adapter --dataset train.jsonl --eval-dataset eval.jsonl"
MANIFEST = {"index_id": "idx-1234", "dataset_sha256": "ab" * 8, "grads": {"projection_dim": None}}


def _eval_items(n: int):
    return [make_example(i, messages=[Message("user", f"Capital of country {i}?"), Message("assistant", f"City {i}")])
            for i in range(n)]


def _capability(base, tuned):
    items = _eval_items(len(base))
    return capability_from_scores(
        "exact_match", items, base, tuned, EvaluationConfig(bootstrap_samples=1000),
        base_outputs=[f"City {i}" for i in range(len(base))],
        finetuned_outputs=[f"City {i}" if t else f"Wrong | <city> {i}" for i, t in enumerate(tuned)])


def _provenance(stamp: str = STAMP) -> Provenance:
    return Provenance(command=COMMAND, manifest=MANIFEST, index_id="idx-1234",
                      versions={"gradian-core": "0.1.0", "numpy": "2.x"},
                      config=GradianConfig().to_dict(), generated_at=stamp)


def _attributed(stamp: str = STAMP, normalize: bool = False):
    rng = np.random.default_rng(0)
    n, dim = 80, 12
    failure = rng.normal(size=dim)
    train = rng.normal(size=(n, dim))
    planted = np.arange(10, 18)
    train[planted] = -3 * failure + 0.3 * rng.normal(size=(8, dim))
    examples = [make_example(i, messages=[Message("user", f"Tell me about {i}."),
                                          Message("assistant", f"Entry {i}. It is fine.\nSecond line | pipe.")],
                             fields={"source": "vendor" if i in planted else ("wiki" if i % 2 else "forum")})
                for i in range(n)]
    ids = [e.id for e in examples]
    capability = _capability([1.0] * 12, [0.0] * 9 + [1.0] * 3)
    regressed = capability.regressed_ids
    queries = failure + 0.2 * rng.normal(size=(len(regressed), dim))
    pre = diagonal_preconditioner((train**2).mean(axis=0))
    scores = score_examples(ArraySource(train, ids), queries, preconditioner=pre, item_ids=regressed,
                            normalize=normalize, top_k=5)
    clusters = cluster_blame(scores.blame, clusters_from_field(examples, "source", ids=ids), permutations=200)
    top_id = scores.top_ids()[0]
    spans = [SpanDrill(example_id=top_id, position=scores.ids.index(top_id), query_item=regressed[0],
                       spans=(SpanBlame("Entry 10.", 0, 9, 1, 0, 4, 0.25),
                              SpanBlame("It is fine.", 10, 21, 1, 4, 9, 1.5)))]
    texts = {e.id: e.supervised_text for e in examples}
    report = attribution_report(scores=scores, capability=capability, preconditioner=pre, texts=texts,
                                provenance=_provenance(stamp), clusters=clusters, spans=spans,
                                warnings=[ReportWarning("data.duplicates", "3 near-duplicate pairs in the dataset")])
    return report, scores, clusters


def test_attributed_report_puts_the_verdict_first_and_provenance_last():
    report, scores, clusters = _attributed()
    md = render_markdown(report)
    assert md.startswith("# Gradian attribution report\n\n## Verdict\n")
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections == ["## Verdict", "## Capability", "## Top blamed examples", "## Clusters", "## Span drill-down",
                        "## Plots", "## Warnings", "## Method", "## Provenance"]
    verdict = md.split("## Capability")[0]
    cap = report["capability"]
    assert f"{cap['delta']:+.4g}" in verdict and f"[{cap['ci_low']:+.4g}, {cap['ci_high']:+.4g}]" in verdict
    assert "`vendor`" in verdict and scores.top_ids()[0] in verdict
    assert clusters.accused is not None and report["verdict"]["accused_cluster"] == "vendor"
    provenance = md.split("## Provenance")[1]
    assert COMMAND in provenance and "[manifest.json](manifest.json)" in provenance and "idx-1234" in provenance
    assert '"dataset_sha256"' not in md  # the manifest is linked, not inlined
    assert "Second line \\| pipe." in md  # a pipe in an excerpt stays inside its table cell
    assert "&lt;city&gt;" not in md and "&lt;city>" in md


def test_report_json_has_the_versioned_schema():
    report, scores, _ = _attributed()
    data = json.loads(render_json(report))
    assert data["schema"] == SCHEMA == "gradian.report/1"
    assert list(data) == ["schema", "verdict", "capability", "query_signal", "method", "top_examples", "clusters",
                          "causes", "spans", "warnings", "plots", "scores", "provenance", "generated_at"]
    top = data["top_examples"][0]
    assert set(top) == {"rank", "id", "position", "blame", "cluster", "excerpt", "item_blame"}
    assert top["rank"] == 1 and top["cluster"] == "vendor" and len(top["item_blame"]) == len(scores.item_ids)
    assert data["method"]["preconditioner"] == "diagonal" and "damping" in data["method"]["preconditioner_knobs"]
    assert data["method"]["clusters"]["permutations"] == 200
    assert data["query_signal"] == {"requested": "auto", "effective": "divergent-token", "note": None}
    assert data["spans"][0]["top_span"] == 1
    assert data["spans"][0]["spans"][1] == {"text": "It is fine.", "message_index": 1, "start": 10, "end": 21,
                                            "blame": 1.5}
    assert {"code": "data.duplicates", "message": "3 near-duplicate pairs in the dataset"} in data["warnings"]
    ranked = data["clusters"]["ranked"]
    assert ranked[0]["name"] == "vendor" and ranked[0]["accused"] and {"z", "p_value", "p_adjusted"} <= set(ranked[0])


def test_every_significant_cluster_is_accused_in_the_report_the_most_blamed_per_member_first(tmp_path):
    """A broad mildly blamed cluster out-z's a small strongly blamed one: both accused, the small one named first."""
    from gradian.attribution import ClusterAssignment
    from gradian.report.scores import accused_names

    report, scores, _ = _attributed()
    n = len(scores.ids)
    rng = np.random.default_rng(4)
    blame = rng.normal(size=n)
    labels = np.zeros(n, dtype=np.int64)
    labels[:20], labels[20:28] = 1, 2
    blame[:20] += 2.0
    blame[20:28] += 2.6
    clusters = cluster_blame(blame, ClusterAssignment(("clean", "broad", "narrow"), labels, "field", "source"),
                             permutations=400)
    assert clusters.scores[0].name == "broad" and [s.name for s in clusters.accused_all] == ["narrow", "broad"]
    capability = _capability([1.0] * 12, [0.0] * 9 + [1.0] * 3)
    pre = diagonal_preconditioner(np.ones(4))
    report = attribution_report(scores=scores, capability=capability, preconditioner=pre,
                                texts={i: "text" for i in scores.ids}, provenance=_provenance(STAMP), clusters=clusters)
    verdict = report["verdict"]
    assert verdict["accused_cluster"] == "narrow" and verdict["accused_clusters"] == ["narrow", "broad"]
    assert verdict["headline"] == "Attributed: cluster `narrow` (and `broad`) are blamed."
    assert "Also significant, with less blame per member: `broad`" in verdict["summary"]
    ranked = {row["name"]: row for row in report["clusters"]["ranked"]}
    assert ranked["narrow"]["accused"] and ranked["broad"]["accused"] and not ranked["clean"]["accused"]
    assert ranked["narrow"]["effect"] > ranked["broad"]["effect"] > 0
    assert report["clusters"]["accused_all"] == ["narrow", "broad"] and set(accused_names(report)) == {"narrow", "broad"}


def test_a_report_that_accuses_nothing_says_the_regression_may_have_no_data_cause():
    from gradian.attribution import ClusterAssignment

    report, scores, _ = _attributed()
    n = len(scores.ids)
    noise = np.random.default_rng(3).normal(size=n)
    clusters = cluster_blame(noise, ClusterAssignment(("a", "b"), np.arange(n) % 2, "field", "source"),
                             permutations=200)
    assert clusters.accused is None
    report = attribution_report(scores=scores, capability=_capability([1.0] * 12, [0.0] * 9 + [1.0] * 3),
                                preconditioner=diagonal_preconditioner(np.ones(4)), texts={},
                                provenance=_provenance(STAMP), clusters=clusters)
    assert report["verdict"]["headline"] == "Attributed: no cluster stands out; read the top examples."
    assert "it may have no data cause" in report["verdict"]["summary"] and report["verdict"]["accused_clusters"] == []


def test_two_runs_write_byte_identical_files_and_only_the_timestamp_differs(tmp_path):
    first, scores, clusters = _attributed()
    files = write_report(first, tmp_path / "a", scores=scores, clusters=clusters)
    again, scores2, clusters2 = _attributed()
    files2 = write_report(again, tmp_path / "b", scores=scores2, clusters=clusters2)
    assert files.json.read_bytes() == files2.json.read_bytes()
    assert files.markdown.read_bytes() == files2.markdown.read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(
        ["report.json", "report.md", "report.html", "manifest.json", *(p.name for p in files.scores),
         report_plots.BLAME_PLOT, report_plots.ITEMS_PLOT])  # no temp files left
    for name in ("report.html", "manifest.json", *(p.name for p in files.scores)):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    for plot in files.plots:
        assert plot.read_bytes().startswith(b"\x89PNG")
        assert plot.read_bytes() == (tmp_path / "b" / plot.name).read_bytes()
    assert "![blame distribution](blame_distribution.png)" in files.markdown.read_text()
    later, _, _ = _attributed(stamp="2030-06-01T12:00:00+00:00")
    changed = [(a, b) for a, b in zip(render_markdown(first).splitlines(), render_markdown(later).splitlines(),
                                      strict=True) if a != b]
    assert len(changed) == 1 and changed[0][1].startswith("Generated at 2030-06-01")
    diff_json = {k for k in first if first[k] != later[k]}
    assert diff_json == {"generated_at"}


def test_plots_are_skipped_with_a_note_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setattr(report_plots, "matplotlib_available", lambda: False)
    report, scores, clusters = _attributed()
    files = write_report(report, tmp_path, scores=scores, clusters=clusters)
    assert files.plots == ()
    assert report_plots.MISSING_NOTE in files.markdown.read_text()
    assert json.loads(files.json.read_text())["plots"] == {"files": [], "note": report_plots.MISSING_NOTE}


def test_normalize_is_flagged_in_the_warnings():
    report, _, _ = _attributed(normalize=True)
    assert "attribution.normalize" in [w["code"] for w in report["warnings"]]
    assert "attribution.normalize" not in [w["code"] for w in _attributed()[0]["warnings"]]


def test_not_significant_delta_refuses_with_the_numbers_and_the_advice(tmp_path):
    capability = _capability([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    assert not capability.significant
    report = refusal_report(capability=capability, provenance=_provenance())
    files = write_report(report, tmp_path)
    md = files.markdown.read_text()
    assert md.startswith("# Gradian attribution report\n\n## Verdict\n\n**Not attributed: the capability delta is "
                         "not significant.**")
    assert "Widen it" in md and "require_significant: false" in md
    assert f"{capability.delta:+.4g}" in md and "## Top blamed examples" not in md and "## Provenance" in md
    data = json.loads(files.json.read_text())
    assert data["verdict"]["kind"] == "not_significant"
    assert data["top_examples"] == [] and data["clusters"] is None and data["method"] is None
    assert data["provenance"]["command"] == COMMAND and files.plots == ()
    assert refusal_report(capability=capability, provenance=_provenance()) == report


def test_significant_improvement_is_refused_as_improved():
    capability = _capability([0.0] * 12, [1.0] * 12)
    report = refusal_report(capability=capability, provenance=_provenance())
    assert report["verdict"]["kind"] == "improved" and "not worse" in report["verdict"]["headline"]


def test_no_eval_set_report_says_it_is_not_a_diagnosis(tmp_path):
    rng = np.random.default_rng(1)
    train = rng.normal(size=(30, 6))
    ids = [f"ex-{i:06d}-00000000" for i in range(30)]
    pre = diagonal_preconditioner((train**2).mean(axis=0))
    scores = score_examples(ArraySource(train, ids), train[:4], preconditioner=pre, item_ids=ids[:4], top_k=5)
    report = no_capability_target_report(scores=scores, preconditioner=pre, texts={i: f"text of {i}" for i in ids},
                                         provenance=_provenance())
    files = write_report(report, tmp_path, scores=scores)
    md = files.markdown.read_text()
    verdict = md.split("## ")[1]
    assert verdict.startswith("Verdict") and NO_CAPABILITY_TARGET_TEXT in verdict
    assert ("You ran without --eval-dataset, so Gradian fell back to attributing against the first few training "
            "examples. It runs, but it is not a diagnosis.") in verdict
    data = json.loads(files.json.read_text())
    assert data["verdict"]["kind"] == "no_capability_target" and data["capability"] is None
    assert data["warnings"][0]["code"] == "attribution.no_capability_target"
    assert data["method"]["query_items"] == ids[:4] and len(data["top_examples"]) == 5
    assert "## Provenance" in md and files.plots == (tmp_path / report_plots.BLAME_PLOT,)


def test_non_finite_numbers_become_null_not_invalid_json():
    report, _, _ = _attributed()
    report["top_examples"][0]["blame"] = None
    assert json.loads(render_json(report))["top_examples"][0]["blame"] is None
    assert "n/a" in render_markdown(report)
    with pytest.raises(ValueError):
        render_json({"x": float("nan")})


def test_importing_attribution_and_report_imports_neither_torch_nor_matplotlib():
    code = ("import sys, gradian.attribution, gradian.report; "
            "print(sorted(m for m in ('torch', 'matplotlib', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- every score, the manifest file, report.html ------------------------------------------------


def _read_scores_csv(path):
    """scores.csv as a list of dicts, with pandas when installed (what a user would do), else the csv module."""
    try:
        import pandas
    except ImportError:
        import csv

        with open(path, newline="", encoding="utf-8") as handle:
            return [dict(row) for row in csv.DictReader(handle)]
    return pandas.read_csv(path).to_dict("records")


def test_scores_csv_holds_every_example_most_blamed_first_with_its_cluster(tmp_path):
    report, scores, clusters = _attributed()
    matrix = np.arange(len(scores) * len(scores.item_ids), dtype=np.float64).reshape(len(scores), -1) / 7
    files = write_report(report, tmp_path, scores=scores, clusters=clusters, items=ItemColumns(matrix, scores.item_ids))
    rows = _read_scores_csv(tmp_path / "scores.csv")
    assert len(rows) == len(scores) and [int(r["rank"]) for r in rows] == list(range(1, len(scores) + 1))
    assert [r["id"] for r in rows[:5]] == list(scores.top_ids())
    first = rows[0]
    position = int(first["position"])
    assert first["cluster"] == "vendor" and str(first["accused"]).lower() == "true"
    assert float(first["blame"]) == scores.blame[position]  # the shortest round-trip text loses nothing
    for q, item in enumerate(scores.item_ids):
        assert float(first[f"item:{item}"]) == matrix[position, q]
    data = json.loads(files.json.read_text())
    assert data["scores"]["files"][0] == "scores.csv" and data["scores"]["rows"] == len(scores)
    assert len(data["top_examples"]) == 5  # report.json keeps its top-k; the rest is in the scores files
    assert "[scores.csv](scores.csv)" in files.markdown.read_text()


def test_scores_parquet_has_the_same_rows_typed(tmp_path):
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    report, scores, clusters = _attributed()
    write_report(report, tmp_path, scores=scores, clusters=clusters)
    table = pandas.read_parquet(tmp_path / "scores.parquet")
    text = pandas.read_csv(tmp_path / "scores.csv")
    assert list(table.columns) == list(text.columns) == ["position", "id", "rank", "blame", "cluster", "accused"]
    assert table["accused"].dtype == bool and table["rank"].tolist() == text["rank"].tolist()
    assert table["blame"].tolist() == text["blame"].tolist()


def test_the_blame_the_clusters_were_tested_on_follows_the_item_columns_in_both_files(tmp_path):
    report, scores, clusters = _attributed()
    shape = (len(scores), len(scores.item_ids))
    matrix, tested = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) / 7, np.full(shape, -1.5)
    tested[:, 0] = np.arange(len(scores)) / 3
    files = write_report(report, tmp_path, scores=scores, clusters=clusters, items=ItemColumns(matrix, scores.item_ids),
                         tested=ItemColumns(tested, scores.item_ids))
    rows = _read_scores_csv(tmp_path / "scores.csv")
    names = [*(f"item:{item}" for item in scores.item_ids), *(f"tested:{item}" for item in scores.item_ids)]
    assert list(rows[0])[-len(names):] == names
    assert json.loads(files.json.read_text())["scores"]["columns"][-len(names):] == names
    for row in rows:
        assert float(row[f"tested:{scores.item_ids[0]}"]) == tested[int(row["position"]), 0]
    if parquet_available():
        pandas = pytest.importorskip("pandas")
        table = pandas.read_parquet(tmp_path / "scores.parquet")
        assert list(table.columns) == list(rows[0])
        assert table[f"tested:{scores.item_ids[0]}"].tolist() == [float(row[f"tested:{scores.item_ids[0]}"])
                                                                 for row in rows]


def test_without_pyarrow_only_the_csv_is_written_and_the_report_says_so(tmp_path, monkeypatch):
    from gradian.report import scores as score_files

    (tmp_path / "scores.parquet").write_bytes(b"from an earlier run")
    monkeypatch.setattr(score_files, "parquet_available", lambda: False)
    report, scores, clusters = _attributed()
    files = write_report(report, tmp_path, scores=scores, clusters=clusters)
    assert [p.name for p in files.scores] == ["scores.csv"] and not (tmp_path / "scores.parquet").exists()
    data = json.loads(files.json.read_text())
    assert data["scores"]["files"] == ["scores.csv"] and "pip install 'gradian-core[parquet]'" in data["scores"]["note"]
    assert score_files.PARQUET_MISSING_NOTE in files.markdown.read_text()


def test_the_manifest_is_its_own_file_linked_from_report_md(tmp_path):
    report, scores, clusters = _attributed()
    files = write_report(report, tmp_path, scores=scores, clusters=clusters)
    assert json.loads(files.manifest.read_text()) == MANIFEST
    assert "[manifest.json](manifest.json)" in files.markdown.read_text()


def _html_structure(text: str) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """Headings in order, (tag, src/href) of every asset reference, and the text, via the standard parser."""
    from html.parser import HTMLParser

    class Collect(HTMLParser):
        def __init__(self):
            super().__init__()
            self.headings, self.refs, self.text, self._in = [], [], [], None

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag in ("h2", "table", "details", "summary"):
                self.headings.append(tag if tag != "h2" else "")
                self._in = tag if tag == "h2" else None
            for key in ("src", "href"):
                if key in attrs:
                    self.refs.append((tag, attrs[key]))

        def handle_data(self, data):
            if self._in == "h2":
                self.headings[-1] = "h2:" + data
                self._in = None
            self.text.append(data)

    parser = Collect()
    parser.feed(text)
    parser.close()
    return parser.headings, parser.refs, parser.text


def test_report_html_is_self_contained_verdict_first_and_escapes_user_text(tmp_path):
    report, scores, clusters = _attributed()
    files = write_report(report, tmp_path, scores=scores, clusters=clusters)
    text = files.html.read_text(encoding="utf-8")
    headings, refs, body = _html_structure(text)
    assert headings[0] == "h2:Verdict" and headings.index("h2:Verdict") < headings.index("table")
    assert headings.index("h2:Provenance") < headings.index("details")  # provenance is collapsed
    images = [src for tag, src in refs if tag == "img"]
    assert len(images) == len(files.plots) and all(src.startswith("data:image/png;base64,") for src in images)
    assert all(not ref.startswith(("http:", "https:", "//")) for _, ref in refs)  # no external assets
    assert "<link" not in text and "<script" not in text
    assert "<city>" not in text and "&lt;city&gt;" in text  # a model's output is text, never markup
    assert any("Wrong | <city>" in chunk for chunk in body)  # ...and reads back as the original text
    assert report["verdict"]["headline"].replace("`", "") in "".join(body)
    assert "<p class=\"headline\">Attributed: cluster <code>vendor</code> is blamed.</p>" in text  # `x` -> <code>


def test_backticked_names_in_html_paragraphs_are_code_and_still_escaped():
    from gradian.report.html import _p

    assert _p("cluster `a<b>` and `c`") == "<p>cluster <code>a&lt;b&gt;</code> and <code>c</code></p>"
    assert _p("one ` backtick <x>") == "<p>one ` backtick &lt;x&gt;</p>"  # unpaired: every character as written
