"""--base-model defaults to the base the adapter's adapter_config.json names, when that is on this machine."""

from __future__ import annotations

import json
import shutil

import pytest

from gradian.cli.app import main
from gradian.counterfactual.verify import plan_verify
from gradian.data import load_dataset
from gradian.diagnose.runner import diagnose
from tests.core.counterfactual_reports import write_dataset, write_eval
from tests.core.test_attribute_errors import EVAL_ROWS, TRAIN_ROWS, assert_one_line_error, write_jsonl

NOT_HERE = "nobody-org/not-on-this-machine"


def relabelled(adapter, target, base_name):
    """A copy of an adapter whose adapter_config.json names ``base_name`` as its base."""
    shutil.copytree(adapter, target)
    config = json.loads((target / "adapter_config.json").read_text())
    (target / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": base_name}))
    return target


@pytest.fixture
def elsewhere(tiny_adapter_dir, tmp_path, hub_cache):
    """An adapter trained on a Hub model that is neither a local dir nor in the (empty) local cache."""
    return relabelled(tiny_adapter_dir, tmp_path / "adapter-elsewhere", NOT_HERE)


def test_index_takes_the_base_the_adapter_names(capsys, tmp_path, tiny_base_dir, tiny_adapter_dir):
    assert json.loads((tiny_adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_base_dir)
    dataset = write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS)
    code = main(["index", "--adapter", str(tiny_adapter_dir), "--dataset", str(dataset), "--out", str(tmp_path / "index")])
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert str(tiny_base_dir) in json.dumps(manifest)


@pytest.mark.parametrize("command", ["index", "attribute"])
def test_a_base_that_is_not_here_is_named_in_the_error(capsys, tmp_path, elsewhere, command):
    train = write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS)
    evals = write_jsonl(tmp_path / "eval.jsonl", EVAL_ROWS)
    argv = [command, "--adapter", str(elsewhere), "--dataset", str(train), "--out", str(tmp_path / "out")]
    code = main(argv + (["--eval-dataset", str(evals)] if command == "attribute" else []))
    line = assert_one_line_error(code, capsys.readouterr().err, f"the base model the adapter names ({NOT_HERE}",
                                 "is not on this machine", "pass --base-model")
    assert "adapter_config.json" in line and not (tmp_path / "out").exists()


def test_an_adapter_that_names_no_base_asks_for_the_flag(capsys, tmp_path, tiny_adapter_dir):
    adapter = relabelled(tiny_adapter_dir, tmp_path / "adapter", None)
    train = write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS)
    code = main(["index", "--adapter", str(adapter), "--dataset", str(train), "--out", str(tmp_path / "out")])
    assert_one_line_error(code, capsys.readouterr().err, "gradian index needs --base-model", "names no base model")


def test_verify_takes_the_base_the_adapter_names(tmp_path, capsys, tiny_base_dir, tiny_adapter_dir, elsewhere):
    dataset, eval_set = write_dataset(tmp_path / "train.jsonl"), write_eval(tmp_path / "eval.jsonl")
    ids = tmp_path / "ids.txt"
    ids.write_text(load_dataset(dataset).ids[0] + "\n")
    common = dict(out=tmp_path / "v", drop=ids, dataset=dataset, eval_dataset=eval_set)
    assert plan_verify(adapter=tiny_adapter_dir, **common).base_model == str(tiny_base_dir)
    assert plan_verify(adapter=tiny_adapter_dir, base_model="smollm2-135m-instruct", **common).base_model == "smollm2-135m-instruct"
    code = main(["verify", "--drop", str(ids), "--adapter", str(elsewhere), "--dataset", str(dataset),
                 "--eval-dataset", str(eval_set), "--out", str(tmp_path / "v")])
    assert_one_line_error(code, capsys.readouterr().err, NOT_HERE, "pass --base-model")


def test_diagnose_runs_the_tokenizer_checks_with_the_base_the_run_adapter_names(tmp_path):
    from tests.checks.run_fixtures import real_runs

    real = real_runs()
    report = diagnose(dataset=real.healthy_dataset, run=real.healthy_run)
    assert report.inputs["base_model"] == str(real.base_dir)
    assert report.inputs["base_model_from"] == str(real.healthy_run / "adapter_config.json")
    assert "truncated_answers" in report.ran and not any("--base-model" in s.reason() for s in report.skipped)


def test_diagnose_without_a_local_base_still_runs_and_skips_what_needs_it(tmp_path, elsewhere):
    dataset = write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS)
    report = diagnose(dataset=dataset, adapter=elsewhere)
    assert "base_model" not in report.inputs
    assert "--base-model" in {s.id: s for s in report.skipped}["truncated_answers"].reason()
