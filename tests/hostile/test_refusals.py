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
