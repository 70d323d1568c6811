"""Runs written by the real trl.SFTTrainer: Gradian follows their loss mask and computes the loss they logged.

TRL trains on every token of messages data by default, on the completion of prompt/completion data, and on the
assistant turns with assistant_only_loss; grads.loss_mask auto reads which from the SFTConfig in training_args.bin.
"""

from __future__ import annotations

import pytest

from tests.support.loss_fidelity import (
    GENERATION_CHATML,
    MESSAGES_ROWS,
    PLAIN_PROMPT_COMPLETION_ROWS,
    PROMPT_COMPLETION_ROWS,
    gradian_loss,
    lora_model,
    two_step_args,
    write_jsonl,
)

pytest.importorskip("trl")

CASES = {
    # name: (rows, SFTConfig overrides, chat template the run trains with, mask auto must resolve)
    "messages-all-tokens": (MESSAGES_ROWS, {}, None, "all"),
    "prompt-completion": (PROMPT_COMPLETION_ROWS, {}, None, "completion"),
    "assistant-only": (MESSAGES_ROWS, {"assistant_only_loss": True}, GENERATION_CHATML, "assistant"),
    # Plain strings: TRL tokenizes prompt + completion + EOS with no template (grads.string_pairs auto -> raw).
    "string-prompt-completion": (PLAIN_PROMPT_COMPLETION_ROWS, {}, None, "completion"),
    "string-prompt-completion-all-tokens": (PLAIN_PROMPT_COMPLETION_ROWS, {"completion_only_loss": False}, None, "all"),
}


def train_sft(base_dir, root, rows, overrides, template):
    """Two full-batch SFTTrainer steps on ``rows``; returns the run dir and the dataset file."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    dataset = write_jsonl(root / "train.jsonl", rows)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    if template is not None:
        tokenizer.chat_template = template
    torch.manual_seed(0)
    # fp32 like Gradian: SFTConfig defaults to bf16 autocast, whose rounding is not what this test measures.
    args = SFTConfig(**two_step_args(root / "run", len(rows)), max_length=512, bf16=False, **overrides)
    trainer = SFTTrainer(model=lora_model(base_dir), args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    trainer.save_state()
    return root / "run", dataset


@pytest.fixture(scope="module")
def trl_runs(tiny_base_dir, tmp_path_factory):
    """One real SFTTrainer run per case."""
    return {name: train_sft(tiny_base_dir, tmp_path_factory.mktemp(name), rows, overrides, template)
            for name, (rows, overrides, template, _) in CASES.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradian_loss_equals_the_sft_trainer_logged_loss(case, tiny_base_dir, trl_runs):
    run, dataset = trl_runs[case]
    result = gradian_loss(tiny_base_dir, run, dataset)

    print(f"\ntrl {case}: logged {result.logged:.7f} gradian {result.gradian:.7f} delta {result.delta:.2e} "
          f"mask {result.loss_mask} string pairs {result.string_pairs} tokens {result.token_counts}")
    assert result.loss_mask == CASES[case][3]
    assert result.string_pairs == "raw"  # a TRL run: only string rows are affected
    assert result.delta < 1e-5


def test_string_pairs_through_the_chat_template_are_not_what_trl_trained(tiny_base_dir, trl_runs):
    run, dataset = trl_runs["string-prompt-completion"]
    result = gradian_loss(tiny_base_dir, run, dataset, settings=("grads.string_pairs=template",))

    print(f"\ntemplated string pairs: logged {result.logged:.7f} gradian {result.gradian:.7f} delta {result.delta:.2e}")
    assert result.string_pairs == "template"
    assert result.delta > 1e-3


def test_diagnose_on_a_run_trained_on_all_tokens(tiny_base_dir, trl_runs):
    from gradian.diagnose.runner import diagnose

    run, dataset = trl_runs["messages-all-tokens"]
    report = diagnose(dataset=dataset, run=run, base_model=str(tiny_base_dir),
                      select=["loss_mask_mismatch", "loss_on_prompt", "template_mismatch"])
    by_id = {f.check_id: f for f in report.findings}
    for finding in report.findings:
        print(f"\n{finding.severity} {finding.check_id}: {finding.message}\n  evidence: {finding.evidence[0].text} "
              f"({finding.evidence[0].location})")
    assert set(by_id) == {"loss_mask_mismatch", "loss_on_prompt"}
    assert by_id["loss_mask_mismatch"].severity == "info"
    assert "every token, prompts included" in by_id["loss_mask_mismatch"].message
    assert by_id["loss_mask_mismatch"].evidence[0].location.endswith("training_args.bin")


def test_an_explicit_mask_other_than_the_run_is_a_warning(tiny_base_dir, trl_runs):
    from gradian.config import load_config
    from gradian.diagnose.runner import diagnose

    run, dataset = trl_runs["messages-all-tokens"]
    report = diagnose(dataset=dataset, run=run, base_model=str(tiny_base_dir), select=["loss_mask_mismatch"],
                      config=load_config(None, ["grads.loss_mask=assistant"]))
    [finding] = report.findings
    print(f"\n{finding.severity} {finding.check_id}: {finding.message}")
    assert finding.severity == "warning" and "not the run's" in finding.message
