"""report.json read back as typed records: the values the writer wrote, and a one-line error for a bad file."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from gradian.cli.app import main
from gradian.errors import ReportError
from gradian.report.reader import (
    Capability,
    ClusterMethod,
    DrillRow,
    IndexedInputs,
    SpanRow,
    parse_report,
    read_report,
)
from tests.core.counterfactual_reports import write_dataset, write_eval, write_report_dir

STAMP = "2026-01-01T00:00:00+00:00"


@pytest.fixture
def written(tmp_path):
    """A report directory written by the real writer: the planted cluster accused, clusters by ``source``."""
    dataset = write_dataset(tmp_path / "train.jsonl")
    return write_report_dir(tmp_path / "report", dataset, write_eval(tmp_path / "eval.jsonl"))


def _document(directory):
    return json.loads((directory / "report.json").read_text(encoding="utf-8"))


def test_an_attributed_report_reads_back_with_the_values_the_writer_wrote(written):
    document = _document(written)
    report = read_report(written)
    verdict = document["verdict"]
    assert (report.verdict.kind, report.verdict.headline, report.verdict.summary) == (
        verdict["kind"], verdict["headline"], verdict["summary"])
    assert report.verdict.accused_cluster == verdict["accused_cluster"] == "planted"
    assert report.verdict.accused_clusters == tuple(verdict["accused_clusters"])
    assert report.attributed and report.accused_names == ("planted",)
    # Cluster rows keep every field in the writer's order, so a reader can pass them on unchanged (inject.json).
    assert [dataclasses.asdict(row) for row in report.clusters] == document["clusters"]["ranked"]
    assert report.cluster("planted") == report.clusters[0] and report.cluster("travel") is None
    assert [(row.rank, row.id, row.blame, row.cluster, row.excerpt) for row in report.top_examples] == [
        (row["rank"], row["id"], row["blame"], row["cluster"], row["excerpt"]) for row in document["top_examples"]]
    capability = document["capability"]
    fields = {f.name for f in dataclasses.fields(Capability)}
    as_json = json.loads(json.dumps(dataclasses.asdict(report.capability)))  # tuples back to arrays
    assert as_json == {key: value for key, value in capability.items() if key in fields}
    assert report.capability.items and report.capability.n_regressed == capability["n_regressed"]
    clusters = document["method"]["clusters"]
    assert report.cluster_method == ClusterMethod(method="field", field="source", knobs=clusters["knobs"])
    provenance = document["provenance"]
    assert report.provenance.command == provenance["command"] and report.provenance.index_id == "0" * 16
    assert report.provenance.config == provenance["config"]
    assert report.provenance.inputs == IndexedInputs(
        dataset_sha256=provenance["manifest"]["sources"]["dataset_file_sha256"])
    assert report.directory == written and report.document == document
    assert report.causes == () and document.get("causes") is None  # causes are not looked for without query gradients


def test_a_refusal_reads_back_with_nothing_blamed(tmp_path):
    dataset = write_dataset(tmp_path / "train.jsonl")
    report = read_report(write_report_dir(tmp_path / "report", dataset, write_eval(tmp_path / "eval.jsonl"),
                                          regressed=False))
    assert report.verdict.kind == "not_significant" and not report.attributed
    assert report.top_examples == () and report.clusters == () and report.cluster_method is None
    assert report.accused_names == () and report.capability is not None and not report.capability.significant


def test_a_report_without_an_eval_set_reads_back_its_spans_and_null_numbers(tmp_path):
    from gradian.attribution import ArraySource, SpanDrill, diagonal_preconditioner, score_examples
    from gradian.query.spans import SpanBlame
    from gradian.report import Provenance, no_capability_target_report, write_report

    train = np.random.default_rng(1).normal(size=(30, 6))
    ids = [f"ex-{i:06d}-00000000" for i in range(30)]
    pre = diagonal_preconditioner((train**2).mean(axis=0))
    scores = score_examples(ArraySource(train, ids), train[:4], preconditioner=pre, item_ids=ids[:4], top_k=5)
    top = scores.top_ids()[0]
    drill = SpanDrill(example_id=top, position=ids.index(top), query_item=ids[0],
                      spans=(SpanBlame("One.", 0, 4, 1, 0, 2, 0.5), SpanBlame("Two.", 5, 9, 1, 2, 4, float("nan"))))
    document = no_capability_target_report(scores=scores, preconditioner=pre, texts={i: f"text of {i}" for i in ids},
                                           provenance=Provenance(command="gradian attribute", versions={},
                                                                 generated_at=STAMP), spans=[drill])
    write_report(document, tmp_path, scores=scores, draw_plots=False)
    report = read_report(tmp_path)
    assert report.verdict.kind == "no_capability_target" and report.attributed and report.capability is None
    assert report.spans == (DrillRow(example_id=top, query_item=ids[0], spans=(SpanRow("One.", 1, 0, 4, 0.5),
                                                                               SpanRow("Two.", 1, 5, 9, None))),)
    assert [row.id for row in report.top_examples] == list(scores.top_ids())
    assert report.provenance.inputs == IndexedInputs() and report.provenance.index_id is None


def test_a_schema_1_report_from_before_every_significant_cluster_was_accused_still_reads(written):
    document = _document(written)
    del document["verdict"]["accused_clusters"]
    for row in document["clusters"]["ranked"]:
        del row["accused"], row["effect"]
    report = parse_report(document, "old/report.json")
    assert report.verdict.accused_clusters == ("planted",) and report.accused_names == ("planted",)
    assert report.clusters[0].effect is None and not report.clusters[0].accused


def _set(path, value):
    def change(document):
        *parents, last = path
        for key in parents:
            document = document[key]
        document[last] = value
    return change


def _drop(*path):
    def change(document):
        *parents, last = path
        for key in parents:
            document = document[key]
        del document[last]
    return change


@pytest.mark.parametrize(("change", "needle"), [
    (_set(["schema"], "gradian.report/2"), "has schema 'gradian.report/2'; this gradian reads gradian.report/1"),
    (_set(["schema"], "gradian.verify/1"), "is not a gradian attribution report (schema 'gradian.verify/1')"),
    (_drop("verdict", "headline"), "report.json: verdict.headline is missing"),
    (_drop("provenance"), "report.json: provenance is missing"),
    (_set(["clusters", "ranked", 0, "size"], "six"),
     "report.json: clusters.ranked[0].size is a string, expected a whole number"),
    (_set(["top_examples", 1, "blame"], "high"), "report.json: top_examples[1].blame is a string, expected a number"),
    (_set(["capability", "items"], {}), "report.json: capability.items is an object, expected an array"),
    (_set(["verdict", "accused_clusters"], ["planted", 3]),
     "report.json: verdict.accused_clusters[1] is a number, expected a string"),
    (_set(["causes"], [{"cause": 1, "items": ["ex-1"], "accused_clusters": [3]}]),
     "report.json: causes[0].accused_clusters[0] is a number, expected a string"),
])
def test_a_malformed_report_is_one_error_naming_the_field(written, tmp_path, capsys, change, needle):
    document = _document(written)
    change(document)
    (written / "report.json").write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(ReportError) as caught:
        read_report(written)
    assert needle in caught.value.message and caught.value.hint
    # Through the CLI: exit code 2 and one line with the hint, no traceback.
    assert main(["export", "--report", str(written), "--drop", "accused", "--out", str(tmp_path / "c.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "(hint: " in err, err


@pytest.mark.parametrize(("write", "needle"), [
    (None, "does not exist"),
    (lambda d: d.mkdir(), "is not an attribution report (no report.json)"),
    (lambda d: (d.mkdir(), (d / "report.json").write_text('{"schema": ')), "report.json:1: not valid JSON"),
    (lambda d: (d.mkdir(), (d / "report.json").write_text("[1, 2]")), "report.json is not a JSON object"),
])
def test_a_missing_or_unreadable_report_file_is_one_line(tmp_path, capsys, write, needle):
    directory = tmp_path / "report"
    if write is not None:
        write(directory)
    with pytest.raises(ReportError) as caught:
        read_report(directory)
    assert needle in caught.value.message
    assert main(["verify", "--report", str(directory), "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "(hint: " in err, err


def test_the_terminal_verdict_is_printed_from_the_typed_report(written):
    from gradian.cli.attribute_cmd import verdict_text

    report = read_report(written)
    lines = verdict_text(report).splitlines()
    capability = report.capability
    assert lines[0] == report.verdict.headline
    assert lines[1].startswith(f"capability (contains): base {capability.base_mean:.3f} -> fine-tuned ")
    planted = report.cluster("planted")
    assert lines[2] == (f"accused cluster: planted (rank 1 of {len(report.clusters)}, {planted.size} examples, "
                        f"p = {planted.p_value:.3g}, family-wise p = {planted.p_adjusted:.3g})")
    top = report.top_examples[0]
    assert lines[3].startswith(f"  #1 {top.id} blame {top.blame:+.3g} [planted] ")
    assert len(lines) == 3 + min(5, len(report.top_examples))
