"""Loss equality on real runs: the loss a trainer logged for a batch against Gradian's per-example loss on it.

Each run trains the whole dataset as one batch for two steps and saves a checkpoint after each, so the loss it
logs at step 2 is the token-mean loss of every example under checkpoint-1's adapter; Gradian loads that adapter
the way ``gradian index`` does (tokenizer and chat template resolved from the run, grads.loss_mask auto) and
sums its per-example losses over the same tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ChatML with {% generation %} around what the assistant learns (content and <|im_end|>), and a system default:
# a template other than the base's, saved by the trainer into its checkpoints.
GENERATION_CHATML = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are brief.<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

MESSAGES_ROWS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "The capital of France is Paris."}]},
    {"messages": [{"role": "system", "content": "Answer in one short sentence."},
                  {"role": "user", "content": "What is two plus two?"},
                  {"role": "assistant", "content": "Two plus two is four."},
                  {"role": "user", "content": "And the capital of Italy?"},
                  {"role": "assistant", "content": "Rome is the capital of Italy."}]},
    {"messages": [{"role": "user", "content": "Which city is the capital of Japan?"},
                  {"role": "assistant", "content": "Tokyo is the capital of Japan."}]},
]
PROMPT_COMPLETION_ROWS = [
    {"prompt": [{"role": "user", "content": "What is the capital of Spain?"}],
     "completion": [{"role": "assistant", "content": "The capital of Spain is Madrid."}]},
    {"prompt": [{"role": "system", "content": "Answer in one short sentence."},
                {"role": "user", "content": "What is seven times six?"}],
     "completion": [{"role": "assistant", "content": "Seven times six is forty-two."}]},
    {"prompt": [{"role": "user", "content": "Which city is the capital of Canada?"}],
     "completion": [{"role": "assistant", "content": "Ottawa is the capital of Canada."}]},
]
# TRL's standard (non-conversational) prompt/completion: two strings, tokenized raw with no chat template.
PLAIN_PROMPT_COMPLETION_ROWS = [
    {"prompt": "Question: What is the capital of Spain?\nAnswer:", "completion": " The capital of Spain is Madrid."},
    {"prompt": "Question: What is seven times six?\nAnswer:", "completion": " Seven times six is forty-two."},
    {"prompt": "Translate to French: good morning\n", "completion": "bonjour"},
]
# Alpaca with system and history, and ShareGPT with a top-level system: what the user's script turns into messages.
ALPACA_SHAREGPT_ROWS = [
    {"instruction": "And the capital of Germany?", "input": "", "output": "Berlin is the capital of Germany.",
     "system": "Answer in one short sentence.",
     "history": [["What is the capital of Portugal?", "Lisbon is the capital of Portugal."]]},
    {"conversations": [{"from": "human", "value": "What is the capital of England?"},
                       {"from": "gpt", "value": "London is the capital of England."}],
     "system": "You answer questions about capitals."},
]


@dataclass(frozen=True)
class LossComparison:
    """The trainer's logged loss for the batch, Gradian's, and the mask Gradian resolved."""

    logged: float
    gradian: float
    per_example: tuple[float, ...]
    token_counts: tuple[int, ...]
    loss_mask: str
    tokenizer: str
    string_pairs: str = "template"

    @property
    def delta(self) -> float:
        """Absolute difference of the two batch losses."""
        return abs(self.logged - self.gradian)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Rows as JSON Lines."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def logged_loss(run_dir: Path, step: int) -> float:
    """The training loss the trainer logged at ``step`` (trainer_state.json)."""
    state = json.loads((run_dir / "trainer_state.json").read_text())
    return next(float(e["loss"]) for e in state["log_history"] if e.get("step") == step and "loss" in e)


def two_step_args(out_dir: Path, batch: int) -> dict[str, Any]:
    """TrainingArguments for two full-batch steps with a checkpoint after each and a log at each."""
    return dict(output_dir=str(out_dir), per_device_train_batch_size=batch, max_steps=2, logging_steps=1,
                save_strategy="steps", save_steps=1, learning_rate=5e-3, warmup_steps=0, lr_scheduler_type="constant",
                report_to=[], use_cpu=True, seed=0, disable_tqdm=True, dataloader_drop_last=False)


def lora_model(base_dir: Path) -> Any:
    """The tiny base with a fresh LoRA adapter (dropout 0, so training and attribution run the same function)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM"))


def gradian_loss(base_dir: Path, run_dir: Path, dataset: Path, step: int = 2,
                 settings: tuple[str, ...] = ()) -> LossComparison:
    """Gradian's token-mean loss over the dataset under checkpoint-(step-1), as ``gradian index`` would compute it."""
    from gradian.config import load_config
    from gradian.data import encode, load_dataset
    from gradian.data.loss_mask import concrete_encoding
    from gradian.grads.batch import collate
    from gradian.grads.loss import supervised_loss
    from gradian.index.build import follow_training_run
    from gradian.model.loaded import LoadedModel

    loaded = LoadedModel.load(str(base_dir), run_dir / f"checkpoint-{step - 1}", device="cpu", dtype="float32")
    examples = list(load_dataset(dataset))
    config = follow_training_run(load_config(None, list(settings)), loaded, examples)
    encoded = [encode(example, loaded.tokenizer, 512, **concrete_encoding(config.grads)) for example in examples]
    loss = supervised_loss(loaded.model, collate(encoded, loaded.tokenizer.pad_token_id), "sum")
    per_example = [float(v) for v in loss.per_example]
    counts = [int(c) for c in loss.token_counts]
    return LossComparison(logged_loss(run_dir, step), sum(per_example) / sum(counts), tuple(per_example),
                          tuple(counts), config.grads.loss_mask, loaded.tokenizer_choice.description,
                          config.grads.string_pairs)
