"""Every hostile input is a clean refusal: the exit code, one stderr line, no traceback, the output untouched."""

from __future__ import annotations

import hashlib
import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from gradian.cli.app import main
from tests.hostile.cases import FILE_KINDS, PICKLE_KINDS, Writer

# Rows or lines the .jsonl reader reads as bad rows: diagnose reports them as findings (exit 1), the other
# commands refuse the dataset (exit 2). Every other kind is wrong for the file as a whole.
# (diagnose refuses a file that is not UTF-8 as a whole).
ROW_LEVEL = {"nul_bytes", "deep_array", "deep_object", "deep_500", "lone_surrogate", "truncated",
             "json_null", "json_string", "json_ints", "huge_int", "yaml_python_tag", "yaml_deep", "yaml_laughs",
             "huge_float"}
ROWS = [{"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                      {"role": "assistant", "content": f"{i + 1}."}]} for i in range(4)]


@pytest.fixture(autouse=True)
def _net_and_deadline(monkeypatch):
    """Exercise main()'s last-resort net (conftest turns it off) and fail a case that hangs instead of refusing."""
    monkeypatch.delenv("GRADIAN_DEBUG", raising=False)

    def _hung(signum, frame):
        raise TimeoutError("the command hung on a hostile input")

    previous = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _snapshot(path: Path) -> object:
    """What is at ``path`` now: nothing, a link target, a file's hash or a directory's files and sizes."""
    if path.is_symlink():
        return ("link", str(path.readlink()))
    if not path.exists():
        return None
    if path.is_file():
        return ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    if path.is_dir():
        return ("dir", sorted((str(p.relative_to(path)), p.stat().st_size if p.is_file() else -1)
                              for p in path.rglob("*")))
    return ("other", path.stat().st_mode)


def _valid_rows(path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    return path


def refuse(capsys, argv: list[str], out: Path, code: int) -> str:
    """Run the command and assert it refused cleanly, left ``out`` (and a .partial beside it) as it was."""
    before = _snapshot(out)
    partial = out.parent / f".{out.name}.partial"
    had_partial = partial.exists()
    result = main([str(a) for a in argv])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert result == code, captured.err + captured.out[-2000:]
    assert "Traceback" not in captured.err and "Traceback" not in captured.out
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("gradian: error: "), captured.err
        assert "internal error" not in lines[0], lines[0]
    else:
        assert len(lines) <= 1, captured.err
    assert _snapshot(out) == before, f"{out} changed"
    assert partial.exists() == had_partial
    return lines[0] if lines else ""


# --- one hostile file in each slot a command reads ------------------------------------------------------------


def _dataset_for_index(tmp: Path, write: Writer, fx: dict[str, Path]) -> list:
    write(tmp / "train.jsonl")
    return ["index", "--base-model", fx["base"], "--adapter", fx["adapter"], "--dataset", tmp / "train.jsonl",
            "--out", tmp / "out"]


def _dataset_for_diagnose(tmp: Path, write: Writer, fx: dict[str, Path]) -> list:
    write(tmp / "train.jsonl")
    return ["diagnose", "--dataset", tmp / "train.jsonl"]  # no output: a bad row is a finding, not a refusal


def _eval_for_attribute(tmp: Path, write: Writer, fx: dict[str, Path]) -> list:
    write(tmp / "eval.jsonl")
    return ["attribute", "--base-model", fx["base"], "--adapter", fx["adapter"], "--dataset", fx["rows"],
            "--eval-dataset", tmp / "eval.jsonl", "--out", tmp / "out"]


def _trainer_state(tmp: Path, write: Writer, fx: dict[str, Path]) -> list:
    (tmp / "run").mkdir()
    write(tmp / "run" / "trainer_state.json")
    return ["diagnose", "--run", tmp / "run", "--plots", tmp / "out"]


def _adapter_config(tmp: Path, write: Writer, fx: dict[str, Path]) -> list:
    (tmp / "adapter").mkdir()
    write(tmp / "adapter" / "adapter_config.json")
    return ["diagnose", "--adapter", tmp / "adapter", "--plots", tmp / "out", "--run", fx["run"]]


def _config_file(tmp: Path, write: Writer, fx: dict[str, Path]) -> list:
    write(tmp / "gradian.yaml")
    return ["index", "--base-model", fx["base"], "--adapter", fx["adapter"], "--dataset", fx["rows"],
            "--config", tmp / "gradian.yaml", "--out", tmp / "out"]


def _manifest(tmp: Path, write: Writer, fx: dict[str, Path]) -> list:
    (tmp / "out").mkdir()
    write(tmp / "out" / "manifest.json")
    return ["show-index", tmp / "out"]


def _report(tmp: Path, write: Writer, fx: dict[str, Path]) -> list:
    (tmp / "report").mkdir()
    write(tmp / "report" / "report.json")
    return ["verify", "--report", tmp / "report", "--out", tmp / "out"]


SLOTS: dict[str, Callable[[Path, Writer, dict[str, Path]], list]] = {
    "index-dataset": _dataset_for_index,
    "diagnose-dataset": _dataset_for_diagnose,
    "attribute-eval": _eval_for_attribute,
    "trainer-state": _trainer_state,
    "adapter-config": _adapter_config,
    "config": _config_file,
    "manifest": _manifest,
    "report": _report,
}


@pytest.fixture()
def fx(tmp_path, tiny_base_dir, tiny_adapter_dir) -> dict[str, Path]:
    """The valid inputs around the hostile one: a tiny base and adapter, good rows, a run dir with a log."""
    run = tmp_path / "fx-run"
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 2, "max_steps": 2, "log_history": [
        {"step": 1, "loss": 2.0, "learning_rate": 1e-4}, {"step": 2, "loss": 1.5, "learning_rate": 1e-4}]}))
    return {"base": tiny_base_dir, "adapter": tiny_adapter_dir, "rows": _valid_rows(tmp_path / "fx-rows.jsonl"),
            "run": run}


def _expected(slot: str, kind: str) -> int:
    if slot == "diagnose-dataset" and kind in ROW_LEVEL:
        return 1  # the bad row is diagnose's schema_invalid finding
    return 2


# An empty YAML file is an empty config, which is valid: nothing hostile about it.
EMPTY_CONFIGS = {"empty", "whitespace", "bom_only", "json_null"}
FILE_CASES = [(slot, kind) for slot in sorted(SLOTS) for kind in sorted(FILE_KINDS)
              if not (slot == "config" and kind in EMPTY_CONFIGS)]


@pytest.mark.parametrize(("slot", "kind"), FILE_CASES)
def test_a_hostile_file_in_every_slot_is_refused(capsys, tmp_path, fx, slot, kind):
    work = tmp_path / "case"
    work.mkdir()
    argv = SLOTS[slot](work, FILE_KINDS[kind], fx)
    refuse(capsys, argv, work / "out", _expected(slot, kind))


@pytest.mark.parametrize("kind", sorted(PICKLE_KINDS))
def test_a_hostile_training_args_bin_is_refused_at_once(capsys, tmp_path, fx, kind):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text((fx["run"] / "trainer_state.json").read_text())
    PICKLE_KINDS[kind](run / "training_args.bin")
    line = refuse(capsys, ["diagnose", "--run", run, "--plots", tmp_path / "out"], tmp_path / "out", 2)
    assert "training_args.bin" in line


# --- output locations that cannot be written, checked before anything loads -----------------------------------


def _file(out: Path) -> Path:
    out.write_text("the user's file\n")
    return out


def _under_file(out: Path) -> Path:
    _file(out)
    return out / "inside"


def _read_only_fs(out: Path) -> Path:
    return Path("/proc/gradian-hostile-out")  # not writable, even by root


def _no_permission(out: Path) -> Path:
    return Path("/sys/gradian-hostile-out")


def _fifo_out(out: Path) -> Path:
    FILE_KINDS["fifo"](out)
    return out


def _loop_out(out: Path) -> Path:
    FILE_KINDS["symlink_loop"](out)
    return out


OUT_KINDS: dict[str, Callable[[Path], Path]] = {
    "file": _file, "under_file": _under_file, "proc": _read_only_fs, "sys": _no_permission, "fifo": _fifo_out,
    "symlink_loop": _loop_out,
}


def _out_argv(command: str, out: Path, fx: dict[str, Path]) -> list:
    model = ["--base-model", fx["base"], "--adapter", fx["adapter"], "--dataset", fx["rows"]]
    return {
        "attribute": ["attribute", *model, "--eval-dataset", fx["rows"], "--out", out],
        "index": ["index", *model, "--out", out],
        "diagnose": ["diagnose", "--dataset", fx["rows"], "--run", fx["run"], "--plots", out],
        "demo": ["demo", "--workdir", out],
        "train": ["train", "--base-model", fx["base"], "--dataset", fx["rows"], "--out", out],
        "verify": ["verify", "--report", fx["run"], "--out", out],
        "inject": ["inject", "--base-model", fx["base"], "--dataset", fx["rows"], "--poison", fx["rows"],
                   "--eval-dataset", fx["rows"], "--out", out],
    }[command]


@pytest.mark.parametrize("kind", sorted(OUT_KINDS))
@pytest.mark.parametrize("command", ["attribute", "index", "diagnose", "demo", "train", "verify", "inject"])
def test_an_unwritable_output_is_refused_before_any_work(capsys, tmp_path, fx, command, kind):
    out = OUT_KINDS[kind](tmp_path / "out")
    line = refuse(capsys, _out_argv(command, out, fx), out, 2)
    assert str(out) in line


def test_an_index_of_other_inputs_is_kept_unless_overwrite(capsys, tmp_path, fx):
    out = tmp_path / "index"
    assert main(["index", "--base-model", str(fx["base"]), "--adapter", str(fx["adapter"]), "--dataset",
                 str(fx["rows"]), "--out", str(out)]) == 0
    capsys.readouterr()
    other = tmp_path / "other.jsonl"
    other.write_text(fx["rows"].read_text().replace("plus one", "plus 1"))
    argv = ["index", "--base-model", fx["base"], "--adapter", fx["adapter"], "--dataset", other, "--out", out]
    line = refuse(capsys, argv, out, 2)
    assert "another dataset" in line and "--overwrite" in line


def test_the_corpus_has_at_least_200_cases():
    assert len(FILE_CASES) + len(PICKLE_KINDS) + len(OUT_KINDS) * 7 + 1 >= 200
