"""grads.loss_mask auto follows the run next to the adapter; Alpaca system/history and ShareGPT system are rendered."""

from __future__ import annotations

import json

import pytest
import yaml

from gradian.data import encode, load_dataset
from gradian.runs.training_format import loss_mask_for, read_run_of_adapter
from tests.support.tiny import tiny_tokenizer


def _adapter_in(directory):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "peft_type": "LORA"}))
    return directory


@pytest.mark.parametrize(("train_on_inputs", "mask"), [(True, "all"), (False, "assistant")])
def test_auto_follows_axolotl_train_on_inputs(tmp_path, train_on_inputs, mask):
    run = tmp_path / "axolotl-out"
    adapter = _adapter_in(run)
    config = {"base_model": "tiny", "sequence_len": 512, "micro_batch_size": 2, "train_on_inputs": train_on_inputs,
              "datasets": [{"path": "data.jsonl", "type": "chat_template"}], "chat_template": "chatml"}
    (run / "config.yml").write_text(yaml.safe_dump(config))
    (run / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1, "loss": 2.0}], "global_step": 1}))

    artifact = read_run_of_adapter(adapter)
    assert (artifact.reader, artifact.config.chat_template, artifact.config.dataset_type) == ("axolotl", "chatml", "chat_template")
    assert loss_mask_for("auto", artifact, []).mode == mask


@pytest.mark.parametrize(("train_on_prompt", "mask"), [(True, "all"), (False, "assistant")])
def test_auto_follows_llamafactory_train_on_prompt_from_a_checkpoint_adapter(tmp_path, train_on_prompt, mask):
    run = tmp_path / "saves"
    adapter = _adapter_in(run / "checkpoint-10")
    config = {"stage": "sft", "finetuning_type": "lora", "template": "qwen", "cutoff_len": 1024,
              "train_on_prompt": train_on_prompt}
    (run / "training_args.yaml").write_text(yaml.safe_dump(config))
    (run / "trainer_log.jsonl").write_text(json.dumps({"current_steps": 10, "total_steps": 10, "loss": 1.0}) + "\n")

    artifact = read_run_of_adapter(adapter)
    assert (artifact.reader, artifact.config.chat_template) == ("llamafactory", "qwen")
    assert loss_mask_for("auto", artifact, []).mode == mask
    assert loss_mask_for("completion", artifact, []).mode == "completion"  # an explicit setting wins


def test_without_a_run_auto_is_the_assistant_mask(tmp_path):
    assert read_run_of_adapter(_adapter_in(tmp_path / "adapter")) is None
    assert loss_mask_for("auto", None, []).mode == "assistant"


def test_alpaca_system_and_history_and_sharegpt_system_are_rendered_and_supervised(tmp_path):
    rows = [{"instruction": "And Italy?", "output": "Rome.", "system": "Be brief.",
             "history": [["Capital of France?", "Paris."]]},
            {"conversations": [{"from": "human", "value": "Capital of Japan?"}, {"from": "gpt", "value": "Tokyo."}],
             "system": "You know capitals."}]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    alpaca, sharegpt = load_dataset(path)
    tokenizer = tiny_tokenizer("chatml")

    rendered = tokenizer.decode(encode(alpaca, tokenizer, 512).input_ids)
    assert rendered.startswith("<|im_start|>system\nBe brief.<|im_end|>") and "Capital of France?" in rendered
    supervised = tokenizer.decode([t for t in encode(alpaca, tokenizer, 512).labels if t != -100])
    assert supervised == "Paris.<|im_end|>Rome.<|im_end|>"  # the history's answer is trained on too
    assert tokenizer.decode(encode(sharegpt, tokenizer, 512).input_ids).startswith("<|im_start|>system\nYou know capitals.")


def test_the_masks_cover_assistant_turns_completion_or_everything(tmp_path):
    path = tmp_path / "data.jsonl"
    row = {"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."},
                        {"role": "user", "content": "And Italy?"}, {"role": "assistant", "content": "Rome."}]}
    path.write_text(json.dumps(row) + "\n")
    [example] = load_dataset(path)
    tokenizer = tiny_tokenizer("chatml")

    def supervised(mask):
        return tokenizer.decode([t for t in encode(example, tokenizer, 512, mask).labels if t != -100])

    assert supervised("assistant") == "Paris.<|im_end|>Rome.<|im_end|>"
    assert supervised("completion") == "Rome.<|im_end|>\n"
    full = encode(example, tokenizer, 512, "all")
    assert supervised("all") == tokenizer.decode(full.input_ids[1:])  # position 0 is never predicted
    assert full.tokens_for_chars(0, 4) != (0, 0)  # the answer's characters still map onto tokens
