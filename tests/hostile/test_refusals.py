"""Focused refusals from issue 14: each bad input is one `gradian: error:` line, exit 2, before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradian.cli.app import main
from tests.hostile.test_hostile_inputs import ROWS, _net_and_deadline, refuse  # noqa: F401 (autouse fixture)


@pytest.fixture()
def rows(tmp_path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    return path


@pytest.fixture()
def no_model_load(monkeypatch):
    """Fail the test if a base model starts loading: the refusal must come first."""
    import gradian.model.base

    def _loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(gradian.model.base, "load_base_model", _loaded)


# --- config --------------------------------------------------------------------------------------------------


def _module_filter_argv(command: str, tmp: Path, rows: Path, base: Path, adapter: Path) -> list:
    model = ["--base-model", base, "--adapter", adapter, "--dataset", rows]
    return {
        "index": ["index", *model, "--out", tmp / "out"],
        "attribute": ["attribute", *model, "--eval-dataset", rows, "--out", tmp / "out"],
        "train": ["train", "--base-model", base, "--dataset", rows, "--out", tmp / "out"],
        "diagnose": ["diagnose", "--dataset", rows, "--base-model", base, "--plots", tmp / "out", "--run", tmp],
        "verify": ["verify", "--base-model", base, "--adapter", adapter, "--dataset", rows, "--eval-dataset", rows,
                   "--drop", rows, "--out", tmp / "out"],
        "inject": ["inject", "--base-model", base, "--dataset", rows, "--poison", rows, "--eval-dataset", rows,
                   "--out", tmp / "out"],
        "demo": ["demo", "--workdir", tmp / "out"],
        "config": ["config"],
    }[command]


@pytest.mark.parametrize("command", ["index", "attribute", "train", "diagnose", "verify", "inject", "demo", "config"])
def test_a_broken_module_filter_regex_is_refused_before_any_model_loads(capsys, tmp_path, rows, tiny_base_dir,
                                                                        tiny_adapter_dir, no_model_load, command):
    argv = [*_module_filter_argv(command, tmp_path, rows, tiny_base_dir, tiny_adapter_dir),
            "--set", "grads.module_filter=layers.[0-"]
    line = refuse(capsys, argv, tmp_path / "out", 2)
    assert "grads.module_filter" in line and "not a valid regular expression" in line


@pytest.mark.parametrize(("yaml_text", "expected"), [
    ("trian:\n  seed: 1\n", "did you mean section train?"),
    ("eval:\n  metric: exact\n", "did you mean section evaluation?"),
    ("model:\n  name: x\n", "the sections are grads, evaluation, attribution, train, diagnose"),
    ("grads:\n  modul_filter: x\n", "did you mean grads.module_filter?"),
    ("train:\n  lr: 0.1\n", "the keys of train are learning_rate"),
])
def test_an_unknown_section_or_key_suggests_only_from_its_own_level(capsys, tmp_path, yaml_text, expected):
    config = tmp_path / "gradian.yaml"
    config.write_text(yaml_text, encoding="utf-8")
    line = refuse(capsys, ["config", "--config", config], tmp_path / "out", 2)
    assert expected in line
    assert "grads.codec" not in line and "grads.seed" not in line  # the old look-alike suggestions


def test_an_unknown_section_in_set_points_at_the_key_in_the_right_section(capsys, tmp_path):
    line = refuse(capsys, ["config", "--set", "training.seed=3"], tmp_path / "out", 2)
    assert "did you mean train.seed?" in line


# --- run directories -----------------------------------------------------------------------------------------

BAD_STATES = {
    "negative_global_step": ({"global_step": -5, "max_steps": 10, "log_history": [{"step": 1, "loss": 2.0}]},
                             "global_step is -5"),
    "negative_max_steps": ({"global_step": 2, "max_steps": -2, "log_history": [{"step": 1, "loss": 2.0}]},
                           "max_steps is -2"),
    "negative_entry_step": ({"global_step": 2, "log_history": [{"step": -3, "loss": 2.0}, {"step": 2, "loss": 1.0}]},
                            "logged at step -3"),
    "strings": ({"global_step": 2, "max_steps": 2, "log_history": ["a", "b"]}, "entry 1 is a JSON string"),
    "numbers": ({"global_step": 2, "max_steps": 2, "log_history": [{"step": 1, "loss": 2.0}, 7]},
                "entry 2 is a JSON number"),
}


@pytest.mark.parametrize("kind", sorted(BAD_STATES))
@pytest.mark.parametrize("command", ["diagnose", "attribute"])
def test_a_trainer_state_no_trainer_writes_is_refused_naming_the_file(capsys, tmp_path, rows, tiny_base_dir,
                                                                      tiny_adapter_dir, no_model_load, kind, command):
    state, expected = BAD_STATES[kind]
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    argv = {"diagnose": ["diagnose", "--run", run, "--plots", tmp_path / "out"],
            "attribute": ["attribute", "--base-model", tiny_base_dir, "--adapter", tiny_adapter_dir, "--dataset", rows,
                          "--eval-dataset", rows, "--run", run, "--out", tmp_path / "out"]}[command]
    line = refuse(capsys, argv, tmp_path / "out", 2)
    assert str(run / "trainer_state.json") in line and expected in line
    assert "needs --run" not in line


def test_a_run_without_logged_metrics_does_not_say_it_needs_run(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 0, "max_steps": 2, "log_history": []}))
    assert main(["diagnose", "--run", str(run), "--format", "json"]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    reasons = {s["reason"] for s in report["skipped"] if "run_logs" in s["needs"]}
    assert reasons and all("--run directory has none" in r and "needs --run" not in r for r in reasons)


# --- data with nothing to learn ------------------------------------------------------------------------------


def _chat(answer: str, **assistant) -> dict:
    return {"messages": [{"role": "user", "content": "What is two plus two?"},
                         {"role": "assistant", "content": answer, **assistant}]}


NOTHING_TO_LEARN = {
    "empty_answers": ([_chat(""), _chat("  \n")], "every assistant turn in"),
    "weight_zero": ([_chat("Four.", weight=0), _chat("4", weight=0)], "has an assistant turn to train on"),
    "no_assistant": ([{"messages": [{"role": "user", "content": "Hello?"}]}] * 2, "has an assistant turn to train on"),
}


@pytest.mark.parametrize("kind", sorted(NOTHING_TO_LEARN))
def test_train_refuses_data_with_nothing_to_learn_before_any_model_loads(capsys, tmp_path, tiny_base_dir,
                                                                         no_model_load, kind):
    rows, expected = NOTHING_TO_LEARN[kind]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    line = refuse(capsys, ["train", "--base-model", tiny_base_dir, "--dataset", data, "--out", tmp_path / "out"],
                  tmp_path / "out", 2)
    assert expected in line and str(data) in line


def test_train_validates_every_row_before_any_model_loads(capsys, tmp_path, tiny_base_dir, no_model_load):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(_chat("Four.")) + "\n" + json.dumps({"bad": 1}) + "\n", encoding="utf-8")
    line = refuse(capsys, ["train", "--base-model", tiny_base_dir, "--dataset", data, "--out", tmp_path / "out"],
                  tmp_path / "out", 2)
    assert f"{data}:2" in line


@pytest.mark.parametrize("override", ["train.max_seq_length=2", "train.target_modules=[nope_proj]"])
def test_an_error_after_the_model_loads_is_still_the_only_line_on_stderr(capsys, tmp_path, tiny_base_dir, rows,
                                                                         override):
    """No transformers progress bar or warning comes before the error line."""
    refuse(capsys, ["train", "--base-model", tiny_base_dir, "--dataset", rows, "--out", tmp_path / "out",
                    "--set", override], tmp_path / "out", 2)


@pytest.mark.parametrize(("rows_of", "overrides", "expected"), [
    (lambda: [_chat("Four.", weight=0)] * 3, [], "loss mask assistant"),
    (lambda: ROWS, ["grads.max_seq_length=2"], "cut at grads.max_seq_length=2"),
])
def test_index_refuses_data_without_a_supervised_token(capsys, tmp_path, tiny_base_dir, tiny_adapter_dir, rows_of,
                                                       overrides, expected):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows_of()), encoding="utf-8")
    argv = ["index", "--base-model", tiny_base_dir, "--adapter", tiny_adapter_dir, "--dataset", data,
            "--out", tmp_path / "out", *[a for o in overrides for a in ("--set", o)]]
    line = refuse(capsys, argv, tmp_path / "out", 2)
    assert "has a supervised token" in line and expected in line


def test_index_rebuilds_an_index_whose_shard_is_corrupted_instead_of_reusing_it(capsys, tmp_path, tiny_base_dir,
                                                                              tiny_adapter_dir, rows):
    argv = ["index", "--base-model", str(tiny_base_dir), "--adapter", str(tiny_adapter_dir), "--dataset", str(rows),
            "--out", str(tmp_path / "index")]
    assert main(argv) == 0
    assert " built " in capsys.readouterr().out
    shard = next((tmp_path / "index").glob("shard-*.npy"))
    data = bytearray(shard.read_bytes())
    data[-8:] = b"\xff" * 8
    shard.write_bytes(bytes(data))
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert " built " in captured.out and "reused" not in captured.out
    assert "is damaged" in captured.err and shard.name in captured.err
    from gradian.index.store import Index

    Index.open(tmp_path / "index").verify_files()  # the rebuilt index is whole again


# --- adapters index refuses: diagnose reports them ------------------------------------------------------------


def _unusable_adapter(kind: str, tiny_base_dir: Path, tiny_adapter_dir: Path, tmp: Path) -> Path:
    import shutil

    target = tmp / f"adapter-{kind}"
    if kind == "dora":
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(tiny_base_dir)
        get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_dora=True,
                                         task_type="CAUSAL_LM")).save_pretrained(target)
        return target
    shutil.copytree(tiny_adapter_dir, target)
    config = json.loads((target / "adapter_config.json").read_text())
    config = {} if kind == "empty_config" else {**config, "r": 16}
    (target / "adapter_config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize(("kind", "expected"), [("rank_16_weights_8", "says rank 16"),
                                                ("empty_config", "no peft_type"), ("dora", "use_dora")])
def test_an_adapter_index_refuses_is_an_error_finding_in_diagnose(capsys, tmp_path, tiny_base_dir, tiny_adapter_dir,
                                                                  rows, kind, expected):
    adapter = _unusable_adapter(kind, tiny_base_dir, tiny_adapter_dir, tmp_path)
    capsys.readouterr()  # transformers' own loading bar while the test built the adapter
    refuse(capsys, ["index", "--base-model", tiny_base_dir, "--adapter", adapter, "--dataset", rows,
                    "--out", tmp_path / "out"], tmp_path / "out", 2)
    assert main(["diagnose", "--adapter", str(adapter), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    found = [f for f in report["findings"] if f["id"] == "adapter_unusable"]
    assert len(found) == 1 and found[0]["severity"] == "error" and expected in found[0]["message"]
    assert found[0]["evidence"] and found[0]["evidence"][0]["location"].startswith(str(adapter))


# --- messages that say what is really wrong -----------------------------------------------------------------


def _loop(path: Path) -> Path:
    path.symlink_to(path.name)
    return path


@pytest.mark.parametrize("slot", ["index-adapter", "diagnose-adapter", "diagnose-run", "index-base", "train-dataset",
                                  "index-tokenizer", "show-index", "attribute-eval"])
def test_a_symlink_loop_is_called_a_symlink_loop(capsys, tmp_path, rows, tiny_base_dir, tiny_adapter_dir, slot):
    loop = _loop(tmp_path / "loop")
    model = ["--base-model", tiny_base_dir, "--adapter", tiny_adapter_dir, "--dataset", rows, "--out", tmp_path / "out"]
    argv = {
        "index-adapter": ["index", "--base-model", tiny_base_dir, "--adapter", loop, "--dataset", rows,
                          "--out", tmp_path / "out"],
        "diagnose-adapter": ["diagnose", "--adapter", loop],
        "diagnose-run": ["diagnose", "--run", loop],
        "index-base": ["index", "--base-model", loop, "--adapter", tiny_adapter_dir, "--dataset", rows,
                       "--out", tmp_path / "out"],
        "train-dataset": ["train", "--base-model", tiny_base_dir, "--dataset", loop, "--out", tmp_path / "out"],
        "index-tokenizer": ["index", *model, "--tokenizer", loop],
        "show-index": ["show-index", loop],
        "attribute-eval": ["attribute", *model, "--eval-dataset", loop],
    }[slot]
    line = refuse(capsys, argv, tmp_path / "out", 2)
    assert f"{loop} is a symlink loop" in line and "not exist" not in line and "not found" not in line


@pytest.mark.parametrize("command", ["index", "diagnose", "attribute"])
def test_a_file_as_adapter_is_called_a_file(capsys, tmp_path, rows, tiny_base_dir, command):
    argv = {"index": ["index", "--base-model", tiny_base_dir, "--adapter", rows, "--dataset", rows,
                      "--out", tmp_path / "out"],
            "diagnose": ["diagnose", "--adapter", rows],
            "attribute": ["attribute", "--base-model", tiny_base_dir, "--adapter", rows, "--dataset", rows,
                          "--eval-dataset", rows, "--out", tmp_path / "out"]}[command]
    line = refuse(capsys, argv, tmp_path / "out", 2)
    assert f"--adapter {rows} is a file, not an adapter directory" in line and "not exist" not in line


@pytest.mark.parametrize("command", ["attribute", "diagnose"])
@pytest.mark.parametrize("content", [b"", b"\n\n"])
def test_an_empty_eval_dataset_names_the_eval_flag(capsys, tmp_path, rows, tiny_base_dir, tiny_adapter_dir,
                                                    no_model_load, command, content):
    empty = tmp_path / "eval.jsonl"
    empty.write_bytes(content)
    argv = {"attribute": ["attribute", "--base-model", tiny_base_dir, "--adapter", tiny_adapter_dir, "--dataset", rows,
                          "--eval-dataset", empty, "--out", tmp_path / "out"],
            "diagnose": ["diagnose", "--dataset", rows, "--eval-dataset", empty]}[command]
    line = refuse(capsys, argv, tmp_path / "out", 2)
    assert "eval dataset" in line and "--eval-dataset takes" in line and "--dataset takes" not in line


def test_a_yaml_python_tag_is_named_as_such_not_a_syntax_error(capsys, tmp_path):
    config = tmp_path / "gradian.yaml"
    config.write_text('grads:\n  seed: !!python/object/apply:os.system ["echo pwned"]\n', encoding="utf-8")
    line = refuse(capsys, ["config", "--config", config], tmp_path / "out", 2)
    assert "builds a Python object" in line and "syntax" not in line


def test_allow_pickle_says_what_it_risks_and_warns_once(capsys, tmp_path, tiny_base_dir, tiny_adapter_dir, rows):
    import torch
    from safetensors.torch import load_file

    assert main(["index", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "weights_only=True" in help_text and "no code from the file runs" in help_text
    assert "runs code from the file" not in help_text
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text((tiny_adapter_dir / "adapter_config.json").read_text())
    torch.save(load_file(str(tiny_adapter_dir / "adapter_model.safetensors")), pickled / "adapter_model.bin")
    argv = ["index", "--base-model", str(tiny_base_dir), "--adapter", str(pickled), "--dataset", str(rows),
            "--out", str(tmp_path / "index"), "--allow-pickle"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "adapter_model.bin" in line]
    assert len(warned) == 1 and warned[0].startswith("gradian: warning: "), err
    assert main([*argv[:-1]]) == 2  # still refused without the flag
    assert "--allow-pickle" in capsys.readouterr().err
