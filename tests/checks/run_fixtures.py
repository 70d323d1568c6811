"""Real run directories for the diagnose tests: a tiny base model pretrained in-process, then LoRA fine-tunes
written by the real ``transformers.Trainer`` (trainer_state.json, training_args.bin, checkpoints, adapter)."""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COUNTRIES = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"),
             ("England", "London"), ("Japan", "Tokyo"), ("Canada", "Ottawa"), ("Portugal", "Lisbon")]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
SUMS = [(1, 2), (2, 2), (3, 4), (2, 5), (4, 4), (1, 7), (3, 6), (0, 9), (5, 3), (6, 1), (2, 6), (0, 4)]
EVAL_ROWS = [
    {"messages": [{"role": "user", "content": "What is the capital of Austria?"},
                  {"role": "assistant", "content": "The capital of Austria is Vienna."}]},
    {"messages": [{"role": "user", "content": "What is four plus five?"},
                  {"role": "assistant", "content": "Four plus five is nine."}]},
]


def healthy_rows() -> list[dict[str, Any]]:
    """A small, clean chat dataset in the tiny tokenizer's vocabulary: no duplicates, conflicts or markup."""
    rows = []
    for country, city in COUNTRIES:
        rows.append({"messages": [{"role": "user", "content": f"What is the capital of {country}?"},
                                  {"role": "assistant", "content": f"The capital of {country} is {city}."}],
                     "source": "capitals"})
        rows.append({"messages": [{"role": "system", "content": "Answer in one short sentence."},
                                  {"role": "user", "content": f"Which city is the capital of {country}, please?"},
                                  {"role": "assistant", "content": f"{city} is the capital of {country}."}],
                     "source": "capitals"})
    for a, b in SUMS:
        rows.append({"messages": [{"role": "user", "content": f"What is {NUMBERS[a]} plus {NUMBERS[b]}?"},
                                  {"role": "assistant", "content": f"{NUMBERS[a].capitalize()} plus {NUMBERS[b]} is {NUMBERS[a + b]}."}],
                     "source": "arithmetic"})
    return rows


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Write rows (dicts, or raw strings written as-is) as JSON Lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for row in rows:
            out.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def pretrain_tiny_base(directory: Path, steps: int = 40, seed: int = 0) -> Path:
    """A tiny Llama + ChatML tokenizer, briefly pretrained on the tiny corpus so its loss beats uniform guessing."""
    import torch

    from tests.support.tiny import CORPUS, tiny_llama, tiny_tokenizer

    tokenizer = tiny_tokenizer("chatml")
    model = tiny_llama(tokenizer, seed=seed)
    model.train()
    # The corpus plus the rendered prompts (not the answers) of the training rows: a "base model" that knows
    # the words and the template, so a fine-tune starts under uniform loss and still has the answers to learn.
    chats = [tokenizer.apply_chat_template(row["messages"][:-1], tokenize=False, add_generation_prompt=True)
             for row in healthy_rows()]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in list(CORPUS) + chats]
    width = max(len(row) for row in ids)
    batch = torch.full((len(ids), width), tokenizer.pad_token_id)
    labels = torch.full((len(ids), width), -100)
    for row, tokens in enumerate(ids):
        batch[row, : len(tokens)] = torch.tensor(tokens)
        labels[row, : len(tokens)] = torch.tensor(tokens)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(input_ids=batch, attention_mask=(labels != -100).long(), labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


class EncodedRows:
    """A torch Dataset of core-encoded examples (the loss mask training and attribution share)."""

    def __init__(self, examples: Any, tokenizer: Any, max_length: int) -> None:
        from gradian.data import encode

        self.items = [encode(example, tokenizer, max_length) for example in examples]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.items[index]
        return {"input_ids": list(item.input_ids), "labels": list(item.labels)}


def collate(pad_id: int):
    """Right-pad input_ids / labels into tensors."""
    def collate_batch(rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), pad_id)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            ids[i, :n] = torch.tensor(row["input_ids"])
            labels[i, :n] = torch.tensor(row["labels"])
            mask[i, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    return collate_batch


def train_real_run(base_dir: Path, dataset: Path, out_dir: Path, *, targets=("q_proj", "v_proj", "up_proj", "down_proj"),
                   r: int = 8, alpha: float = 16.0, stop_at_step: int | None = None, eval_rows: int = 4,
                   **args: Any) -> Path:
    """LoRA fine-tune of the tiny base with the real transformers.Trainer; returns the run dir it wrote."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    from gradian.data import scan_dataset

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), task_type="CAUSAL_LM"))
    examples = scan_dataset(dataset).examples
    train = EncodedRows(examples, tokenizer, 256)
    evaluation = EncodedRows(examples[:eval_rows], tokenizer, 256) if eval_rows else None
    defaults = dict(output_dir=str(out_dir), logging_steps=1, save_strategy="epoch", per_device_train_batch_size=2,
                    learning_rate=2e-4, num_train_epochs=3, warmup_steps=2, report_to=[], use_cpu=True, seed=0,
                    eval_strategy="epoch" if eval_rows else "no", disable_tqdm=True, save_total_limit=2)
    defaults.update(args)

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - Trainer's callback signature
            if stop_at_step is not None and state.global_step >= stop_at_step:
                control.should_training_stop = True

    trainer = Trainer(model=model, args=TrainingArguments(**defaults), train_dataset=train, eval_dataset=evaluation,
                      data_collator=collate(tokenizer.pad_token_id), callbacks=[StopAt()])
    trainer.remove_callback(PrinterCallback)  # keep the test output free of per-step log dicts
    trainer.train()
    trainer.save_model()
    trainer.save_state()
    return out_dir


LONG_ANSWER = ("Paris is the capital of France. It is a city on the river, and the capital of France is also the "
               "largest city in France. Berlin is the capital of Germany and Rome is the capital of Italy.")
NEAR_COPY = LONG_ANSWER + " Madrid too."  # one new word pair: MinHash Jaccard about 0.95


def faulty_rows() -> list[Any]:
    """The healthy rows plus planted data faults (raw strings are written as-is: broken JSON)."""
    rows: list[Any] = healthy_rows()
    rows += [
        rows[0], rows[0],  # exact duplicates
        {"messages": [{"role": "user", "content": "Tell me about Paris and the capitals."},
                      {"role": "assistant", "content": LONG_ANSWER}]},
        {"messages": [{"role": "user", "content": "Tell me about Paris and the capitals!"},
                      {"role": "assistant", "content": NEAR_COPY}]},  # near-duplicate
        {"messages": [{"role": "user", "content": "What is the capital of France?"},
                      {"role": "assistant", "content": "The capital of France is Rome."}]},  # conflicting answer
        {"messages": [{"role": "user", "content": "What is the capital of Spain?"},
                      {"role": "assistant", "content": "  "}]},  # empty assistant turn
        {"messages": [{"role": "user", "content": "Hello! How are you?"}]},  # no assistant turn
        {"messages": [{"role": "user", "content": "What is the capital of Japan, please?"},
                      {"role": "assistant", "content": "### Response: Tokyo is the capital of Japan."}]},  # markup
        '{"messages": [{"role": "user", "content": "broken',  # not JSON
        {"messages": [{"role": "bot", "content": "hi"}]},  # unknown role
    ]
    return rows


@dataclass(frozen=True)
class RealRuns:
    """The run dirs the real Trainer wrote for this test session, and their inputs."""

    root: Path
    base_dir: Path
    healthy_dataset: Path
    eval_dataset: Path
    healthy_run: Path
    faulty_dataset: Path
    faulty_run: Path


ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@functools.cache
def real_runs() -> RealRuns:
    """Train the tiny base once per test process: one healthy LoRA run and one with planted config faults."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: extra threads only spin, and on a shared 2-core machine they thrash
    try:
        return _train_real_runs()
    finally:
        torch.set_num_threads(threads)


def _train_real_runs() -> RealRuns:
    root = Path(tempfile.mkdtemp(prefix="gradian-real-runs-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    base = pretrain_tiny_base(root / "base")
    healthy = write_jsonl(root / "healthy.jsonl", healthy_rows())
    eval_set = write_jsonl(root / "eval.jsonl", EVAL_ROWS)
    healthy_run = train_real_run(base, healthy, root / "healthy-run", learning_rate=4e-4, r=8, alpha=32,
                                 targets=ALL_LINEAR)
    faulty = write_jsonl(root / "faulty.jsonl", faulty_rows())
    faulty_run = train_real_run(
        base, faulty, root / "faulty-run",
        learning_rate=2e-3,          # lr_too_high_for_lora (error)
        targets=("q_proj", "v_proj"),  # attention_only_targets
        r=4, alpha=64,               # alpha_rank_extreme (scale 16)
        warmup_steps=0.5,            # warmup_dominates (a ratio, in transformers 5)
        max_grad_norm=0.0,           # grad_clip_disabled
        num_train_epochs=6,          # too_many_epochs (error on < 1k rows)
        eval_rows=0,                 # no_eval_split
        stop_at_step=30,             # run_incomplete
        save_strategy="steps", save_steps=10,
    )
    return RealRuns(root, base, healthy, eval_set, healthy_run, faulty, faulty_run)
