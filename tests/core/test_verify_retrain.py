"""The models a check trains: a real hf run, reused when an identical one already finished, retrained when not."""

from __future__ import annotations

import json

import pytest

from gradian.config import load_config
from gradian.counterfactual.retrain import train_model
from gradian.data import load_dataset
from gradian.training.reuse import KEY_FILE
from tests.trainer_hf.chat_data import QUICK, write_chat_dataset


@pytest.mark.slow
def test_an_identical_model_is_reused_and_a_changed_one_retrained(tiny_base_dir, tmp_path):
    dataset = write_chat_dataset(tmp_path / "train.jsonl")
    data = load_dataset(dataset)
    config = load_config(None, list(QUICK))
    kwargs = {"base_model": str(tiny_base_dir), "dataset": dataset, "config": config}
    first = train_model("dropped", tmp_path / "m", drop_ids=data.ids[:2], **kwargs)
    assert not first.reused and first.steps == 3 and first.dropped == 2
    assert (first.adapter_dir / "adapter_model.safetensors").is_file()
    job = json.loads((first.run_dir / "gradian-job.json").read_text())
    assert job["drop_ids"] == sorted(data.ids[:2])
    weights = (first.adapter_dir / "adapter_model.safetensors").read_bytes()

    again = train_model("dropped", tmp_path / "m", drop_ids=reversed(data.ids[:2]), **kwargs)
    assert again.reused and again.adapter_dir == first.adapter_dir and again.steps == 3

    other = train_model("dropped", tmp_path / "m", drop_ids=data.ids[2:4], **kwargs)
    assert not other.reused
    assert (other.adapter_dir / "adapter_model.safetensors").read_bytes() != weights
    assert json.loads((tmp_path / "m" / KEY_FILE).read_text())["inputs"]["drop_ids"] == sorted(data.ids[2:4])


def test_ids_continue_across_extra_datasets_so_a_drop_hits_one_row(tmp_path):
    from gradian.pipelines.train import make_job
    from gradian.training.data import training_examples

    dataset = write_chat_dataset(tmp_path / "train.jsonl", n=3)
    ids = load_dataset(dataset).ids
    job = make_job("tiny", dataset, tmp_path / "out", extra_datasets=[dataset], drop_ids=[ids[0]])
    kept, dropped = training_examples(job)
    assert dropped == (ids[0],)  # the same row in the extra copy is ex-000003-..., not a second ex-000000-...
    assert [e.id[:9] for e in kept] == [f"ex-{i:06d}" for i in range(1, 6)]
    assert kept[2].id.endswith(ids[0][-8:])
