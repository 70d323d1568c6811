"""`gradian train`: backend lookup and bad input as one-line errors with exit code 2, and a real run."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from gradian.cli.app import main
from tests.trainer_hf.chat_data import QUICK, write_chat_dataset


@pytest.fixture
def args(tiny_base_dir, tmp_path):
    dataset = write_chat_dataset(tmp_path / "train.jsonl")
    base = ["train", "--base-model", str(tiny_base_dir), "--dataset", str(dataset), "--out", str(tmp_path / "out")]
    for override in QUICK:
        base += ["--set", override]
    return base


def _one_line_error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("gradian: error: "), err
    return err


def test_trains_with_the_hf_backend_by_default(args, tmp_path, capsys):
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "trained with hf in" in out and "3 steps, final loss" in out
    assert (tmp_path / "out" / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "out" / "run" / "trainer_state.json").is_file()
    # train.checkpoints (4) evenly spaced checkpoints: every step of a 3-step run, each with its adapter and optimizer
    checkpoints = sorted(p.name for p in (tmp_path / "out" / "run").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    for name in checkpoints:
        folder = tmp_path / "out" / "run" / name
        assert (folder / "adapter_model.safetensors").is_file() and (folder / "optimizer.pt").is_file()


@pytest.mark.parametrize(("steps", "checkpoints", "save_steps"), [(50, 4, 13), (50, 1, 50), (3, 4, 1), (100, 5, 20)])
def test_checkpoints_are_evenly_spaced_and_all_kept(tmp_path, steps, checkpoints, save_steps):
    from gradian.config import GradianConfig
    from gradian.model.placement import Placement
    from gradian.training.arguments import trainer_arguments

    train = dataclasses.replace(GradianConfig().train, checkpoints=checkpoints, max_steps=steps)
    arguments = trainer_arguments(train, tmp_path, 16, Placement("cpu", "float32"))
    assert arguments["save_steps"] == save_steps and arguments["save_total_limit"] == checkpoints


def test_unknown_backend_lists_the_installed_ones(args, capsys):
    err = _one_line_error(capsys, [*args, "--backend", "axolotl"])
    assert "training backend 'axolotl' is not installed (installed backends: hf, trl, unsloth)" in err


@pytest.mark.parametrize("backend, distribution", [("trl", "gradian-trainer-trl"), ("hf", "gradian-trainer-hf")])
def test_a_backend_whose_distribution_is_missing_names_it(args, capsys, monkeypatch, backend, distribution):
    monkeypatch.setenv("GRADIAN_DISABLE_PLUGIN_AUTOLOAD", "1")  # as if no trainer distribution were installed
    err = _one_line_error(capsys, [*args, "--backend", backend])
    assert f"training backend {backend!r} is not installed" in err and f"pip install {distribution}" in err


@pytest.mark.parametrize("override, key", [
    ("train.learning_rate=5", "train.learning_rate"),
    ("train.lora_r=0", "train.lora_r"),
    ("train.scheduler=exponential", "train.scheduler"),
])
def test_train_config_out_of_range_is_the_config_error(args, capsys, override, key):
    err = _one_line_error(capsys, [*args, "--set", override])
    assert f"config key {key} has the value" in err


def test_missing_inputs_are_one_line_errors(tiny_base_dir, tmp_path, capsys):
    dataset = write_chat_dataset(tmp_path / "train.jsonl")
    assert "no base model given" in _one_line_error(capsys, ["train", "--dataset", str(dataset), "--out", str(tmp_path / "o")])
    assert "does not exist" in _one_line_error(
        capsys, ["train", "--base-model", str(tiny_base_dir), "--dataset", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")])
    assert "no output directory given" in _one_line_error(
        capsys, ["train", "--base-model", str(tiny_base_dir), "--dataset", str(dataset)])


def test_an_existing_result_is_kept_unless_overwrite(args, tmp_path, capsys):
    (tmp_path / "out" / "adapter").mkdir(parents=True)
    err = _one_line_error(capsys, args)
    assert "already holds adapter/" in err and "--overwrite" in err


def test_train_help_does_not_import_torch():
    script = "import sys\nfrom gradian.cli.app import main\nmain(['train', '--help'])\nprint('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "--backend" in run.stdout and run.stdout.strip().endswith("False")


def test_a_job_survives_a_round_trip_through_json(tmp_path):
    import json

    from gradian.config import load_config
    from gradian.pipelines.train import job_from_dict, job_to_dict, make_job

    dataset = write_chat_dataset(tmp_path / "train.jsonl")
    job = make_job("smollm2-135m-instruct", dataset, tmp_path / "out", load_config(None, ["train.lora_r=16"]),
                   drop_ids=["ex-000003-abcdef12"], extra_datasets=[dataset])
    assert job_from_dict(json.loads(json.dumps(job_to_dict(job)))) == job


def test_a_bfloat16_base_trains_a_float32_adapter_on_the_cpu(args, tmp_path, capsys):
    import json

    from safetensors import safe_open

    assert main([*args, "--device", "cpu", "--dtype", "bfloat16"]) == 0, capsys.readouterr().err
    assert "3 steps, final loss" in capsys.readouterr().out
    with safe_open(str(tmp_path / "out" / "adapter" / "adapter_model.safetensors"), "pt") as weights:
        dtypes = {str(weights.get_tensor(name).dtype) for name in weights.keys()}
    assert dtypes == {"torch.float32"}
    record = json.loads((tmp_path / "out" / "run" / "gradian-job.json").read_text())
    assert (record["device"], record["dtype"]) == ("cpu", "bfloat16")


@pytest.mark.parametrize(("device", "dtype", "flags"), [
    ("cpu", "float32", {"use_cpu": True, "full_determinism": True, "bf16": False, "fp16": False}),
    ("cpu", "bfloat16", {"use_cpu": True, "full_determinism": True, "bf16": False, "fp16": False}),
    ("cuda:0", "bfloat16", {"use_cpu": False, "full_determinism": False, "bf16": True, "fp16": False}),
    ("cuda:0", "float16", {"use_cpu": False, "full_determinism": False, "bf16": False, "fp16": True}),
    ("cuda:0", "float32", {"use_cpu": False, "full_determinism": False, "bf16": False, "fp16": False}),
    ("mps", "float16", {"use_cpu": False, "full_determinism": False, "bf16": False, "fp16": False}),
])
def test_trainer_precision_flags_follow_the_placement(tmp_path, device, dtype, flags):
    from gradian.config import GradianConfig
    from gradian.model.placement import Placement
    from gradian.training.arguments import trainer_arguments

    arguments = trainer_arguments(GradianConfig().train, tmp_path, 16, Placement(device, dtype))
    assert {key: arguments[key] for key in flags} == flags


def test_training_on_another_gpu_than_the_trainers_is_refused(monkeypatch):
    from gradian.errors import DeviceError
    from gradian.model.placement import Placement
    from gradian.training.arguments import check_training_placement

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    check_training_placement(Placement("cuda:0", "bfloat16"))
    with pytest.raises(DeviceError, match="not on cuda:1") as raised:
        check_training_placement(Placement("cuda:1", "bfloat16"))
    assert "CUDA_VISIBLE_DEVICES=1" in raised.value.one_line()
