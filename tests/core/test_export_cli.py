"""`gradian export`: the dataset minus the blamed rows, in its own format; bad input is one line and writes nothing."""

from __future__ import annotations

import codecs
import json

import pytest

from gradian.cli.app import main
from gradian.data import load_dataset
from tests.core.counterfactual_reports import N_CLEAN, N_PLANTED, PLANTED, write_dataset, write_eval, write_report_dir


def _content(examples):
    return [(e.messages, e.text, dict(e.fields)) for e in examples]


def _expected_without_planted(dataset):
    return _content(e for e in load_dataset(dataset) if e.fields["source"] != PLANTED)


def _one_line_error(capsys, argv, *needles):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("gradian: error: ") and "(hint: " in err, err
    for needle in needles:
        assert needle in err, err
    return err


def _as_crlf_with_bom(path):
    path.write_bytes(codecs.BOM_UTF8 + path.read_bytes().replace(b"\n", b"\r\n"))
    return path


def _as_json_array(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    target = path.with_suffix(".json")
    target.write_text(json.dumps(rows, indent=1))
    return target


def _as_parquet(path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    rows = [json.loads(line) for line in path.read_text().splitlines()]
    target = path.with_suffix(".parquet")
    parquet.write_table(pyarrow.Table.from_pylist(rows), target)
    return target


def _as_saved_dir(path):
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    target = path.parent / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(target))
    return target


@pytest.mark.parametrize(("fmt", "convert", "out_name"), [
    ("messages", None, "clean.jsonl"),
    ("alpaca", _as_crlf_with_bom, "clean.jsonl"),
    ("messages", _as_json_array, "clean.json"),
    ("alpaca", _as_parquet, "clean.parquet"),
    ("messages", _as_saved_dir, "clean"),
], ids=["jsonl-messages", "jsonl-alpaca-crlf-bom", "json-array", "parquet", "save-to-disk"])
def test_accused_is_dropped_and_the_rest_reads_back_unchanged(tmp_path, capsys, fmt, convert, out_name):
    dataset = write_dataset(tmp_path / "train.jsonl", fmt=fmt)
    dataset = convert(dataset) if convert else dataset
    report = write_report_dir(tmp_path / "report", dataset, write_eval(tmp_path / "eval.jsonl"))
    before = _read_all(dataset)
    out = tmp_path / out_name
    assert main(["export", "--report", str(report), "--drop", "accused", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"dropped {N_PLANTED} of {N_CLEAN + N_PLANTED} rows" in printed and "`planted`" in printed
    clean = load_dataset(out)
    assert {e.format for e in clean} == {fmt}
    assert _content(clean) == _expected_without_planted(dataset)
    assert _read_all(dataset) == before  # the user's dataset is never touched


def _read_all(path):
    if path.is_dir():
        return sorted((p.name, p.read_bytes()) for p in path.rglob("*") if p.is_file())
    return path.read_bytes()


def test_jsonl_lines_are_copied_byte_for_byte_with_the_bom_and_crlf(tmp_path):
    dataset = _as_crlf_with_bom(write_dataset(tmp_path / "train.jsonl", fmt="alpaca"))
    report = write_report_dir(tmp_path / "report", dataset, write_eval(tmp_path / "eval.jsonl"))
    assert main(["export", "--report", str(report), "--drop", "accused", "--out", str(tmp_path / "c.jsonl")]) == 0
    original = dataset.read_bytes()
    assert (tmp_path / "c.jsonl").read_bytes() == b"".join(original.splitlines(keepends=True)[:N_CLEAN])


def test_top_k_and_an_ids_file_drop_what_they_name(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "train.jsonl")
    report = write_report_dir(tmp_path / "report", dataset, write_eval(tmp_path / "eval.jsonl"))
    examples = load_dataset(dataset)
    ids = tmp_path / "ids.txt"
    ids.write_text(f"# two suspects\n{examples.ids[4]}\n{examples.ids[1]}\n")
    assert main(["export", "--report", str(report), "--drop", str(ids), "--out", str(tmp_path / "a.jsonl"),
                 "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["dropped"] == [examples.ids[1], examples.ids[4]] and result["kept"] == len(examples) - 2
    assert main(["export", "--report", str(report), "--drop", "top:4", "--out", str(tmp_path / "b.jsonl")]) == 0
    scores = json.loads((report / "report.json").read_text())["top_examples"][:4]
    kept = load_dataset(tmp_path / "b.jsonl")
    assert len(kept) == len(examples) - 4
    dropped = {row["id"] for row in scores}
    assert _content(kept) == _content(e for e in examples if e.id not in dropped)


@pytest.fixture
def setup(tmp_path):
    dataset = write_dataset(tmp_path / "train.jsonl")
    report = write_report_dir(tmp_path / "report", dataset, write_eval(tmp_path / "eval.jsonl"))
    return dataset, report, tmp_path / "clean.jsonl"


def test_an_unknown_id_names_its_line_and_nothing_is_written(setup, tmp_path, capsys):
    dataset, report, out = setup
    ids = tmp_path / "ids.txt"
    ids.write_text(f"{load_dataset(dataset).ids[0]}\nex-000999-deadbeef\n")
    _one_line_error(capsys, ["export", "--report", str(report), "--drop", str(ids), "--out", str(out)],
                    f"{ids}:2: id 'ex-000999-deadbeef' is not in")
    assert not out.exists()


def test_a_dataset_changed_since_the_report_is_refused(setup, capsys):
    dataset, report, out = setup
    dataset.write_text(dataset.read_text().replace("What is 3 plus 3", "What is three plus three"))
    _one_line_error(capsys, ["export", "--report", str(report), "--drop", "accused", "--out", str(out)],
                    "changed since the report", "--dataset")
    assert not out.exists()


def test_a_report_of_another_schema_is_refused(setup, capsys):
    _, report, out = setup
    data = json.loads((report / "report.json").read_text())
    data["schema"] = "gradian.report/2"
    (report / "report.json").write_text(json.dumps(data))
    _one_line_error(capsys, ["export", "--report", str(report), "--drop", "accused", "--out", str(out)],
                    "schema 'gradian.report/2'", "gradian.report/1")
    assert not out.exists()


def test_an_existing_out_needs_overwrite_and_the_dataset_itself_is_never_the_out(setup, capsys):
    dataset, report, out = setup
    out.write_text("keep me\n")
    _one_line_error(capsys, ["export", "--report", str(report), "--drop", "accused", "--out", str(out)],
                    "already exists", "--overwrite")
    assert out.read_text() == "keep me\n"
    assert main(["export", "--report", str(report), "--drop", "accused", "--out", str(out), "--overwrite"]) == 0
    assert len(load_dataset(out)) == N_CLEAN
    before = dataset.read_bytes()
    _one_line_error(capsys, ["export", "--report", str(report), "--drop", "accused", "--out", str(dataset),
                             "--overwrite"], "is the training dataset itself")
    assert dataset.read_bytes() == before


@pytest.mark.parametrize(("drop", "needle"), [
    ("top:0", "K must be a whole number"),
    ("top:many", "K must be a whole number"),
    ("nothing.txt", "neither accused, top:K nor an existing ids file"),
    ("top:31", "more examples than the dataset's 30"),
])
def test_a_bad_drop_choice_is_one_line(setup, capsys, drop, needle):
    _, report, out = setup
    _one_line_error(capsys, ["export", "--report", str(report), "--drop", drop, "--out", str(out)], needle)
    assert not out.exists()


def test_a_refused_report_has_nothing_to_drop_by(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "train.jsonl")
    report = write_report_dir(tmp_path / "report", dataset, write_eval(tmp_path / "eval.jsonl"), regressed=False)
    _one_line_error(capsys, ["export", "--report", str(report), "--drop", "accused", "--out",
                             str(tmp_path / "c.jsonl")], "attributed nothing", "--drop ids.txt")


def test_an_output_named_for_another_format_is_refused(setup, capsys, tmp_path):
    _, report, _ = setup
    _one_line_error(capsys, ["export", "--report", str(report), "--drop", "accused", "--out",
                             str(tmp_path / "c.parquet")], "another format than the dataset's (jsonl)")
    assert not (tmp_path / "c.parquet").exists()
