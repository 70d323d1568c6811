"""The Hugging Face Trainer reader on a dir the real Trainer wrote, its checkpoint and README fallbacks, TRL names."""

from __future__ import annotations

import io
import json
import pickle
import shutil
import zipfile
from pathlib import Path

import pytest

from gradian.errors import RunDirError
from gradian.runs import hf_trainer, read_run

README = """---
library_name: peft
---

# tiny

## Training procedure

### Training hyperparameters

The following hyperparameters were used during training:
- learning_rate: 0.0002
- train_batch_size: 4
- eval_batch_size: 8
- seed: 42
- gradient_accumulation_steps: 2
- total_train_batch_size: 8
- optimizer: Use OptimizerNames.ADAMW_TORCH_FUSED with betas=(0.9,0.999) and epsilon=1e-08
- lr_scheduler_type: cosine
- lr_scheduler_warmup_steps: 5
- training_steps: 60

### Training results

| Training Loss | Epoch | Step | Validation Loss |
|:-------------:|:-----:|:----:|:---------------:|
| 2.1234        | 0.5   | 20   | 2.0011          |
| 1.8765        | 1.0   | 40   | 1.9012          |
| No log        | 1.5   | 60   | 1.8500          |

### Framework versions

- PEFT 0.21.2
- Transformers 5.24.0
"""


@pytest.fixture(scope="module")
def real():
    from tests.checks.run_fixtures import real_runs

    return real_runs()


class SFTConfig:
    """Stands in for trl's SFTConfig; pickled under trl's module name without importing trl."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def trl_pickle(fields: dict, *, zipped: bool) -> bytes:
    """A pickle of an object whose class is trl.trainer.sft_config.SFTConfig, optionally in torch.save's zip layout."""
    data = pickle.dumps(SFTConfig(**fields), protocol=2)
    data = data.replace(f"{__name__}\nSFTConfig\n".encode(), b"trl.trainer.sft_config\nSFTConfig\n")
    if not zipped:
        return data
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("training_args/data.pkl", data)
        archive.writestr("training_args/version", "3\n")
    return buffer.getvalue()


BASE_ARGS = {"output_dir": "out", "learning_rate": 1e-4, "per_device_train_batch_size": 2, "max_grad_norm": 1.0,
             "num_train_epochs": 1.0, "max_steps": -1, "warmup_steps": 0, "lr_scheduler_type": "linear",
             "dataset_text_field": "text", "packing": False}


def test_reads_a_dir_the_real_trainer_wrote(real):
    artifact = read_run(real.healthy_run)
    cfg = artifact.config
    assert artifact.reader == "hf-trainer"
    assert (cfg.learning_rate, cfg.lr_scheduler, cfg.per_device_batch_size, cfg.max_grad_norm) == (4e-4, "linear", 2, 1.0)
    assert (cfg.lora_r, cfg.lora_alpha, cfg.finetuning_type, cfg.framework) == (8, 32.0, "lora", "transformers")
    assert set(cfg.lora_target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert artifact.finished is True and artifact.global_step == cfg.max_steps == 42
    train = [p for p in artifact.metrics if p.loss is not None]
    evals = [p for p in artifact.metrics if p.eval_loss is not None]
    assert [p.step for p in train] == list(range(1, 43)) and len(evals) == 3
    assert all(p.grad_norm is not None and p.learning_rate is not None for p in train)
    assert artifact.sources["learning_rate"].endswith("training_args.bin")
    assert artifact.adapter_dir == real.healthy_run and artifact.adapter_config["r"] == 8
    # Evidence lines point at the entry's "step" line in trainer_state.json.
    lines = (real.healthy_run / "trainer_state.json").read_text().splitlines()
    assert all(f'"step": {p.step}' in lines[p.line - 1] for p in artifact.metrics)


def test_latest_checkpoint_is_read_when_the_top_level_state_is_missing(real, tmp_path):
    run = shutil.copytree(real.healthy_run, tmp_path / "run")
    (run / "trainer_state.json").unlink()
    (run / "training_args.bin").unlink()
    latest = hf_trainer.checkpoints(run)[-1]
    artifact = read_run(run)
    assert artifact.sources["metrics"] == str(latest / "trainer_state.json")
    assert artifact.sources["learning_rate"] == str(latest / "training_args.bin")
    assert artifact.sources["trainer_state.json"] == str(latest / "trainer_state.json")
    # save_state() was never called, but the latest checkpoint is at the planned last step: the run finished.
    assert artifact.global_step == int(latest.name.split("-")[1]) == artifact.config.max_steps
    assert artifact.finished is True


def test_a_checkpoint_before_the_last_step_is_unfinished(real, tmp_path):
    run = shutil.copytree(real.faulty_run, tmp_path / "run")  # stopped at step 30 of 108, checkpoints every 10
    (run / "trainer_state.json").unlink()
    artifact = read_run(run)
    assert artifact.finished is False and artifact.global_step == 30
    assert artifact.sources["trainer_state.json"] == str(run / "checkpoint-30" / "trainer_state.json")


def test_the_latest_checkpoint_is_the_highest_number_not_the_last_name(real, tmp_path):
    run = tmp_path / "run"
    state = json.loads((real.healthy_run / "trainer_state.json").read_text())
    for step in (9, 10):  # "checkpoint-9" sorts after "checkpoint-10" as a string
        (run / f"checkpoint-{step}").mkdir(parents=True)
        partial = {**state, "global_step": step, "log_history": [e for e in state["log_history"] if e.get("step", 0) <= step
                                                                 and "train_runtime" not in e]}
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps(partial, indent=2))
    artifact = read_run(run)
    assert artifact.global_step == 10
    assert artifact.sources["trainer_state.json"] == str(run / "checkpoint-10" / "trainer_state.json")


def test_readme_training_hyperparameters_are_the_fallback(tmp_path):
    (tmp_path / "README.md").write_text(README, encoding="utf-8")
    artifact = read_run(tmp_path)
    cfg = artifact.config
    assert (cfg.learning_rate, cfg.per_device_batch_size, cfg.gradient_accumulation_steps) == (2e-4, 4, 2)
    assert (cfg.lr_scheduler, cfg.warmup_steps, cfg.max_steps, cfg.seed) == ("cosine", 5, 60, 42)
    assert artifact.sources["learning_rate"] == f"{tmp_path / 'README.md'}:12"
    assert [(p.step, p.loss, p.eval_loss) for p in artifact.metrics] == [(20, 2.1234, 2.0011), (40, 1.8765, 1.9012), (60, None, 1.85)]
    assert artifact.framework_versions == {"PEFT": "0.21.2", "Transformers": "5.24.0"}


@pytest.mark.parametrize("zipped", [False, True])
def test_trl_new_names(tmp_path, zipped):
    fields = {**BASE_ARGS, "max_length": 2048, "completion_only_loss": False, "assistant_only_loss": False,
              "packing": True, "packing_strategy": "wrapped", "padding_free": False}
    (tmp_path / "training_args.bin").write_bytes(trl_pickle(fields, zipped=zipped))
    cfg = read_run(tmp_path).config
    assert (cfg.framework, cfg.max_length, cfg.loss_mask) == ("trl", 2048, "all")
    assert (cfg.packing, cfg.packing_strategy, cfg.padding_free) == (True, "wrapped", False)


def test_trl_old_names(tmp_path):
    fields = {**BASE_ARGS, "max_seq_length": 512, "warmup_ratio": 0.03}
    (tmp_path / "training_args.bin").write_bytes(trl_pickle(fields, zipped=True))
    cfg = read_run(tmp_path).config
    assert (cfg.framework, cfg.max_length, cfg.warmup_ratio, cfg.loss_mask) == ("trl", 512, 0.03, None)


def test_trl_assistant_only_loss_and_transformers5_warmup_ratio(tmp_path):
    fields = {**BASE_ARGS, "assistant_only_loss": True, "completion_only_loss": None, "warmup_steps": 0.1}
    (tmp_path / "training_args.bin").write_bytes(trl_pickle(fields, zipped=False))
    cfg = read_run(tmp_path).config
    assert (cfg.loss_mask, cfg.warmup_ratio, cfg.warmup_steps) == ("assistant_only", 0.1, None)


def test_truncated_trainer_state_is_an_error_with_file_and_line(real, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    text = (real.healthy_run / "trainer_state.json").read_text()
    (run / "trainer_state.json").write_text(text[: len(text) // 2])
    with pytest.raises(RunDirError) as caught:
        read_run(run)
    line = text[: len(text) // 2].count("\n") + 1
    assert f"trainer_state.json:{line}: not valid JSON" in caught.value.message


def test_a_pickle_that_is_not_training_arguments_is_an_error(tmp_path):
    (tmp_path / "training_args.bin").write_bytes(pickle.dumps({"learning_rate": 1e-4}))
    with pytest.raises(RunDirError, match="holds a dict, not a TrainingArguments"):
        read_run(tmp_path)
    (tmp_path / "training_args.bin").write_bytes(b"\x80\x04garbage")
    with pytest.raises(RunDirError, match="not a readable pickle"):
        read_run(tmp_path)


def test_real_training_args_bin_is_torch_zip_and_reads_without_torch_load(real):
    from gradian.runs.restricted_unpickler import load_restricted

    path = real.healthy_run / "training_args.bin"
    assert zipfile.is_zipfile(path)
    args, qualname = hf_trainer.read_training_args(path)
    assert qualname == "transformers.training_args.TrainingArguments"
    assert args["learning_rate"] == 4e-4 and args["lr_scheduler_type"] == "linear"  # enum reduced to its value
    assert type(load_restricted(path)).__module__.startswith("pickled.")  # a stub, never the real class
    json.dumps(args)  # plain data all the way down


def test_sniff_prefers_top_level_state(real, tmp_path):
    assert hf_trainer.sniff(real.healthy_run) == 0.8
    assert hf_trainer.sniff(Path(tmp_path)) == 0.0


def test_gradian_train_layout_config_and_sibling_adapter(real, tmp_path):
    """`gradian train` writes out/run (Trainer files + gradian-train.yaml) next to out/adapter."""
    import yaml

    from gradian.config import GradianConfig

    out = tmp_path / "out"
    run = shutil.copytree(real.healthy_run, out / "run", ignore=shutil.ignore_patterns("adapter_*", "checkpoint-*"))
    adapter = out / "adapter"
    adapter.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(real.healthy_run / name, adapter / name)
    config = GradianConfig().to_dict()
    config["train"].update(max_seq_length=512, lora_r=8, lora_alpha=32.0, target_modules=["q_proj", "down_proj"])
    (run / "gradian-train.yaml").write_text(yaml.safe_dump(config))
    (run / "gradian-job.json").write_text(json.dumps({"backend": "hf"}))
    artifact = read_run(run)
    cfg = artifact.config
    assert (cfg.framework, cfg.loss_mask, cfg.max_length, cfg.lora_target_modules) == ("gradian", "assistant_only", 512, ("q_proj", "down_proj"))
    assert artifact.sources["max_length"] == str(run / "gradian-train.yaml")
    assert artifact.adapter_dir == adapter
