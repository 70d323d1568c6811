"""Bad input gets one line on stderr, a hint, exit code 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gradian.cli.app import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gradian: error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["nosuchcommand"], ["No such command", "gradian --help"]),
        (["plugins", "--bogus"], ["No such option: --bogus", "gradian plugins --help"]),
        (["config", "--set", "grads.batch_size"], ["not section.key=value", "--set grads.batch_size=4"]),
        (["config", "--set", "grads.bach_size=4"], ["unknown config key grads.bach_size", "did you mean grads.batch_size"]),
        (["config", "--set", "evaluation.metric=bleu"], ["evaluation.metric", "exact_match"]),
        (["config", "--set", "grads.storage_dtype=int4"], ["grads.storage_dtype", "float16"]),
        (["config", "--set", "grads.batch_size=-1"], ["grads.batch_size must be an integer >= 1"]),
        (["config", "--set", "evaluation.require_significant=perhaps"], ["true or false"]),
        (["config", "--config", "/nonexistent/gradian.yaml"], ["does not exist", "--config"]),
    ],
)
def test_bad_command_lines(capsys, argv, needles):
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, *needles)


def test_bad_yaml_names_file_and_line(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("grads:\n  batch_size: 4\n  module_filter: [oops\n")
    code, _, err = run_cli(capsys, "config", "--config", str(path))
    assert_one_line_error(code, err, f"{path}:", "not valid YAML")


def test_the_installed_command_prints_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gradian", "config", "--set", "train.lora_r=0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gradian: error: config key train.lora_r has the value 0 (hint: train.lora_r must be an integer >= 1)"
    ]
    assert proc.stdout == ""
