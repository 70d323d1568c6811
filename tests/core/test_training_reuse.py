"""The one training cache of verify, inject and the demo: an identical job reuses the adapter, any change retrains."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gradian.config import GradianConfig, with_overrides
from gradian.model.placement import Placement
from gradian.records import TrainJob, TrainResult
from gradian.training.output import ADAPTER_DIR, ADAPTER_FILES, RUN_DIR
from gradian.training.reuse import KEY_FILE, adapter_key, train_or_reuse
from tests.trainer_hf.chat_data import write_chat_dataset


class FakeTrainer:
    """Writes an adapter and a run dir as run_training publishes them, and counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, job: TrainJob, backend: str) -> TrainResult:
        self.runs += 1
        for name in ADAPTER_FILES:
            (job.out / ADAPTER_DIR).mkdir(parents=True, exist_ok=True)
            (job.out / ADAPTER_DIR / name).write_text(f"run {self.runs}")
        (job.out / RUN_DIR).mkdir(exist_ok=True)
        return TrainResult(job.out / ADAPTER_DIR, job.out / RUN_DIR, final_loss=0.5, steps=3, seconds=1.25,
                           backend=backend, notes=("dropped 1 examples as asked",))


@pytest.fixture
def job(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "llama"}')
    (base / "tokenizer_config.json").write_text('{"chat_template": "a"}')
    dataset = write_chat_dataset(tmp_path / "train.jsonl", n=4)
    return TrainJob(base_model=str(base), dataset=dataset, out=tmp_path / "out", config=GradianConfig())


def test_an_identical_job_reuses_the_adapter_with_its_numbers(job):
    trainer = FakeTrainer()
    first = train_or_reuse(job, "hf", trainer)
    again = train_or_reuse(job, "hf", trainer)
    assert trainer.runs == 1 and not first.reused and again.reused
    assert again.result == first.result  # steps, loss, seconds and notes of the run that trained it


def test_a_moved_work_dir_is_still_reused(job, tmp_path):
    trainer = FakeTrainer()
    train_or_reuse(job, "hf", trainer)
    job.out.rename(tmp_path / "moved")
    moved = train_or_reuse(dataclasses.replace(job, out=tmp_path / "moved"), "hf", trainer)
    assert moved.reused and moved.result.adapter_dir == tmp_path / "moved" / ADAPTER_DIR


@pytest.mark.parametrize("change", [
    lambda job: dataclasses.replace(job, config=with_overrides(job.config, ["train.seed=1"])),
    lambda job: dataclasses.replace(job, config=with_overrides(job.config, ["train.learning_rate=1e-3"])),
    lambda job: dataclasses.replace(job, config=with_overrides(job.config, ["grads.loss_mask=all"])),
    lambda job: dataclasses.replace(job, config=with_overrides(job.config, ["grads.string_pairs=raw"])),
    lambda job: dataclasses.replace(job, drop_ids=frozenset({"ex-000000-00000000"})),
    lambda job: dataclasses.replace(job, dtype="bfloat16"),
    lambda job: dataclasses.replace(job, extra_datasets=(job.dataset,)),
], ids=["seed", "learning rate", "loss mask", "pair rendering", "dropped ids", "dtype", "extra data"])
def test_whatever_changes_the_adapter_retrains(job, change):
    trainer = FakeTrainer()
    train_or_reuse(job, "hf", trainer)
    assert not train_or_reuse(change(job), "hf", trainer).reused and trainer.runs == 2


def test_changed_data_a_changed_base_model_or_another_backend_retrains(job):
    trainer = FakeTrainer()
    train_or_reuse(job, "hf", trainer)
    job.dataset.write_text(job.dataset.read_text().replace("plus", "and"))
    assert not train_or_reuse(job, "hf", trainer).reused
    (Path(job.base_model) / "tokenizer_config.json").write_text('{"chat_template": "b"}')
    assert not train_or_reuse(job, "hf", trainer).reused
    assert not train_or_reuse(job, "trl", trainer).reused
    assert trainer.runs == 4


def test_index_settings_and_the_gpu_number_do_not_retrain(job):
    trainer = FakeTrainer()
    train_or_reuse(dataclasses.replace(job, device="cuda:0"), "hf", trainer)
    other = dataclasses.replace(job, device="cuda:1", config=with_overrides(job.config, ["grads.batch_size=2"]))
    assert train_or_reuse(other, "hf", trainer).reused and trainer.runs == 1


def test_a_damaged_key_or_a_missing_adapter_file_retrains(job):
    trainer = FakeTrainer()
    train_or_reuse(job, "hf", trainer)
    (job.out / KEY_FILE).write_text("{not json")
    assert not train_or_reuse(job, "hf", trainer).reused
    (job.out / ADAPTER_DIR / ADAPTER_FILES[1]).unlink()
    assert not train_or_reuse(job, "hf", trainer).reused and trainer.runs == 3


def test_a_run_that_fails_leaves_no_key_so_the_old_adapter_is_not_taken_for_it(job):
    trainer = FakeTrainer()
    train_or_reuse(job, "hf", trainer)

    def interrupted(job, backend):
        assert not (job.out / KEY_FILE).exists()  # gone before training starts
        raise KeyboardInterrupt

    other = dataclasses.replace(job, config=with_overrides(job.config, ["train.seed=1"]))
    with pytest.raises(KeyboardInterrupt):
        train_or_reuse(other, "hf", interrupted)
    assert not (job.out / KEY_FILE).exists()  # out/ may hold half of the other run now
    assert not train_or_reuse(job, "hf", trainer).reused


def test_the_key_records_what_it_was_made_of(job):
    train_or_reuse(job, "hf", FakeTrainer())
    record = json.loads((job.out / KEY_FILE).read_text())
    assert record["inputs"] == adapter_key(job, "hf")
    assert record["inputs"]["encoding"] == {"loss_mask": "assistant", "pairs": "template"}
    assert record["inputs"]["train"]["seed"] == 0
    assert set(record["inputs"]["base_model"]["files"]) == {"config.json", "tokenizer_config.json"}
    assert record["result"]["steps"] == 3


def test_a_training_run_in_another_dtype_or_device_type_is_not_reused(job):
    def key(placement):
        return adapter_key(dataclasses.replace(job, device=placement.device, dtype=placement.dtype), "hf")

    assert key(Placement("cpu", "bfloat16")) != key(Placement("cpu", "float32"))
    assert key(Placement("cuda:0", "float32")) != key(Placement("cpu", "float32"))
    assert key(Placement("cuda:0", "float32")) == key(Placement("cuda:1", "float32"))  # the GPU's number is not kept
