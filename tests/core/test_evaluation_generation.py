"""Greedy generation and loglik scoring on a tiny Llama with a tiny LoRA whose B is non-zero."""

from __future__ import annotations

import pytest
import torch

from gradian.evaluation.generation import greedy_generate, pad_token_id, stop_token_ids
from gradian.evaluation.loglik import answer_logliks
from tests.support.tiny import tiny_llama, tiny_lora

QUESTIONS = [
    "What is two plus two?",
    "The capital of France is",
    "Hello!",
    "Explain why the sky is blue in one short sentence, please.",
    "Berlin",
    "Seven times six is",
]
ANSWERS = ["Two plus two is four.", "Paris.", "I am fine, thank you.", "Because.", "Germany", "forty-two"]


def _prompt_ids(tokenizer, question):
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids


def _answer_pair(tokenizer, question, answer):
    """(input_ids, labels) with only the answer and its end-of-turn token supervised."""
    prompt = _prompt_ids(tokenizer, question)
    answer_ids = tokenizer(answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return prompt + answer_ids, [-100] * len(prompt) + answer_ids


@pytest.fixture(scope="module")
def peft_model(chatml_tokenizer):
    return tiny_lora(tiny_llama(chatml_tokenizer, seed=0), seed=1)


@pytest.fixture(scope="module")
def prompts(chatml_tokenizer):
    return [_prompt_ids(chatml_tokenizer, q) for q in QUESTIONS]


def test_generation_is_deterministic_and_batch_invariant(peft_model, chatml_tokenizer, prompts):
    one = greedy_generate(peft_model, chatml_tokenizer, prompts, max_new_tokens=12, batch_size=1)
    four = greedy_generate(peft_model, chatml_tokenizer, prompts, max_new_tokens=12, batch_size=4)
    again = greedy_generate(peft_model, chatml_tokenizer, prompts, max_new_tokens=12, batch_size=4)
    assert one == four == again
    assert len(one) == len(prompts)
    assert len(set(one)) > 1  # the prompts matter: not one constant string


def test_adapter_changes_generation_and_disabled_adapter_is_the_plain_base(peft_model, chatml_tokenizer, prompts):
    plain = tiny_llama(chatml_tokenizer, seed=0)
    base_plain = greedy_generate(plain, chatml_tokenizer, prompts, max_new_tokens=12, batch_size=3)
    with peft_model.disable_adapter():
        base_disabled = greedy_generate(peft_model, chatml_tokenizer, prompts, max_new_tokens=12, batch_size=3)
    finetuned = greedy_generate(peft_model, chatml_tokenizer, prompts, max_new_tokens=12, batch_size=3)
    assert base_disabled == base_plain
    assert finetuned != base_plain


def test_generation_stops_at_end_of_turn_and_strips_special_tokens(chatml_tokenizer, prompts):
    model = tiny_llama(chatml_tokenizer, seed=0)
    end = chatml_tokenizer.convert_tokens_to_ids("<|im_end|>")
    # Make <|im_end|> the only likely next token: generation must stop at once and return "".
    with torch.no_grad():
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(model.lm_head.out_features))
        model.lm_head.bias[end] = 1e4
    assert greedy_generate(model, chatml_tokenizer, prompts[:2], max_new_tokens=8, batch_size=2) == ["", ""]
    assert end in stop_token_ids(chatml_tokenizer, model)


def test_generation_respects_max_new_tokens(chatml_tokenizer, prompts):
    model = tiny_llama(chatml_tokenizer, seed=0)
    token = chatml_tokenizer("Paris", add_special_tokens=False).input_ids[0]
    with torch.no_grad():
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(model.lm_head.out_features))
        model.lm_head.bias[token] = 1e4
    out = greedy_generate(model, chatml_tokenizer, prompts[:1], max_new_tokens=3, batch_size=1)
    assert out == [chatml_tokenizer.decode([token] * 3).strip()]
    assert len(chatml_tokenizer(out[0], add_special_tokens=False).input_ids) <= 3


def test_generation_restores_train_mode_and_requires_grad(peft_model, chatml_tokenizer, prompts):
    peft_model.train()
    before = {name: p.requires_grad for name, p in peft_model.named_parameters()}
    calls = []
    greedy_generate(peft_model, chatml_tokenizer, prompts, max_new_tokens=4, batch_size=4,
                    progress=lambda stage, done, total: calls.append((stage, done, total)), stage="base")
    assert peft_model.training
    assert {name: p.requires_grad for name, p in peft_model.named_parameters()} == before
    assert calls == [("base", 4, 6), ("base", 6, 6)]
    peft_model.eval()


def _manual_loglik(model, input_ids, labels):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([input_ids])).logits[0].float()
    logprobs = logits.log_softmax(-1)
    picked = [logprobs[t - 1, labels[t]].item() for t in range(1, len(labels)) if labels[t] != -100]
    return sum(picked) / len(picked)


def test_loglik_equals_a_manual_computation_for_any_batch_size(peft_model, chatml_tokenizer):
    pairs = [_answer_pair(chatml_tokenizer, q, a) for q, a in zip(QUESTIONS, ANSWERS, strict=True)]
    pad = pad_token_id(chatml_tokenizer)
    manual = [_manual_loglik(peft_model, ids, labels) for ids, labels in pairs]
    for batch_size in (1, 4, 6):
        scores = answer_logliks(peft_model, pairs, pad_id=pad, batch_size=batch_size)
        assert scores == pytest.approx(manual, abs=1e-5)
    assert all(score < 0 for score in manual)


def test_loglik_differs_between_base_and_finetuned(peft_model, chatml_tokenizer):
    pairs = [_answer_pair(chatml_tokenizer, q, a) for q, a in zip(QUESTIONS, ANSWERS, strict=True)]
    pad = pad_token_id(chatml_tokenizer)
    finetuned = answer_logliks(peft_model, pairs, pad_id=pad, batch_size=4)
    with peft_model.disable_adapter():
        base = answer_logliks(peft_model, pairs, pad_id=pad, batch_size=4)
    plain = answer_logliks(tiny_llama(chatml_tokenizer, seed=0), pairs, pad_id=pad, batch_size=4)
    assert base == pytest.approx(plain, abs=1e-6)
    assert max(abs(b - f) for b, f in zip(base, finetuned, strict=True)) > 1e-4


def test_loglik_refuses_an_item_without_answer_tokens(peft_model, chatml_tokenizer):
    ids = _prompt_ids(chatml_tokenizer, "Hello!")
    with pytest.raises(ValueError, match="no answer tokens"):
        answer_logliks(peft_model, [(ids, [-100] * len(ids))], pad_id=0)
