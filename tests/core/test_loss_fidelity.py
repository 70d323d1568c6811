"""A run written by the real transformers.Trainer: Gradian's per-example loss equals the loss the Trainer logged.

The user's script renders Alpaca (system, history) and ShareGPT (top-level system) rows with its own chat template
(not the base model's) and masks with transformers' assistant-token mask; the Trainer saves that tokenizer into
its checkpoints, and Gradian must find it there to compute the same loss.
"""

from __future__ import annotations

import pytest

from tests.support.loss_fidelity import (
    ALPACA_SHAREGPT_ROWS,
    GENERATION_CHATML,
    MESSAGES_ROWS,
    gradian_loss,
    lora_model,
    two_step_args,
    write_jsonl,
)


def _as_messages(row: dict) -> list[dict]:
    """The user's own conversion: LLaMA-Factory's Alpaca (system, history) and ShareGPT with a top-level system."""
    system = [{"role": "system", "content": row["system"]}] if row.get("system") else []
    if "instruction" in row:
        history = [{"role": role, "content": text} for pair in row.get("history", [])
                   for role, text in zip(("user", "assistant"), pair, strict=True)]
        return system + history + [{"role": "user", "content": row["instruction"]},
                                   {"role": "assistant", "content": row["output"]}]
    if "conversations" in row:
        roles = {"human": "user", "gpt": "assistant"}
        return system + [{"role": roles[turn["from"]], "content": turn["value"]} for turn in row["conversations"]]
    return row["messages"]


@pytest.fixture(scope="module")
def trainer_run(tiny_base_dir, tmp_path_factory):
    """Two full-batch steps of the real Trainer on assistant-masked rows rendered with the run's own template."""
    import torch
    from transformers import AutoTokenizer, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    from tests.checks.run_fixtures import collate

    root = tmp_path_factory.mktemp("hf-fidelity")
    rows = ALPACA_SHAREGPT_ROWS + MESSAGES_ROWS
    dataset = write_jsonl(root / "train.jsonl", rows)
    tokenizer = AutoTokenizer.from_pretrained(tiny_base_dir)
    tokenizer.chat_template = GENERATION_CHATML
    items = []
    for row in rows:
        rendered = tokenizer.apply_chat_template(_as_messages(row), return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = rendered["input_ids"], rendered["assistant_masks"]
        items.append({"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask, strict=True)]})
    torch.manual_seed(0)
    trainer = Trainer(model=lora_model(tiny_base_dir), args=TrainingArguments(**two_step_args(root / "run", len(rows))),
                      train_dataset=items, data_collator=collate(tokenizer.pad_token_id), processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    trainer.save_state()
    return root / "run", dataset


def test_gradian_loss_equals_the_trainer_logged_loss(tiny_base_dir, trainer_run):
    run, dataset = trainer_run
    result = gradian_loss(tiny_base_dir, run, dataset)

    print(f"\nhf Trainer: logged {result.logged:.7f} gradian {result.gradian:.7f} delta {result.delta:.2e} "
          f"mask {result.loss_mask} tokens {result.token_counts}")
    assert result.loss_mask == "assistant"
    assert "checkpoint-1" in result.tokenizer  # the run's template, not the base's
    assert result.delta < 1e-5


def test_the_base_template_gives_another_loss(tiny_base_dir, trainer_run):
    """Without the run's template (what Gradian used to do) the loss is not the one the run trained on."""
    from gradian.data import encode, load_dataset
    from gradian.grads.batch import collate
    from gradian.grads.loss import supervised_loss
    from gradian.model.loaded import LoadedModel

    run, dataset = trainer_run
    loaded = LoadedModel.load(str(tiny_base_dir), run / "checkpoint-1", device="cpu", dtype="float32",
                              tokenizer=tiny_base_dir)
    encoded = [encode(e, loaded.tokenizer, 512) for e in load_dataset(dataset)]
    loss = supervised_loss(loaded.model, collate(encoded, loaded.tokenizer.pad_token_id), "sum")
    base_loss = float(loss.per_example.sum() / loss.token_counts.sum())
    assert abs(base_loss - gradian_loss(tiny_base_dir, run, dataset).logged) > 1e-3


def test_diagnose_reports_the_run_template(tiny_base_dir, trainer_run):
    from gradian.diagnose.runner import diagnose

    run, dataset = trainer_run
    report = diagnose(dataset=dataset, run=run, base_model=str(tiny_base_dir), select=["template_mismatch"])
    [finding] = report.findings
    print(f"\n{finding.severity} {finding.check_id}: {finding.message}\n  evidence: {finding.evidence[0].text} "
          f"({finding.evidence[0].location})")
    assert finding.severity == "warning"
    assert "chat_template.jinja" in finding.message and "Gradian renders with the run's" in finding.message
    assert finding.evidence[0].location.endswith("chat_template.jinja")
