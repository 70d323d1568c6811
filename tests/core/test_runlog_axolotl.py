"""The axolotl reader: its YAML (a file, or the block in the model card) over the Trainer files underneath."""

from __future__ import annotations

import shutil

import pytest

from gradian.runs import read_run

AXOLOTL_YAML = """base_model: HuggingFaceTB/SmolLM2-135M-Instruct
datasets:
  - path: data.jsonl
    type: chat_template
adapter: qlora
load_in_4bit: true
sequence_len: 2048
sample_packing: true
flash_attention: false
train_on_inputs: true
lora_r: 16
lora_alpha: 8
lora_dropout: 0.05
lora_target_linear: true
learning_rate: 2e-4
num_epochs: 4
micro_batch_size: 4
gradient_accumulation_steps: 8
warmup_ratio: 0.03
val_set_size: 0
max_grad_norm: 1.0
lr_scheduler: cosine
bf16: true
"""

MODEL_CARD = f"""---
library_name: peft
---

[<img src="https://raw.githubusercontent.com/axolotl-ai-cloud/axolotl/main/image/axolotl-badge-web.png" alt="Built with Axolotl"/>](https://github.com/axolotl-ai-cloud/axolotl)
<details><summary>See axolotl config</summary>

axolotl version: `0.9.1`
```yaml
{AXOLOTL_YAML}
```

</details><br>
"""


@pytest.fixture(scope="module")
def real():
    from tests.checks.run_fixtures import real_runs

    return real_runs()


def check_config(cfg):
    assert (cfg.framework, cfg.finetuning_type, cfg.max_length, cfg.learning_rate) == ("axolotl", "qlora", 2048, 2e-4)
    assert (cfg.packing, cfg.packing_strategy, cfg.padding_free, cfg.loss_mask) == (True, "multipack", False, "all")
    assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules) == (16, 8.0, ("all-linear",))
    assert (cfg.num_epochs, cfg.per_device_batch_size, cfg.gradient_accumulation_steps) == (4, 4, 8)
    assert (cfg.val_set_size, cfg.eval_strategy, cfg.lr_scheduler, cfg.precision) == (0.0, "no", "cosine", "bf16")


def test_yaml_file_over_trainer_logs(real, tmp_path):
    run = shutil.copytree(real.healthy_run, tmp_path / "run")
    (run / "config.yml").write_text(AXOLOTL_YAML)
    artifact = read_run(run)
    assert artifact.reader == "axolotl"
    check_config(artifact.config)
    assert artifact.sources["learning_rate"] == f"{run / 'config.yml'}:1"
    assert len([p for p in artifact.metrics if p.loss is not None]) == 42  # the logs come from trainer_state.json
    assert artifact.config.seed == 0  # what the YAML leaves out comes from training_args.bin


def test_yaml_recovered_from_the_model_card(real, tmp_path):
    run = shutil.copytree(real.healthy_run, tmp_path / "run")
    (run / "README.md").write_text(MODEL_CARD)
    artifact = read_run(run)
    assert artifact.reader == "axolotl"
    check_config(artifact.config)
    assert artifact.sources["axolotl_config"] == f"{run / 'README.md'}:10"


def test_a_plain_yaml_is_not_taken_for_axolotl(tmp_path):
    (tmp_path / "notes.yaml").write_text("title: my notes\nitems: [1, 2]\n")
    from gradian.runs import axolotl

    assert axolotl.sniff(tmp_path) == 0.0
