"""The LLaMA-Factory reader: trainer_log.jsonl (it survives a crash) + its YAML config."""

from __future__ import annotations

import json

from gradian.runs import read_run

CONFIG = """model_name_or_path: HuggingFaceTB/SmolLM2-135M-Instruct
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: q_proj,v_proj
dataset: alpaca_en_demo
template: llama3
cutoff_len: 1024
train_on_prompt: false
packing: true
neat_packing: false
per_device_train_batch_size: 2
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
val_size: 0.1
"""


def write_run(run, lines, total=10):
    run.mkdir(parents=True, exist_ok=True)
    (run / "training_args.yaml").write_text(CONFIG)
    entries = []
    for step, loss in lines:
        entries.append({"current_steps": step, "total_steps": total, "loss": loss, "lr": 1e-4 * (1 - step / total),
                        "epoch": step * 0.3, "percentage": step * 10.0, "elapsed_time": "0:00:01", "remaining_time": "0:00:09"})
    entries.append({"current_steps": lines[-1][0], "total_steps": total, "eval_loss": 1.5, "epoch": lines[-1][0] * 0.3})
    (run / "trainer_log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    return run


def test_trainer_log_and_config(tmp_path):
    run = write_run(tmp_path / "run", [(1, 2.0), (2, 1.9), (3, 1.8)])
    artifact = read_run(run)
    cfg = artifact.config
    assert artifact.reader == "llamafactory"
    assert (cfg.framework, cfg.finetuning_type, cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules) == (
        "llamafactory", "lora", 8, 16.0, ("q_proj", "v_proj"))
    assert (cfg.max_length, cfg.loss_mask, cfg.packing, cfg.padding_free, cfg.packing_strategy) == (1024, "completion_only", True, False, "concat")
    assert (cfg.learning_rate, cfg.val_set_size, cfg.max_steps, cfg.precision) == (1e-4, 0.1, 10, "bf16")
    train = [p for p in artifact.metrics if p.loss is not None]
    assert [(p.step, p.loss, p.line) for p in train] == [(1, 2.0, 1), (2, 1.9, 2), (3, 1.8, 3)]
    assert train[1].learning_rate == 1e-4 * 0.8  # "lr" is the learning rate
    assert artifact.metrics[-1].eval_loss == 1.5
    assert artifact.global_step == 3 and artifact.finished is False  # crashed at step 3 of 10


def test_finished_run(tmp_path):
    run = write_run(tmp_path / "run", [(s, 2.0 - s / 10) for s in range(1, 11)])
    (run / "train_results.json").write_text(json.dumps({"train_runtime": 12.0}))
    artifact = read_run(run)
    assert artifact.finished is True and artifact.global_step == 10


def test_train_on_prompt_and_neat_packing(tmp_path):
    run = write_run(tmp_path / "run", [(1, 2.0)])
    (run / "training_args.yaml").write_text(CONFIG.replace("train_on_prompt: false", "train_on_prompt: true")
                                            .replace("neat_packing: false", "neat_packing: true"))
    cfg = read_run(run).config
    assert (cfg.loss_mask, cfg.padding_free, cfg.packing_strategy) == ("all", True, "neat_packing")
