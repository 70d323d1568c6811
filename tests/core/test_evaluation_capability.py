"""Capability delta: per-item base vs fine-tuned scores, paired bootstrap significance, refusal, bad input."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from gradian.config import EvaluationConfig
from gradian.data import Message, encode_answer, encode_prompt, make_example
from gradian.errors import EvaluationError
from gradian.evaluation import (
    capability_from_scores,
    evaluate_capability,
    greedy_generate,
    refusal_message,
    validate_query_signal,
)
from gradian.evaluation.query_signal import LOGLIK_AUTO_NOTE

QUESTIONS = [
    "What is two plus two?", "The capital of France is", "Hello!", "Explain why the sky is blue.",
    "Berlin", "Seven times six is", "The capital of Italy is", "How are you?", "Tokyo", "Rewrite this politely.",
    "What is the capital of Spain?", "Yes or no?",
]


def _item(index, question, answer):
    return make_example(index, messages=[Message("user", question), Message("assistant", answer)])


def _items(answers):
    return [_item(i, q, a) for i, (q, a) in enumerate(zip(QUESTIONS, answers, strict=False))]


# --- assembling the result from scores (no model) ---


def test_result_from_scores_names_the_regressed_items_and_keeps_their_texts():
    items = _items(["Paris", "Rome", "four", "Madrid"])
    config = EvaluationConfig(bootstrap_samples=1000)
    result = capability_from_scores("exact_match", items, [1, 1, 0, 1], [0, 1, 1, 0], config,
                                    base_outputs=["Paris", "Rome", "five", "Madrid"],
                                    finetuned_outputs=["Lyon", "Rome", "four", "Seville"])
    assert result.n_items == 4
    assert (result.base_mean, result.finetuned_mean, result.delta) == (0.75, 0.5, -0.25)
    assert result.regressed_ids == (items[0].id, items[3].id)
    first = result.regressed_items[0]
    assert (first.prompt, first.wanted, first.base_output, first.finetuned_output) == (
        QUESTIONS[0], "Paris", "Paris", "Lyon")
    assert (result.bootstrap_samples, result.confidence, result.seed) == (1000, 0.95, 0)
    assert result.ci_low <= result.delta <= result.ci_high
    assert not result.significant  # 4 items with a gain among the losses is noise
    assert result.query_signal.effective == "divergent-token"  # auto with a text metric


def test_to_dict_is_json_and_complete():
    items = _items(["Paris", "Rome"])
    result = capability_from_scores("token_f1", items, [1.0, 0.5], [0.25, 0.5], EvaluationConfig(bootstrap_samples=200))
    data = json.loads(json.dumps(result.to_dict()))
    for key in ("metric", "n_items", "base_mean", "finetuned_mean", "delta", "ci_low", "ci_high", "confidence",
                "bootstrap_samples", "seed", "significant", "regressed_ids", "items", "query_signal"):
        assert key in data
    assert data["items"][0]["regressed"] is True and data["items"][1]["regressed"] is False
    assert set(data["items"][0]) >= {"id", "prompt", "wanted", "base_output", "finetuned_output", "base_score",
                                     "finetuned_score"}
    assert data["query_signal"] == {"requested": "auto", "effective": "divergent-token", "note": None}


def test_clear_regression_is_significant_and_identical_scores_are_not():
    items = _items(["a"] * 12)
    config = EvaluationConfig(bootstrap_samples=2000, seed=3)
    lost = capability_from_scores("exact_match", items, [1.0] * 12, [0.0] * 9 + [1.0] * 3, config)
    assert lost.significant and lost.significant_regression and lost.ci_high < 0
    same = capability_from_scores("exact_match", items, [1.0, 0.0] * 6, [1.0, 0.0] * 6, config)
    assert not same.significant and (same.ci_low, same.ci_high) == (0.0, 0.0)
    assert same.regressed_ids == ()


def test_same_seed_same_result_other_seed_other_interval():
    items = _items(["a"] * 12)
    base = [1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0]
    ft = [0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 1]
    one = capability_from_scores("contains", items, base, ft, EvaluationConfig(seed=1))
    two = capability_from_scores("contains", items, base, ft, EvaluationConfig(seed=1))
    other = capability_from_scores("contains", items, base, ft, EvaluationConfig(seed=2))
    assert one == two
    assert (one.ci_low, one.ci_high) != (other.ci_low, other.ci_high)
    assert one.bootstrap_samples == 10000


def test_a_single_item_is_never_significant():
    result = capability_from_scores("exact_match", _items(["Paris"]), [1.0], [0.0], EvaluationConfig())
    assert (result.ci_low, result.ci_high) == (-1.0, -1.0)
    assert not result.significant
    assert "no spread to bootstrap" in refusal_message(result)


# --- the refusal ---


def test_refusal_message_has_the_numbers_and_the_spec_advice():
    items = _items(["a"] * 6)
    result = capability_from_scores("exact_match", items, [1, 1, 0, 1, 0, 1], [1, 0, 1, 1, 0, 0],
                                    EvaluationConfig(bootstrap_samples=1000))
    assert not result.significant
    text = refusal_message(result)
    assert "not significant" in text
    assert "includes zero" in text and "no established regression to explain" in text
    assert "Widen it" in text
    assert "evaluation.metric" in text and "exact_match" in text and "formatting" in text
    assert "Do not reach for evaluation.require_significant: false" in text
    assert f"{result.ci_low:+.4g}" in text and f"{result.ci_high:+.4g}" in text and "over 6 eval items" in text


def test_refusal_for_a_significant_improvement_says_there_is_nothing_to_explain():
    items = _items(["a"] * 12)
    better = capability_from_scores("exact_match", items, [0.0] * 12, [1.0] * 12, EvaluationConfig())
    assert better.significant and not better.significant_regression
    assert "significantly better" in refusal_message(better)
    worse = capability_from_scores("exact_match", items, [1.0] * 12, [0.0] * 12, EvaluationConfig())
    with pytest.raises(ValueError):
        refusal_message(worse)


# --- query signal ---


@pytest.mark.parametrize(
    ("metric", "signal", "effective", "note"),
    [
        ("exact_match", "auto", "divergent-token", None),
        ("contains", "auto", "divergent-token", None),
        ("token_f1", "auto", "divergent-token", None),
        ("loglik", "auto", "classic", LOGLIK_AUTO_NOTE),
        ("exact_match", "classic", "classic", None),
        ("loglik", "classic", "classic", None),
        ("exact_match", "contrastive", "contrastive", None),
        ("token_f1", "contrastive", "contrastive", None),
        ("contains", "margin", "margin", None),
        ("exact_match", "divergence", "divergence", None),
        ("token_f1", "divergent-token", "divergent-token", None),
    ],
)
def test_query_signal_table(metric, signal, effective, note):
    choice = validate_query_signal(metric, signal)
    assert (choice.requested, choice.effective, choice.note) == (signal, effective, note)


def test_loglik_auto_note_says_classic_and_why():
    assert "classic" in LOGLIK_AUTO_NOTE and "generates no text" in LOGLIK_AUTO_NOTE


@pytest.mark.parametrize(("metric", "signal", "words"),
                         [("loglik", "contrastive", "contrastive"), ("bleu", "auto", "bleu"),
                          ("exact_match", "gradient", "gradient")])
def test_query_signal_refusals(metric, signal, words):
    with pytest.raises(EvaluationError) as info:
        validate_query_signal(metric, signal)
    assert words in info.value.one_line() and "hint:" in info.value.one_line()


# --- on a tiny model ---


@pytest.fixture(scope="module")
def tiny(chatml_tokenizer):
    from tests.support.tiny import tiny_llama, tiny_lora

    return tiny_lora(tiny_llama(chatml_tokenizer, seed=0), seed=1), chatml_tokenizer


@pytest.fixture(scope="module")
def generations(tiny):
    """Base and fine-tuned generations of every question, one at a time."""
    model, tokenizer = tiny
    prompts = [encode_prompt([Message("user", q)], tokenizer) for q in QUESTIONS]
    with model.disable_adapter():
        base = greedy_generate(model, tokenizer, prompts, max_new_tokens=8, batch_size=1)
    finetuned = greedy_generate(model, tokenizer, prompts, max_new_tokens=8, batch_size=1)
    return base, finetuned


def test_wanted_answers_the_base_model_gives_are_lost_by_the_adapter(tiny, generations):
    base, finetuned = generations
    keep = [i for i, text in enumerate(base) if text.strip() and text != finetuned[i]]
    assert len(keep) >= 8
    items = [_item(i, QUESTIONS[i], base[i]) for i in keep]
    config = EvaluationConfig(metric="exact_match", max_new_tokens=8, batch_size=4, bootstrap_samples=2000)
    stages = []
    result = evaluate_capability(tiny, items, config, progress=lambda stage, done, total: stages.append(stage))
    assert [row.base_output for row in result.items] == [base[i] for i in keep]  # batch 4 == batch 1
    assert [row.finetuned_output for row in result.items] == [finetuned[i] for i in keep]
    assert result.base_mean == 1.0
    assert result.significant_regression
    assert set(result.regressed_ids) == {row.id for row in result.items if row.finetuned_score < 1.0}
    assert stages[0] == "base" and stages[-1] == "finetuned"
    assert evaluate_capability(tiny, items, config) == result  # deterministic


def test_loglik_metric_scores_the_wanted_answer_without_generating(tiny):
    import torch

    model, tokenizer = tiny
    items = _items(["Paris.", "four", "Hello! I am fine."])
    config = EvaluationConfig(metric="loglik", batch_size=2, bootstrap_samples=500)
    result = evaluate_capability(tiny, items, config)
    assert all(row.base_output is None and row.finetuned_output is None for row in result.items)
    assert result.query_signal.effective == "classic" and result.query_signal.note == LOGLIK_AUTO_NOTE
    enc = encode_answer(items[1].prompt_messages, "four", tokenizer, 10_000)
    with torch.no_grad():
        logprobs = model(input_ids=torch.tensor([enc.input_ids])).logits[0].log_softmax(-1)
    picked = [logprobs[t - 1, enc.labels[t]].item() for t in range(1, len(enc.labels)) if enc.labels[t] != -100]
    assert result.items[1].finetuned_score == pytest.approx(sum(picked) / len(picked), abs=1e-5)
    assert result.items[1].base_score != pytest.approx(result.items[1].finetuned_score, abs=1e-6)


def test_loglik_answer_truncated_away_is_an_evaluation_error(tiny):
    with pytest.raises(EvaluationError, match="no answer tokens left"):
        evaluate_capability(tiny, _items(["Paris"]), EvaluationConfig(metric="loglik"), max_seq_length=3)


# --- bad input ---


@pytest.mark.parametrize(
    ("items", "config", "words"),
    [
        ([], EvaluationConfig(), "eval set is empty"),
        ([make_example(0, messages=[Message("user", "Capital of France?")])], EvaluationConfig(), "no wanted answer"),
        ([make_example(0, messages=[Message("user", "Q?"), Message("assistant", "  ")])], EvaluationConfig(),
         "no wanted answer"),
        ([make_example(0, messages=[Message("assistant", "Paris")])], EvaluationConfig(), "no prompt"),
        ([make_example(0, text="just text", format="text")], EvaluationConfig(), "no wanted answer"),
        (_items(["Paris"]), dataclasses.replace(EvaluationConfig(), metric="bleu"), "unknown evaluation metric"),
        (_items(["Paris"]), EvaluationConfig(metric="loglik", query_signal="contrastive"), "contrastive"),
    ],
)
def test_bad_input_is_one_line_with_a_hint(tiny, items, config, words):
    with pytest.raises(EvaluationError) as info:
        evaluate_capability(tiny, items, config)
    line = info.value.one_line()
    assert words in line and "hint:" in line and "\n" not in line


def test_a_model_without_an_adapter_is_refused(chatml_tokenizer):
    from tests.support.tiny import tiny_llama

    with pytest.raises(EvaluationError, match="no LoRA adapter"):
        evaluate_capability((tiny_llama(chatml_tokenizer), chatml_tokenizer), _items(["Paris"]), EvaluationConfig())


def test_importing_evaluation_does_not_import_torch():
    code = "import sys, gradian.evaluation; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
