"""Reader selection: auto-detection by sniff confidence, --run-format, clear errors, and outsiders' readers."""

from __future__ import annotations

import json
import types

import pytest

import gradian
from gradian.cli.app import main
from gradian.errors import RunDirError
from gradian.plugins import load_plugins
from gradian.records import MetricPoint, RunArtifact, RunConfig, RunLogReaderSpec
from gradian.runs import read_run, select_reader
from tests.support.fake_dist import write_distribution

THIRD_PARTY_READER = '''
import json
from pathlib import Path

import gradian
from gradian.records import MetricPoint, RunArtifact, RunConfig, RunLogReaderSpec


def read(path):
    rows = [json.loads(line) for line in (Path(path) / "mylog.txt").read_text().splitlines()]
    return RunArtifact(path=Path(path), reader="my-loop", config=RunConfig(learning_rate=rows[0]["lr"]),
                       metrics=tuple(MetricPoint(step=r["it"], loss=r["l"], line=n) for n, r in enumerate(rows, 1)),
                       sources={"metrics": str(Path(path) / "mylog.txt"), "learning_rate": str(Path(path) / "mylog.txt")})


@gradian.hookimpl
def gradian_run_log_readers():
    yield RunLogReaderSpec(name="my-loop", summary="my loop's mylog.txt",
                           sniff=lambda path: 1.0 if (Path(path) / "mylog.txt").is_file() else 0.0,
                           read=read, looks_for=("mylog.txt",))
'''


def write_mylog(run, lr=3e-3):
    run.mkdir(parents=True, exist_ok=True)
    (run / "mylog.txt").write_text("\n".join(json.dumps({"it": i, "l": 2.0 - i / 10, "lr": lr}) for i in range(1, 11)))
    return run


def test_a_reader_registered_on_a_plugin_set_is_detected(tmp_path):
    """An outsider's reader registered as an object on the PluginSet, exactly like an installed plugin."""
    def sniff(path):
        return 1.0 if (path / "custom.log").is_file() else 0.0

    def read(path):
        return RunArtifact(path=path, reader="custom", config=RunConfig(learning_rate=1e-4),
                           metrics=(MetricPoint(step=1, loss=2.0),))

    plugin = types.SimpleNamespace(gradian_run_log_readers=gradian.hookimpl(
        lambda: [RunLogReaderSpec(name="custom", summary="custom.log", sniff=sniff, read=read, looks_for=("custom.log",))]))
    plugins = load_plugins(autoload=False)
    plugins.register(plugin, "custom-reader", "gradian-reader-custom", "1.0")
    (tmp_path / "custom.log").write_text("x")
    readers = plugins.run_log_readers()
    assert select_reader(tmp_path, readers).name == "custom"
    assert read_run(tmp_path, readers=readers).reader == "custom"
    assert plugins.distribution_of("gradian_run_log_readers", "custom") == "gradian-reader-custom"


def test_an_installed_third_party_reader_feeds_the_checks(tmp_path, monkeypatch):
    """A faked installed distribution with an entry point: its reader is auto-detected and listed."""
    write_distribution(tmp_path / "site", "gradian-reader-myloop", {"reader-myloop": "myloop_reader"},
                       {"myloop_reader": THIRD_PARTY_READER})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    run = write_mylog(tmp_path / "run")
    assert main(["diagnose", "--run", str(run), "--select", "lr_too_high_for_lora", "--format", "json", "--fail-on", "never"]) == 0
    assert main(["diagnose", "--run", str(run), "--select", "lr_too_high_for_lora"]) == 1  # lr 3e-3: an error


def test_no_reader_matches_lists_what_was_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(RunDirError) as caught:
        read_run(tmp_path)
    message = caught.value.message
    for looked_for in ("trainer_state.json", "training_args.bin", "trainer_log.jsonl", "run.json + metrics.jsonl", "axolotl"):
        assert looked_for in message


def test_run_format_selects_a_reader_and_unknown_names_are_errors(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    assert read_run(tmp_path, "plain").reader == "plain"
    with pytest.raises(RunDirError, match="unknown --run-format 'nope'.*"):
        read_run(tmp_path, "nope")


def test_highest_confidence_wins(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [], "global_step": 0}))
    (tmp_path / "trainer_log.jsonl").write_text("")
    assert read_run(tmp_path).reader == "llamafactory"  # 0.95 beats the Trainer files' 0.8


def test_missing_dir_and_file_are_errors(tmp_path):
    with pytest.raises(RunDirError, match="does not exist"):
        read_run(tmp_path / "nope")
    (tmp_path / "f.json").write_text("{}")
    with pytest.raises(RunDirError, match="is a file, not a directory"):
        read_run(tmp_path / "f.json")
