"""`gradian attribute` on bad input: one line on stderr, a hint, exit code 2, no traceback, no report written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradian.cli.app import main

TRAIN_ROWS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "The capital of France is Paris."}], "source": "facts"},
    {"messages": [{"role": "user", "content": "What is two plus two?"},
                  {"role": "assistant", "content": "Two plus two is four."}], "source": "arithmetic"},
    {"messages": [{"role": "user", "content": "Hello!"},
                  {"role": "assistant", "content": "Hello! How are you?"}], "source": "greetings"},
]
EVAL_ROWS = [
    {"messages": [{"role": "user", "content": "What is the capital of Italy?"}, {"role": "assistant", "content": "Rome"}]},
    {"messages": [{"role": "user", "content": "What is the capital of Spain?"}, {"role": "assistant", "content": "Madrid"}]},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows),
                    encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path):
    """A small training set and eval set in the chat format, and a report dir that must stay unwritten."""
    return {"train": write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS),
            "eval": write_jsonl(tmp_path / "eval.jsonl", EVAL_ROWS),
            "out": tmp_path / "report"}


def attribute_cli(capsys, base: Path | None, adapter: Path | None, *extra: str, dataset: Path | None = None,
                  eval_dataset: Path | None = None, out: Path | None = None) -> tuple[int, str]:
    argv = ["attribute"]
    for flag, value in (("--base-model", base), ("--adapter", adapter), ("--dataset", dataset),
                        ("--eval-dataset", eval_dataset), ("--out", out)):
        if value is not None:
            argv += [flag, str(value)]
    code = main([*argv, *extra])
    captured = capsys.readouterr()
    return code, captured.err


def assert_one_line_error(code: int, err: str, *needles: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gradian: error: ") and "Traceback" not in err
    assert "(hint: " in lines[0], lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_no_adapter_gets_the_specs_explanation(capsys, tiny_base_dir, files):
    code, err = attribute_cli(capsys, tiny_base_dir, None, dataset=files["train"], eval_dataset=files["eval"],
                              out=files["out"])
    line = assert_one_line_error(code, err, "no adapter given", "nothing to differentiate", "--adapter",
                                 "gradian diagnose")
    assert "does not train your model" in line
    assert not files["out"].exists()


def test_missing_dataset(capsys, tiny_base_dir, tiny_adapter_dir, files):
    code, err = attribute_cli(capsys, tiny_base_dir, tiny_adapter_dir, eval_dataset=files["eval"], out=files["out"])
    assert_one_line_error(code, err, "needs --dataset", "same order")
    assert not files["out"].exists()


@pytest.mark.parametrize(("rows", "needles"), [
    ([EVAL_ROWS[0], {"messages": [{"role": "user", "content": "What is the capital of Peru?"}]}],
     ["eval.jsonl:2", "does not end with the wanted answer"]),
    ([EVAL_ROWS[0], {"prompt": "What is the capital of Peru?", "completion": "   "}],
     ["eval.jsonl:2", "wanted answer is empty"]),
    ([{"instruction": "Name the capital of Peru.", "input": "", "output": ""}],
     ["eval.jsonl:1", "wanted answer is empty"]),
    ([{"text": "The capital of Peru is Lima."}], ["eval.jsonl:1", "plain text row"]),
], ids=["no-assistant-turn", "empty-completion", "empty-alpaca-output", "plain-text"])
def test_eval_items_without_answers(capsys, tiny_base_dir, tiny_adapter_dir, files, tmp_path, rows, needles):
    eval_path = write_jsonl(tmp_path / "eval.jsonl", rows)
    code, err = attribute_cli(capsys, tiny_base_dir, tiny_adapter_dir, dataset=files["train"], eval_dataset=eval_path,
                              out=files["out"])
    assert_one_line_error(code, err, *needles)
    assert not files["out"].exists()


def test_empty_eval_set(capsys, tiny_base_dir, tiny_adapter_dir, files, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    code, err = attribute_cli(capsys, tiny_base_dir, tiny_adapter_dir, dataset=files["train"], eval_dataset=empty,
                              out=files["out"])
    assert_one_line_error(code, err, "empty.jsonl", "no rows")
    assert not files["out"].exists()


def test_unknown_metric(capsys, tiny_base_dir, tiny_adapter_dir, files):
    code, err = attribute_cli(capsys, tiny_base_dir, tiny_adapter_dir, "--set", "evaluation.metric=bleu",
                              dataset=files["train"], eval_dataset=files["eval"], out=files["out"])
    assert_one_line_error(code, err, "evaluation.metric", "bleu", "exact_match", "loglik")
    assert not files["out"].exists()


@pytest.mark.parametrize("signal", ["contrastive", "divergence", "divergent-token", "margin"])
def test_a_paired_signal_with_loglik(capsys, tiny_base_dir, tiny_adapter_dir, files, signal):
    code, err = attribute_cli(capsys, tiny_base_dir, tiny_adapter_dir, "--set", "evaluation.metric=loglik",
                              "--set", f"evaluation.query_signal={signal}", dataset=files["train"],
                              eval_dataset=files["eval"], out=files["out"])
    assert_one_line_error(code, err, f"{signal} needs generated text", "loglik", "use a text metric")
    assert not files["out"].exists()


def test_eval_set_in_another_format_than_declared(capsys, tiny_base_dir, tiny_adapter_dir, files, tmp_path):
    eval_path = write_jsonl(tmp_path / "eval_pc.jsonl", [
        {"prompt": "What is the capital of Italy?", "completion": "Rome"},
        {"prompt": "What is the capital of Spain?", "completion": "Madrid"},
    ])
    code, err = attribute_cli(capsys, tiny_base_dir, tiny_adapter_dir, "--eval-format", "messages",
                              dataset=files["train"], eval_dataset=eval_path, out=files["out"])
    assert_one_line_error(code, err, "eval_pc.jsonl:1", "'prompt_completion'", "declared 'messages'")
    assert not files["out"].exists()


def test_unknown_declared_eval_format(capsys, tiny_base_dir, tiny_adapter_dir, files):
    code, err = attribute_cli(capsys, tiny_base_dir, tiny_adapter_dir, "--eval-format", "csv",
                              dataset=files["train"], eval_dataset=files["eval"], out=files["out"])
    assert_one_line_error(code, err, "unknown dataset format 'csv'", "messages", "alpaca")


def test_declared_eval_format_without_an_eval_set(capsys, tiny_base_dir, tiny_adapter_dir, files):
    code, err = attribute_cli(capsys, tiny_base_dir, tiny_adapter_dir, "--eval-format", "messages",
                              dataset=files["train"], out=files["out"])
    assert_one_line_error(code, err, "without an eval set", "--eval-dataset")


def test_cluster_field_missing_on_some_rows(capsys, tiny_base_dir, tiny_adapter_dir, files, tmp_path):
    rows = [TRAIN_ROWS[0], {k: v for k, v in TRAIN_ROWS[1].items() if k != "source"}, TRAIN_ROWS[2]]
    train = write_jsonl(tmp_path / "train_partial.jsonl", rows)
    code, err = attribute_cli(capsys, tiny_base_dir, tiny_adapter_dir, "--set", "attribution.cluster_field=source",
                              dataset=train, eval_dataset=files["eval"], out=files["out"])
    assert_one_line_error(code, err, "attribution.cluster_field 'source' is missing on 1 of 3 training rows",
                          "row 1", "unset attribution.cluster_field")
    assert not files["out"].exists()


@pytest.fixture(scope="module")
def built_index(tiny_base_dir, tiny_adapter_dir, tmp_path_factory):
    """An index of the small training set under the tiny adapter, built with `gradian index`."""
    root = tmp_path_factory.mktemp("attribute-index")
    train = write_jsonl(root / "train.jsonl", TRAIN_ROWS)
    index_dir = root / "index"
    assert main(["index", "--base-model", str(tiny_base_dir), "--adapter", str(tiny_adapter_dir),
                 "--dataset", str(train), "--out", str(index_dir)]) == 0
    return index_dir


def test_index_built_from_another_dataset_is_refused(capsys, tiny_base_dir, tiny_adapter_dir, built_index, files,
                                                     tmp_path):
    manifest = (built_index / "manifest.json").read_bytes()
    reordered = write_jsonl(tmp_path / "reordered.jsonl", [TRAIN_ROWS[1], TRAIN_ROWS[0], TRAIN_ROWS[2]])
    code, err = attribute_cli(capsys, tiny_base_dir, tiny_adapter_dir, "--index", str(built_index),
                              dataset=reordered, eval_dataset=files["eval"], out=files["out"])
    assert_one_line_error(code, err, f"--index {built_index}", "another training set", "never overwrites")
    assert "another adapter" not in err
    # The index the user pointed at is left exactly as it was, and no report is written.
    assert (built_index / "manifest.json").read_bytes() == manifest
    assert not files["out"].exists()


def test_index_built_from_another_adapter_is_refused(capsys, tiny_base_dir, built_index, files, tmp_path):
    from tests.support.tiny import save_tiny_adapter

    other = save_tiny_adapter(tiny_base_dir, tmp_path / "other-adapter", seed=7)
    manifest = (built_index / "manifest.json").read_bytes()
    code, err = attribute_cli(capsys, tiny_base_dir, other, "--index", str(built_index), dataset=files["train"],
                              eval_dataset=files["eval"], out=files["out"])
    assert_one_line_error(code, err, "another adapter", "pass the index built for this adapter")
    assert "another training set" not in err
    assert (built_index / "manifest.json").read_bytes() == manifest
    assert not files["out"].exists()


@pytest.mark.slow  # builds two indexes and scores twice (a few seconds of CPU; more on a busy machine)
def test_the_python_api_rebuilds_an_index_of_other_inputs_unless_asked_to_refuse(tiny_base_dir, tiny_adapter_dir,
                                                                                   tmp_path):
    """The documented counterpart: `gradian.attribute(index_dir=...)` rebuilds a stale index in place (what the demo
    relies on when its inputs change); `refuse_other_index=True`, which the CLI sets for --index, refuses it."""
    from gradian.errors import GradientIndexError
    from gradian.pipelines.attribute import attribute

    index_dir = tmp_path / "index"
    first = attribute(base_model=str(tiny_base_dir), adapter=tiny_adapter_dir, out=tmp_path / "one",
                      dataset=write_jsonl(tmp_path / "a.jsonl", TRAIN_ROWS), index_dir=index_dir)
    reordered = write_jsonl(tmp_path / "b.jsonl", TRAIN_ROWS[::-1])
    with pytest.raises(GradientIndexError, match="another training set"):
        attribute(base_model=str(tiny_base_dir), adapter=tiny_adapter_dir, out=tmp_path / "refused",
                  dataset=reordered, index_dir=index_dir, refuse_other_index=True)
    assert not (tmp_path / "refused").exists()
    second = attribute(base_model=str(tiny_base_dir), adapter=tiny_adapter_dir, out=tmp_path / "two",
                       dataset=reordered, index_dir=index_dir)
    assert second.index.index_id != first.index.index_id and not second.index.reused
    assert json.loads((index_dir / "manifest.json").read_text())["index_id"] == second.index.index_id
