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


# --- --device and --dtype: refused before anything is read or written, by every command that loads a model ---

_BAD_PLACEMENTS = [
    (["--device", "gpu0"], "unknown device 'gpu0'"),
    (["--device", "cuda:99"], "cuda:99"),
    (["--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["--device", "cpu", "--dtype", "float16"], "float16 is refused on the CPU"),
]


def _placement_cases():
    import torch

    cases = list(_BAD_PLACEMENTS)
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "no CUDA GPU is visible"))
    if not torch.backends.mps.is_available():
        cases.append((["--device", "mps"], "MPS is not available"))
    return cases


def _command_lines(tmp_path, base, adapter):
    data = tmp_path / "train.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}\n')
    out = tmp_path / "out"
    model = ["--base-model", str(base)]
    return out, {
        "index": ["index", *model, "--adapter", str(adapter), "--dataset", str(data), "--out", str(out)],
        "attribute": ["attribute", *model, "--adapter", str(adapter), "--dataset", str(data), "--out", str(out)],
        "verify": ["verify", "--drop", str(data), *model, "--dataset", str(data), "--eval-dataset", str(data),
                   "--out", str(out)],
        "inject": ["inject", *model, "--dataset", str(data), "--poison", str(data), "--eval-dataset", str(data),
                   "--out", str(out)],
        "train": ["train", *model, "--dataset", str(data), "--out", str(out)],
        "demo": ["demo", *model, "--workdir", str(out)],
    }


@pytest.mark.parametrize("command", ["index", "attribute", "verify", "inject", "train", "demo"])
@pytest.mark.parametrize(("flags", "needle"), _placement_cases())
def test_a_bad_device_or_dtype_is_refused_with_nothing_written(capsys, monkeypatch, tmp_path, tiny_base_dir,
                                                               tiny_adapter_dir, command, flags, needle):
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))  # where an index or demo would go by default
    out, lines = _command_lines(tmp_path, tiny_base_dir, tiny_adapter_dir)
    code, stdout, err = run_cli(capsys, *lines[command], *flags)
    assert_one_line_error(code, err, needle, "(hint: ")
    assert stdout == ""
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_the_installed_command_refuses_a_bad_device_without_a_traceback(tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "gradian", "attribute", "--adapter", str(tmp_path), "--dataset",
                           str(tmp_path / "train.jsonl"), "--out", str(out), "--device", "tpu"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gradian: error: unknown device 'tpu' (hint: use auto, cpu, cuda, cuda:N or mps; `gradian doctor` lists the "
        "visible devices)"
    ]
    assert proc.stdout == "" and not out.exists()
