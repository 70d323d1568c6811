"""Issue 13: --format table|json|md on every command that prints results; json is one document and nothing else."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from gradian.cli.app import main

ROWS = [{"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                      {"role": "assistant", "content": f"{i + 1}."}]} for i in range(4)]


@pytest.fixture()
def rows(tmp_path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    return path


def _json(capsys, argv: list, code: int = 0) -> dict:
    assert main([str(a) for a in argv]) == code
    captured = capsys.readouterr()
    return json.loads(captured.out)  # the whole of stdout is one JSON document


@pytest.mark.parametrize("command", [["config"], ["config", "--list"], ["cache", "list"], ["cache", "prune", "--all"],
                                     ["index"], ["train"], ["verify"], ["inject"], ["demo"]])
def test_every_result_command_refuses_an_unknown_format_in_one_line(capsys, command):
    assert main([*command, "--format", "yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--format 'yaml' is unknown" in err and "table, json, md" in err


def test_config_in_every_format(capsys):
    data = _json(capsys, ["config", "--format", "json", "--set", "grads.batch_size=3"])
    assert data["grads"]["batch_size"] == 3 and set(data) == {"grads", "evaluation", "attribution", "train", "diagnose"}
    keys = _json(capsys, ["config", "--list", "--format", "json"])["keys"]
    assert {"key": "grads.batch_size", "default": 8}.items() <= keys[0].items()
    assert main(["config", "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| key | value |") and "| grads.batch_size | 8 |" in out
    assert main(["config"]) == 0
    assert capsys.readouterr().out.startswith("grads:\n  batch_size: 8")  # the table format stays YAML


def test_cache_list_and_prune_in_json_and_md(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "indexes" / ".abc.partial").mkdir(parents=True)
    assert main(["cache", "list", "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert "| kind | id | size | age | what |" in out
    dry = _json(capsys, ["cache", "prune", "--partial", "--dry-run", "--format", "json"])
    assert dry["dry_run"] is True and len(dry["would_remove"]) == 1 and dry["removed"] == []
    done = _json(capsys, ["cache", "prune", "--partial", "--format", "json"])
    assert len(done["removed"]) == 1 and done["freed_bytes"] >= 0 and done["failed"] == []
    assert _json(capsys, ["cache", "prune", "--partial", "--format", "json"])["removed"] == []


def test_index_json_is_the_summary_and_notes_stay_on_stderr(capsys, tmp_path, rows, tiny_base_dir, tiny_adapter_dir):
    argv = ["index", "--base-model", tiny_base_dir, "--adapter", tiny_adapter_dir, "--dataset", rows,
            "--out", tmp_path / "index", "--format", "json"]
    built = _json(capsys, argv)
    assert built["state"] == "built" and built["examples"] == 4 and built["path"] == str(tmp_path / "index")
    assert _json(capsys, argv)["state"] == "reused"
    assert main([str(a) for a in argv[:-1]] + ["md"]) == 0
    assert capsys.readouterr().out.startswith("| key | value |")


def test_train_json_is_one_document_with_the_trainer_log_on_stderr(capsys, tmp_path, rows, tiny_base_dir):
    data = _json(capsys, ["train", "--base-model", tiny_base_dir, "--dataset", rows, "--out", tmp_path / "out",
                          "--set", "train.max_steps=1", "--device", "cpu", "--format", "json"])
    assert data["backend"] == "hf" and data["steps"] == 1 and data["adapter"] == str(tmp_path / "out" / "adapter")


@pytest.mark.parametrize("command", ["verify", "inject"])
@pytest.mark.parametrize("fmt", ["json", "md", "table"])
def test_verify_and_inject_print_their_document_in_each_format(capsys, tmp_path, monkeypatch, command, fmt):
    """The retraining itself is tested elsewhere; here only what reaches stdout, with the trainer's prints."""
    import gradian.counterfactual.inject as inject
    import gradian.counterfactual.verify as verify

    page = tmp_path / f"{command}.md"
    page.write_text(f"# {command}\n\nthe page\n", encoding="utf-8")
    result = {"verdict": {"headline": "HEADLINE", "summary": "SUMMARY", "confirmed": True, "passed": True}, "n": 1}

    def run(plan, **kwargs):
        print("{'loss': 1.0}")  # what a trainer prints on stdout while it runs
        return SimpleNamespace(result=result, json_path=tmp_path / f"{command}.json", markdown_path=page, passed=True)

    module = verify if command == "verify" else inject
    monkeypatch.setattr(module, f"plan_{command}", lambda **kwargs: None)
    monkeypatch.setattr(module, f"run_{command}", run)
    assert main([command, "--format", fmt]) == 0
    captured = capsys.readouterr()
    if fmt == "json":
        assert json.loads(captured.out) == result
    elif fmt == "md":
        assert captured.out == f"# {command}\n\nthe page\n"
    else:
        assert captured.out.splitlines() == ["HEADLINE", "SUMMARY", f"{command}: {page}"]
    assert "'loss'" in captured.err and "'loss'" not in captured.out


# --- diagnose --tokenizer ----------------------------------------------------------------------------------------


def _run_with_saved_template(tmp_path: Path) -> Path:
    from tests.support.tiny import LLAMA3_TEMPLATE

    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 2, "max_steps": 2, "log_history": [
        {"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]}))
    (run / "checkpoint-2" / "chat_template.jinja").write_text(LLAMA3_TEMPLATE, encoding="utf-8")
    return run


def test_diagnose_tokenizer_is_what_the_template_and_loss_checks_render_with(capsys, tmp_path, rows, tiny_base_dir):
    import shutil

    from tests.support.tiny import LLAMA3_TEMPLATE

    run = _run_with_saved_template(tmp_path)
    base_only = _json(capsys, ["diagnose", "--run", run, "--dataset", rows, "--base-model", tiny_base_dir,
                               "--format", "json", "--fail-on", "never"])
    assert "template_mismatch" in {f["id"] for f in base_only["findings"]}
    # The run's own tokenizer, kept elsewhere: rendering with it is what the run did, so nothing differs.
    runs_tokenizer = tmp_path / "runs-tokenizer"
    runs_tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_base_dir / name, runs_tokenizer / name)
    (runs_tokenizer / "chat_template.jinja").write_text(LLAMA3_TEMPLATE, encoding="utf-8")
    given = _json(capsys, ["diagnose", "--run", run, "--dataset", rows, "--base-model", tiny_base_dir,
                           "--tokenizer", runs_tokenizer, "--format", "json", "--fail-on", "never"])
    assert "template_mismatch" not in {f["id"] for f in given["findings"]}
    assert given["inputs"]["tokenizer"] == str(runs_tokenizer)
    # Without --base-model, --tokenizer alone lets the token checks run.
    alone = _json(capsys, ["diagnose", "--dataset", rows, "--tokenizer", runs_tokenizer, "--format", "json",
                           "--fail-on", "never"])
    assert {"all_labels_masked", "truncated_answers", "eos_missing_from_loss"} <= set(alone["ran"])


def test_diagnose_refuses_a_missing_tokenizer_dir_before_reading_anything(capsys, tmp_path, rows):
    assert main(["diagnose", "--dataset", str(rows), "--tokenizer", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--tokenizer {tmp_path / 'nope'} does not exist" in err
