"""How much the CLI prints: --format on every command with results (--json kept), -q / -v, progress in a log."""

from __future__ import annotations

import json

import pytest

from gradian.cli import output, progress
from gradian.cli.app import main


def test_plain_progress_lines_come_at_the_start_every_interval_and_at_the_end(capsys, monkeypatch):
    now = [0.0]
    lines = progress._Lines(clock=lambda: now[0])
    tick = lines.stage("index")
    for done, at in ((0, 0.0), (10, 2.0), (40, 6.0), (60, 8.0), (100, 9.0)):
        now[0] = at
        tick(done, 100)
    err = capsys.readouterr().err.splitlines()
    assert err == ["gradian: index 0/100 (0%)", "gradian: index 40/100 (40%), 6.67 ex/s, ETA 0:00:09",
                   "gradian: index 100/100 (100%), 11.11 ex/s, ETA 0:00:00"]


def test_a_count_that_goes_back_is_a_new_pass_with_its_own_rate(capsys):
    now = [0.0]
    lines = progress._Lines(clock=lambda: now[0])
    tick = lines.stage("checkpoints")  # one index per checkpoint, all under one stage
    for done, at in ((0, 0.0), (100, 10.0), (0, 10.5), (50, 20.5)):
        now[0] = at
        tick(done, 100)
    err = capsys.readouterr().err.splitlines()
    assert err == ["gradian: checkpoints 0/100 (0%)", "gradian: checkpoints 100/100 (100%), 10.00 ex/s, ETA 0:00:00",
                   "gradian: checkpoints 0/100 (0%)", "gradian: checkpoints 50/100 (50%), 5.00 ex/s, ETA 0:00:10"]


def test_rich_bars_restart_their_clock_on_a_new_pass():
    bars = progress._Bars()
    tick = bars.stage("checkpoints")
    try:
        tick(100, 100)
        task = bars.progress.tasks[0]
        assert task.finished
        tick(0, 100)
        assert task.completed == 0 and not task.finished and task.fields["first"] == 0
    finally:
        bars.close()


def test_stage_bars_print_lines_to_a_non_terminal_and_nothing_when_quiet(capsys):
    with progress.stage_bars() as bars:
        bars("score")(5, 5)
    assert capsys.readouterr().err == "gradian: score 5/5 (100%)\n"
    output.set_verbosity(quiet=True, verbose=False)
    try:
        with progress.stage_bars() as bars:
            assert bars("score") is None
    finally:
        output.set_verbosity(False, False)


def test_quiet_and_verbose_together_are_one_line(capsys):
    assert main(["-q", "-v", "plugins"]) == 2
    assert "contradict" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["plugins"], ["doctor"]])
def test_json_stays_an_alias_of_format_json(capsys, command):
    assert main([*command, "--json"]) == 0
    old = json.loads(capsys.readouterr().out)
    assert main([*command, "--format", "json"]) == 0
    new = json.loads(capsys.readouterr().out)
    assert type(new) is type(old) and (new.keys() == old.keys() if isinstance(old, dict) else new == old)


def test_format_md_prints_markdown(capsys):
    assert main(["plugins", "--format", "md"]) == 0
    assert capsys.readouterr().out.startswith("| name | distribution | version |")
    assert main(["doctor", "--format", "md"]) == 0
    assert capsys.readouterr().out.startswith("```text\n")


@pytest.mark.parametrize("command", [["plugins"], ["doctor"], ["show-index", "."], ["export"]])
def test_an_unknown_format_is_one_line(capsys, command):
    assert main([*command, "--format", "yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--format 'yaml' is unknown" in err and "table, json, md" in err
