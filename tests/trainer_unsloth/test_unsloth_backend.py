"""The unsloth backend: unavailable without CUDA (with the reason), never imported in the calling process."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradian.config import load_config
from gradian.pipelines.train import make_job
from tests.trainer_hf.chat_data import QUICK, write_chat_dataset

FAKE_UNSLOTH = Path(__file__).parent / "fake_unsloth"
REPO = Path(__file__).resolve().parents[2]

needs_no_cuda = pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the CPU-only behaviour"
)


@needs_no_cuda
def test_reports_itself_unavailable_without_cuda():
    from gradian.plugins import get_plugins

    spec = get_plugins().trainers()["unsloth"]
    assert "needs a CUDA GPU" in spec.unavailable_reason()


@needs_no_cuda
def test_gradian_train_with_unsloth_says_why_and_exits_2(tiny_base_dir, tmp_path, capsys):
    from gradian.cli.app import main

    dataset = write_chat_dataset(tmp_path / "train.jsonl")
    code = main(["train", "--backend", "unsloth", "--base-model", str(tiny_base_dir), "--dataset", str(dataset),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("gradian: error: the unsloth training backend cannot run here")
    assert "needs a CUDA GPU" in err and "--backend hf" in err
    assert not (tmp_path / "out").exists()


@needs_no_cuda
def test_the_calling_process_never_imports_unsloth(tiny_base_dir, tmp_path):
    """With an importable unsloth on the path, plugin listing, doctor-style checks and the CLI leave it unimported."""
    dataset = write_chat_dataset(tmp_path / "train.jsonl")
    script = f"""
import sys
from gradian.cli.app import main
from gradian.plugins import get_plugins
import gradian_trainer_unsloth.plugin, gradian_trainer_unsloth.backend, gradian_trainer_unsloth.jobfile
spec = get_plugins().trainers()["unsloth"]
print("reason:", spec.unavailable_reason())
code = main(["train", "--backend", "unsloth", "--base-model", {str(tiny_base_dir)!r}, "--dataset", {str(dataset)!r},
             "--out", {str(tmp_path / "out")!r}])
import importlib.util
print("code:", code, "findable:", importlib.util.find_spec("unsloth") is not None, "imported:", "unsloth" in sys.modules)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKE_UNSLOTH), str(REPO)])}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "code: 2 findable: True imported: False" in run.stdout


def test_the_worker_job_survives_a_round_trip_through_its_file(tiny_base_dir, tmp_path):
    from gradian.training.data import EncodedExample, EncodedSet
    from gradian_trainer_unsloth.jobfile import WorkerJob, read_worker_job, write_worker_job

    dataset = write_chat_dataset(tmp_path / "train.jsonl")
    cfg = load_config(None, [*QUICK, "train.use_rslora=true", "train.max_seq_length=64"])
    job = make_job(str(tiny_base_dir), dataset, tmp_path / "out", cfg, drop_ids=["ex-000001-x"],
                   extra_datasets=[dataset], trust_remote_code=True)
    work = WorkerJob(
        job=job, model_dir=tiny_base_dir, base_model_label="tiny", pad_token_id=3,
        encoded=EncodedSet((EncodedExample("ex-000000-abcd", (1, 2, 3), (-100, 2, 3)),), ("ex-000001-x",), ("ex-2",)),
    )
    path = write_worker_job(tmp_path, work)
    assert read_worker_job(path) == work
    assert json.loads(path.read_text())["job"]["config"]["train"]["use_rslora"] is True


@pytest.mark.slow
def test_the_worker_trains_in_its_own_process_and_imports_unsloth_first(tiny_base_dir, tmp_path, monkeypatch):
    """The worker's own code, run under a CPU stand-in for unsloth (the real one needs CUDA)."""
    from gradian.training.output import staged_output
    from gradian_trainer_unsloth.backend import UnslothTrainer

    record = tmp_path / "record.json"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE_UNSLOTH), str(REPO)]))
    monkeypatch.setenv("FAKE_UNSLOTH_RECORD", str(record))
    dataset = write_chat_dataset(tmp_path / "train.jsonl")
    job = make_job(str(tiny_base_dir), dataset, tmp_path / "out", load_config(None, list(QUICK)))
    with staged_output(job.out) as staged:
        result = UnslothTrainer().train(dataclasses.replace(job, out=staged.staging))
        assert result.backend == "unsloth" and result.steps == 3 and result.final_loss > 0
    assert "unsloth" not in sys.modules
    assert json.loads(record.read_text()) == {"transformers_already_imported": False, "peft_already_imported": False}
    assert (job.out / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((job.out / "run" / "trainer_state.json").read_text())["global_step"] == 3
    assert sorted(p.name for p in job.out.iterdir()) == ["adapter", "run"]  # job and result files stayed in staging
