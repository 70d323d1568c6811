"""The trl backend: SFTTrainer on gradian's encoded data, and the mask check that refuses a different mask."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gradian.config import load_config
from gradian.errors import TrainingError
from gradian.pipelines.train import make_job, run_training
from gradian.training.output import staged_output
from tests.trainer_hf.chat_data import QUICK, write_chat_dataset

pytest.importorskip("trl")


@pytest.fixture
def job(tiny_base_dir, tmp_path):
    dataset = write_chat_dataset(tmp_path / "train.jsonl")
    return make_job(str(tiny_base_dir), dataset, tmp_path / "out", load_config(None, list(QUICK)))


def _train_with(job, **backend_kwargs):
    from gradian_trainer_trl.backend import TRLTrainer

    with staged_output(job.out) as staged:
        return TRLTrainer(**backend_kwargs).train(dataclasses.replace(job, out=staged.staging))


def test_trains_on_gradian_labels_and_writes_the_layout(job):
    result = run_training(job, "trl")

    assert result.backend == "trl" and result.steps == 3 and result.final_loss > 0
    assert (job.out / "adapter" / "adapter_model.safetensors").is_file()
    state = json.loads((job.out / "run" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2, 3]
    assert (job.out / "run" / "training_args.bin").is_file()


def test_trl_building_the_same_mask_from_a_completion_mask_passes(job):
    result = _train_with(job, mask_column="completion_mask", sft_overrides={"completion_only_loss": True})
    assert result.steps == 3
    assert (job.out / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("overrides", [{"completion_only_loss": False}, {}], ids=["whole-sequence", "trl-default"])
def test_a_different_trl_mask_is_refused_before_training(job, overrides):
    """Pre-tokenized data with a completion_mask: trl's default trains on every token, not gradian's mask."""
    with pytest.raises(TrainingError) as caught:
        _train_with(job, mask_column="completion_mask", sft_overrides=overrides)

    message = caught.value.one_line()
    assert "different loss mask than gradian's encode() in 12 of 12 examples" in message
    assert "0 missing" in message and "extra" in message
    assert "\n" not in message
    assert not job.out.exists()  # refused at start: nothing trained, nothing published


def test_the_check_compares_trl_collated_labels_token_by_token(job):
    """Dropping one supervised token from what trl sees is enough to refuse."""
    from gradian.model.base import load_base_model
    from gradian.training.data import EncodedExample, EncodedSet, encode_training_set
    from gradian_trainer_trl.backend import TRLTrainer, check_trl_mask

    model, tokenizer = load_base_model(job.base_model)
    encoded = encode_training_set(job, tokenizer)
    first = encoded.examples[0]
    supervised = [i for i, label in enumerate(first.labels) if label != -100]
    labels = list(first.labels)
    labels[supervised[0]] = -100
    altered = EncodedSet((EncodedExample(first.id, first.input_ids, tuple(labels)), *encoded.examples[1:]))

    trainer = TRLTrainer().build(job, model, tokenizer, altered, job.out / "run")
    check_trl_mask(trainer, altered)  # trl trains on exactly what it was given
    with pytest.raises(TrainingError, match=r"in 1 of 12 examples \(first: " + first.id + r".*1 missing"):
        check_trl_mask(trainer, encoded)
