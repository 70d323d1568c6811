"""`gradian diagnose` from the command line: formats, exit codes, --list, --select/--ignore, --plots, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from gradian.cli.app import main
from tests.support.fake_dist import write_distribution

THIRD_PARTY_CHECK = '''
import gradian
from gradian.records import AuditCheck, Finding


def run(ctx):
    if ctx.run.config.seed == 0:
        yield Finding("seed_is_zero", "info", "the run used seed 0", "vary seeds across runs")


@gradian.hookimpl
def gradian_audit_checks():
    yield AuditCheck(id="seed_is_zero", family="config", severity="info", summary="the run's seed is 0",
                     fix="vary seeds", needs=frozenset({"run_config"}), run=run)
'''


@pytest.fixture(scope="module")
def real():
    from tests.checks.run_fixtures import real_runs

    return real_runs()


def faulty_args(real):
    return ["diagnose", "--dataset", str(real.faulty_dataset), "--run", str(real.faulty_run), "--base-model", str(real.base_dir)]


def healthy_args(real):
    return ["diagnose", "--dataset", str(real.healthy_dataset), "--run", str(real.healthy_run), "--base-model", str(real.base_dir),
            "--eval-dataset", str(real.eval_dataset)]


def test_table_output_groups_by_severity_with_evidence_and_fix(real, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")  # wide enough that no path wraps
    assert main(faulty_args(real)) == 1
    out = capsys.readouterr().out
    assert out.index("Errors (") < out.index("Warnings (") < out.index("Info (")
    assert "lr_too_high_for_lora" in out and "training_args.bin" in out and "use 1e-4 to 2e-4 for LoRA" in out
    assert "faulty.jsonl:37" in out  # the broken row, file:line
    assert "43 checks ran, 1 skipped" in out  # train_eval_overlap needs --eval-dataset


def test_json_output(real, capsys):
    assert main(faulty_args(real) + ["--format", "json", "--fail-on", "never"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "gradian.diagnose/1"
    assert report["summary"]["checks_run"] == 43 and report["summary"]["error"] >= 5
    finding = next(f for f in report["findings"] if f["id"] == "run_incomplete")
    assert finding["family"] == "dynamics" and finding["severity"] == "warning" and finding["fix"]
    evidence = finding["evidence"][0]
    assert evidence["steps"] == [30] and evidence["values"] == {"global_step": 30, "max_steps": 108}
    path, line = evidence["location"].rsplit(":", 1)
    assert path.endswith("trainer_state.json") and '"global_step": 30' in open(path).read().splitlines()[int(line) - 1]


def test_markdown_output(real, capsys):
    main(faulty_args(real) + ["--format", "md"])
    out = capsys.readouterr().out
    assert out.startswith("# gradian diagnose") and "## Errors (" in out and "**Fix:**" in out


def test_fail_on_levels(real, capsys):
    assert main(healthy_args(real) + ["--fail-on", "warning"]) == 0  # the healthy run: no warnings, no errors
    warnings_only = healthy_args(real) + ["--set", "diagnose.lr_warn=1e-4"]  # lr 4e-4 now warns (not errors)
    assert main(warnings_only + ["--fail-on", "error"]) == 0
    assert main(warnings_only + ["--fail-on", "warning"]) == 1
    assert main(faulty_args(real) + ["--fail-on", "never"]) == 0
    capsys.readouterr()


def test_without_run_the_output_lists_skipped_checks_and_their_needs(real, capsys):
    assert main(["diagnose", "--dataset", str(real.healthy_dataset)]) == 0
    out = capsys.readouterr().out
    assert "needs --run" in out and "needs --base-model" in out and "needs --eval-dataset" in out
    assert "lr_too_high_for_lora" in out and "14 skipped" not in out


def test_select_and_ignore_take_ids_and_families(real, capsys):
    main(faulty_args(real) + ["--select", "config", "--ignore", "lr_too_high_for_lora", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert len(report["ran"]) == 16 and "lr_too_high_for_lora" not in report["ran"]
    assert {f["family"] for f in report["findings"]} == {"config"}
    assert main(faulty_args(real) + ["--select", "nan_or_inf,run_incomplete", "--format", "json"]) == 0
    assert {f["id"] for f in json.loads(capsys.readouterr().out)["findings"]} == {"run_incomplete"}


def test_unknown_select_is_a_user_error(real, capsys):
    assert main(faulty_args(real) + ["--select", "lr_too_hihg_for_lora"]) == 2
    err = capsys.readouterr().err
    assert "did you mean lr_too_high_for_lora?" in err and len(err.strip().splitlines()) == 1


def test_list_shows_every_check_including_third_party(tmp_path, monkeypatch, capsys):
    write_distribution(tmp_path, "gradian-checks-extra", {"checks-extra": "extra_checks"}, {"extra_checks": THIRD_PARTY_CHECK})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["diagnose", "--list", "--format", "json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    ids = {c["id"]: c for c in listing["checks"]}
    assert len(ids) == 45 and ids["seed_is_zero"]["distribution"] == "gradian-checks-extra"
    assert ids["near_duplicates"]["distribution"] == "gradian-checks"
    assert {r["name"] for r in listing["readers"]} == {"hf-trainer", "axolotl", "llamafactory", "plain"}
    assert main(["diagnose", "--list"]) == 0
    out = capsys.readouterr().out
    assert "seed_is_zero" in out and "45 audit checks" in out


def test_third_party_check_runs_next_to_the_builtins(real, tmp_path, monkeypatch, capsys):
    write_distribution(tmp_path, "gradian-checks-extra", {"checks-extra": "extra_checks"}, {"extra_checks": THIRD_PARTY_CHECK})
    monkeypatch.syspath_prepend(str(tmp_path))
    main(["diagnose", "--run", str(real.healthy_run), "--format", "json"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [f["id"] for f in findings] == ["seed_is_zero"]


def test_plots_mark_flagged_steps(tmp_path, capsys):
    from tests.checks.check_cases import healthy_points

    run = tmp_path / "run"
    run.mkdir()
    points = healthy_points()
    points[60]["loss"] = 9.0  # a spike
    (run / "metrics.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    (run / "run.json").write_text(json.dumps({"status": "finished", "config": {"learning_rate": 2e-4, "lr_scheduler_type": "linear"}}))
    assert main(["diagnose", "--run", str(run), "--plots", str(tmp_path / "plots"), "--fail-on", "never"]) == 0
    written = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert written == ["grad_norm.png", "learning_rate.png", "loss.png"]
    assert all((tmp_path / "plots" / name).read_bytes().startswith(b"\x89PNG") for name in written)
    assert "wrote 3 plots" in capsys.readouterr().err


def test_plots_without_matplotlib_is_one_line(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.9}\n')
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert main(["diagnose", "--run", str(run), "--plots", str(tmp_path / "plots"), "--fail-on", "never"]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install matplotlib" in err and len(err.splitlines()) == 1


def _corrupt_adapter(real, tmp_path):
    adapter = shutil.copytree(real.healthy_run, tmp_path / "adapter", ignore=shutil.ignore_patterns("checkpoint-*"))
    data = (adapter / "adapter_model.safetensors").read_bytes()
    (adapter / "adapter_model.safetensors").write_bytes(data[:8] + b"garbage" + data[15:])
    return adapter


BAD_INPUTS = {
    "no reader matches": (lambda real, tmp: ["--run", str(tmp)], "no run-log reader recognises"),
    "truncated trainer_state.json": (
        lambda real, tmp: (tmp.joinpath("trainer_state.json").write_text(
            (real.healthy_run / "trainer_state.json").read_text()[:900]), ["--run", str(tmp)])[1],
        "trainer_state.json:"),
    "pickle that is not TrainingArguments": (
        lambda real, tmp: (tmp.joinpath("training_args.bin").write_bytes(__import__("pickle").dumps([1, 2])), ["--run", str(tmp)])[1],
        "holds a list, not a TrainingArguments"),
    "adapter with a corrupt safetensors header": (lambda real, tmp: ["--adapter", str(_corrupt_adapter(real, tmp))],
                                                  "corrupt safetensors header"),
    "adapter without safetensors": (
        lambda real, tmp: (tmp.joinpath("adapter_config.json").write_text("{}"), ["--adapter", str(tmp)])[1],
        "has no adapter_model.safetensors"),
    "dataset not UTF-8": (
        lambda real, tmp: (tmp.joinpath("d.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n'), ["--dataset", str(tmp / "d.jsonl")])[1],
        "d.jsonl:2: the dataset is not UTF-8"),
    "unknown run format": (lambda real, tmp: ["--run", str(real.healthy_run), "--run-format", "wandb"], "unknown --run-format"),
    "unknown output format": (lambda real, tmp: ["--dataset", str(real.healthy_dataset), "--format", "xml"], "--format 'xml'"),
    "unknown fail-on": (lambda real, tmp: ["--dataset", str(real.healthy_dataset), "--fail-on", "info"], "--fail-on 'info'"),
    "nothing to audit": (lambda real, tmp: [], "diagnose needs something to audit"),
    "unknown diagnose config key": (lambda real, tmp: ["--dataset", str(real.healthy_dataset), "--set", "diagnose.nope=1"],
                                    "unknown config key diagnose.nope"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(case, real, tmp_path, capsys):
    build, expected = BAD_INPUTS[case]
    (tmp_path / "in").mkdir()
    assert main(["diagnose", *build(real, tmp_path / "in")]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1 and err.startswith("gradian: error:")


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trainer_state.json").write_text('{"log_history": [ {"step": 1, "loss": ')
    result = subprocess.run([sys.executable, "-m", "gradian", "diagnose", "--run", str(tmp_path / "run")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "trainer_state.json:1: not valid JSON" in result.stderr
