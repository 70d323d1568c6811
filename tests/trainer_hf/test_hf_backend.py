"""The hf backend: transformers.Trainer on gradian's encoded data, the output layout, determinism."""

from __future__ import annotations

import json

import pytest

from gradian.config import load_config
from gradian.errors import ConfigError, DatasetError
from gradian.pipelines.train import make_job, run_training
from tests.trainer_hf.chat_data import QUICK, write_chat_dataset


@pytest.fixture
def dataset(tmp_path):
    return write_chat_dataset(tmp_path / "train.jsonl")


def _train(tiny_base_dir, dataset, out, *overrides, **job_kwargs):
    cfg = load_config(None, [*QUICK, *overrides])
    return run_training(make_job(str(tiny_base_dir), dataset, out, cfg, **job_kwargs), "hf")


def test_writes_a_peft_adapter_and_an_hf_run_dir(tiny_base_dir, dataset, tmp_path):
    out = tmp_path / "out"
    result = _train(tiny_base_dir, dataset, out, "train.use_rslora=true", "train.lora_alpha=8")

    assert result.adapter_dir == out / "adapter" and result.run_dir == out / "run"
    assert result.steps == 3 and result.backend == "hf" and result.final_loss > 0
    adapter_config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert (out / "adapter" / "adapter_model.safetensors").stat().st_size > 0
    assert adapter_config["r"] == 4 and adapter_config["lora_alpha"] == 8 and adapter_config["use_rslora"] is True
    assert sorted(adapter_config["target_modules"]) == ["q_proj", "v_proj"]
    assert adapter_config["base_model_name_or_path"] == str(tiny_base_dir.resolve())

    state = json.loads((out / "run" / "trainer_state.json").read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert state["global_step"] == 3 and len(losses) == 3 and losses[-1] == pytest.approx(result.final_loss)
    assert (out / "run" / "training_args.bin").is_file()
    assert (out / "run" / "checkpoint-3" / "optimizer.pt").is_file()  # Adam moments, for the adam preconditioner
    assert load_config(out / "run" / "gradian-train.yaml").train == load_config(None, [*QUICK, "train.use_rslora=true", "train.lora_alpha=8"]).train
    assert not [p for p in out.iterdir() if p.name.startswith(".partial")]


@pytest.mark.slow  # three short training runs
def test_the_same_command_twice_gives_byte_identical_adapter_weights(tiny_base_dir, dataset, tmp_path):
    first = _train(tiny_base_dir, dataset, tmp_path / "a")
    second = _train(tiny_base_dir, dataset, tmp_path / "b")
    other_seed = _train(tiny_base_dir, dataset, tmp_path / "c", "train.seed=1")

    weights = [r.adapter_dir / "adapter_model.safetensors" for r in (first, second, other_seed)]
    assert weights[0].read_bytes() == weights[1].read_bytes()
    assert weights[0].read_bytes() != weights[2].read_bytes()
    assert first.final_loss == second.final_loss


def test_training_follows_gradian_mask(tiny_base_dir, dataset, tmp_path):
    """The labels the Trainer sees are exactly encode()'s: padding -100, same supervised tokens."""
    from transformers import AutoTokenizer

    from gradian.data import encode, load_dataset
    from gradian.training.data import EncodedDataset, PaddingCollator, encode_training_set

    job = make_job(str(tiny_base_dir), dataset, tmp_path / "out", load_config(None, list(QUICK)))
    tokenizer = AutoTokenizer.from_pretrained(tiny_base_dir)
    encoded = encode_training_set(job, tokenizer)
    batch = PaddingCollator(tokenizer.pad_token_id)([EncodedDataset(encoded)[i] for i in range(3)])
    for row, example in enumerate(list(load_dataset(dataset))[:3]):
        ours = encode(example, tokenizer, job.config.train.max_seq_length)
        n = len(ours.input_ids)
        assert batch["labels"][row, :n].tolist() == list(ours.labels)
        assert set(batch["labels"][row, n:].tolist()) <= {-100}
        assert batch["attention_mask"][row].sum().item() == n


def test_training_follows_grads_loss_mask_as_verify_retraining_needs(tiny_base_dir, dataset, tmp_path):
    """With grads.loss_mask=all (a report of a run trained on every token), training supervises the prompts too."""
    from transformers import AutoTokenizer

    from gradian.data import encode, load_dataset
    from gradian.training.data import encode_training_set

    tokenizer = AutoTokenizer.from_pretrained(tiny_base_dir)
    example = list(load_dataset(dataset))[0]
    supervised = {}
    for mask in ("auto", "all"):
        job = make_job(str(tiny_base_dir), dataset, tmp_path / mask, load_config(None, [*QUICK, f"grads.loss_mask={mask}"]))
        first = encode_training_set(job, tokenizer).examples[0]
        expected = encode(example, tokenizer, job.config.train.max_seq_length, "assistant" if mask == "auto" else mask)
        assert list(first.labels) == list(expected.labels)
        supervised[mask] = first.supervised_tokens
    assert supervised["all"] > supervised["auto"] > 0


def test_dropping_examples_and_unknown_drop_ids(tiny_base_dir, dataset, tmp_path):
    from gradian.data import load_dataset

    ids = load_dataset(dataset).ids
    result = _train(tiny_base_dir, dataset, tmp_path / "dropped", drop_ids=ids[:4])
    job_record = json.loads((result.run_dir / "gradian-job.json").read_text())
    assert job_record["drop_ids"] == sorted(ids[:4])
    assert "dropped 4 examples as asked" in result.notes

    with pytest.raises(DatasetError, match="not in"):
        _train(tiny_base_dir, dataset, tmp_path / "bad", drop_ids=["ex-999999-deadbeef"])


def test_a_failed_run_leaves_no_adapter_behind(tiny_base_dir, dataset, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="target_modules"):
        _train(tiny_base_dir, dataset, out, "train.target_modules=no_such_proj")
    assert not out.exists()  # it did not exist before the run, so nothing is left


def test_overwrite_replaces_an_earlier_run(tiny_base_dir, dataset, tmp_path):
    from gradian.errors import TrainingError

    out = tmp_path / "out"
    _train(tiny_base_dir, dataset, out)
    with pytest.raises(TrainingError, match="already holds"):
        _train(tiny_base_dir, dataset, out)
    cfg = load_config(None, [*QUICK, "train.max_steps=2"])
    result = run_training(make_job(str(tiny_base_dir), dataset, out, cfg), "hf", overwrite=True)
    assert result.steps == 2
    assert json.loads((out / "run" / "trainer_state.json").read_text())["global_step"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["adapter", "run"]
