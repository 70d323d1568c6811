"""--run-config: the axolotl / LLaMA-Factory YAML kept outside the run dir is read with it, not lost."""

from __future__ import annotations

import shutil

import pytest

from gradian.cli.app import main
from gradian.diagnose.runner import diagnose
from gradian.errors import RunDirError
from gradian.runs import read_run
from tests.core.test_runlog_axolotl import AXOLOTL_YAML, check_config
from tests.core.test_runlog_llamafactory import CONFIG as LLAMAFACTORY_YAML


@pytest.fixture(scope="module")
def real():
    from tests.checks.run_fixtures import real_runs

    return real_runs()


@pytest.fixture
def project(real, tmp_path):
    """The usual axolotl layout: configs/lora.yml beside outputs/lora-out, which holds only the Trainer files."""
    run = shutil.copytree(real.healthy_run, tmp_path / "outputs" / "lora-out")
    config = tmp_path / "configs" / "lora.yml"
    config.parent.mkdir()
    config.write_text(AXOLOTL_YAML)
    return run, config


def test_axolotl_config_kept_elsewhere_is_read_with_the_run_dir(project):
    run, config = project
    assert read_run(run).reader == "hf-trainer" and read_run(run).config.packing is None  # lost without it
    artifact = read_run(run, run_config=config)
    assert artifact.reader == "axolotl"
    check_config(artifact.config)  # sample_packing, train_on_inputs, sequence_len ... all there
    assert artifact.sources["packing"] == artifact.sources["loss_mask"] == f"{config}:1"
    assert len([p for p in artifact.metrics if p.loss is not None]) == 42  # the logs still come from the run dir


def test_diagnose_reports_what_only_the_config_says(project):
    run, config = project
    checks = ("loss_on_prompt", "packing_contamination")
    assert diagnose(run=run, select=checks).findings == ()
    report = diagnose(run=run, run_config=config, select=checks)
    assert {f.check_id for f in report.findings} == set(checks)
    assert all(f.evidence[0].location == f"{config}:1" for f in report.findings)
    assert report.inputs["run"]["run_config"] == str(config) and report.inputs["run"]["reader"] == "axolotl"


def test_llamafactory_training_args_yaml_kept_elsewhere(real, tmp_path):
    run = shutil.copytree(real.healthy_run, tmp_path / "saves" / "lora")
    config = tmp_path / "examples" / "train_lora.yaml"
    config.parent.mkdir()
    config.write_text(LLAMAFACTORY_YAML)
    artifact = read_run(run, run_config=config)
    cfg = artifact.config
    assert (artifact.reader, cfg.max_length, cfg.packing_strategy, cfg.loss_mask) == ("llamafactory", 1024, "concat", "completion_only")
    assert artifact.sources["max_length"] == str(config)


def test_cli_takes_run_config(project, capsys):
    run, config = project
    args = ["diagnose", "--run", str(run), "--run-config", str(config), "--select", "packing_contamination",
            "--format", "json", "--fail-on", "never"]
    assert main(args) == 0
    assert '"packing_contamination"' in capsys.readouterr().out


@pytest.mark.parametrize(("write", "expected"), [
    (None, "does not exist"),
    ("sequence_len: [unclosed\n", "lora.yml:2: not valid YAML"),
    ("learning_rate: 1e-4\nnum_epochs: 3\n", "is neither an axolotl config"),
])
def test_a_missing_or_unusable_config_is_one_line_exit_2(project, capsys, write, expected):
    run, config = project
    if write is None:
        config.unlink()
    else:
        config.write_text(write)
    assert main(["diagnose", "--run", str(run), "--run-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "(hint: " in err and len(err.strip().splitlines()) == 1
    with pytest.raises(RunDirError):
        read_run(run, run_config=config)


def test_run_config_needs_run(project, capsys):
    _, config = project
    assert main(["diagnose", "--dataset", str(config), "--run-config", str(config)]) == 2
    assert "--run-config" in capsys.readouterr().err


def test_run_format_that_contradicts_the_config_is_refused(project):
    run, config = project
    with pytest.raises(RunDirError, match="is an axolotl config, but --run-format is llamafactory"):
        read_run(run, "llamafactory", run_config=config)
