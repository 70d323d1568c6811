"""Query gradients and span drill-down on a tiny model: signs, normalization, and each sentence-blame measure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradian.data import Message, encode, make_example
from gradian.grads import GradientCapture, collate, restrict_labels
from gradian.model.loaded import LoadedModel
from gradian.query import query_gradients, sentence_spans, span_blames
from tests.support.tiny import tiny_llama, tiny_lora, tiny_tokenizer


@pytest.fixture(scope="module")
def setup():
    tokenizer = tiny_tokenizer("chatml")
    model = tiny_lora(tiny_llama(tokenizer, seed=3), r=4, targets=("q_proj", "v_proj", "down_proj"), seed=4)
    loaded = LoadedModel(model, tokenizer)
    return tokenizer, loaded, GradientCapture(loaded, loss_reduction="sum")


class Item:
    def __init__(self, id, wanted, base_output, finetuned_output, base_score, finetuned_score):
        self.id, self.wanted, self.base_output, self.finetuned_output = id, wanted, base_output, finetuned_output
        self.base_score, self.finetuned_score = base_score, finetuned_score


PROMPT = (Message("user", "What is the capital of France?"),)


def test_sentence_spans():
    text = "Paris is the capital. It is big!  Rome is in Spain.\nDone"
    assert [text[a:b] for a, b in sentence_spans(text)] == [
        "Paris is the capital.", "It is big!", "Rome is in Spain.", "Done"]
    assert sentence_spans("   ") == []


def test_classic_is_the_wanted_answer_gradient(setup):
    tokenizer, loaded, capture = setup
    item = Item("q1", "Paris", "The capital of France is Paris.", "The capital of France is Rome.", 1.0, 0.0)
    query = query_gradients(capture, tokenizer, [item], {"q1": PROMPT}, "classic", max_seq_length=64)
    from gradian.data import encode_answer

    direct = capture.capture(collate([encode_answer(PROMPT, "Paris", tokenizer, 64)], tokenizer.pad_token_id))
    np.testing.assert_allclose(query.vectors[0], direct[0].detach().numpy(), rtol=1e-6)
    assert query.terms[0].wanted_source == "eval answer" and query.terms[0].generated_text is None


def test_contrastive_uses_unit_terms_and_the_base_generation_when_it_was_right(setup):
    tokenizer, loaded, capture = setup
    right = Item("q1", "Paris", "The capital of France is Paris.", "The capital of France is Rome.", 1.0, 0.0)
    query = query_gradients(capture, tokenizer, [right], {"q1": PROMPT}, "contrastive", max_seq_length=64)
    assert query.terms[0].wanted_source == "base generation"
    from gradian.data import encode_answer

    def grad(text):
        return capture.capture(collate([encode_answer(PROMPT, text, tokenizer, 64)], tokenizer.pad_token_id))[0].detach().numpy()

    wanted, generated = grad(right.base_output), grad(right.finetuned_output)
    expected = wanted / np.linalg.norm(wanted) - generated / np.linalg.norm(generated)
    np.testing.assert_allclose(query.vectors[0], expected, rtol=1e-5, atol=1e-7)
    wrong_base = Item("q2", "Paris", "I do not know.", "Rome.", 0.0, 0.0)
    query = query_gradients(capture, tokenizer, [wrong_base], {"q2": PROMPT}, "contrastive", max_seq_length=64)
    assert query.terms[0].wanted_source == "eval answer"


def test_span_blames_add_up_to_the_example_blame(setup):
    tokenizer, loaded, capture = setup
    answer = "Paris is the capital of France. Rome is the capital of Italy. Madrid is in Spain."
    example = make_example(0, messages=(PROMPT[0], Message("assistant", answer)))
    query = np.random.default_rng(0).standard_normal(capture.dim)
    spans = span_blames(capture, tokenizer, example, query, max_seq_length=128, measure="restricted")
    assert [s.text for s in spans] == ["Paris is the capital of France.", "Rome is the capital of Italy.",
                                       "Madrid is in Spain."]
    encoded = encode(example, tokenizer, 128)
    batch = collate([encoded], tokenizer.pad_token_id)
    covered = torch.zeros_like(batch.labels, dtype=torch.bool)
    for span in spans:
        covered[0, span.token_start:span.token_end] = True
    whole = -(capture.capture(batch)[0].detach().double().numpy() @ query)
    rest = -(capture.capture(batch.with_labels(restrict_labels(batch.labels, ~covered)))[0].detach().double().numpy() @ query)
    assert sum(s.blame for s in spans) + rest == pytest.approx(whole, rel=1e-4)


def _whole_blame(capture, tokenizer, example, query):
    batch = collate([encode(example, tokenizer, 128)], tokenizer.pad_token_id)
    return float(-(capture.capture(batch)[0].detach().double().numpy() @ query))


def test_removed_span_blame_is_the_example_blame_minus_its_blame_without_the_sentence(setup):
    tokenizer, loaded, capture = setup
    sentences = ["Paris is the capital of France.", "Rome is the capital of Italy.", "Madrid is in Spain."]
    example = make_example(0, messages=(PROMPT[0], Message("assistant", " ".join(sentences))))
    query = np.random.default_rng(2).standard_normal(capture.dim)
    removed = span_blames(capture, tokenizer, example, query, max_seq_length=128, measure="removed")
    restricted = span_blames(capture, tokenizer, example, query, max_seq_length=128, measure="restricted")
    assert [(s.text, s.token_start, s.token_end) for s in removed] == [
        (s.text, s.token_start, s.token_end) for s in restricted]
    whole = _whole_blame(capture, tokenizer, example, query)
    for dropped, span in enumerate(removed):
        rest = " ".join(sentence for i, sentence in enumerate(sentences) if i != dropped)
        without = make_example(0, messages=(PROMPT[0], Message("assistant", rest)))
        assert span.blame == pytest.approx(whole - _whole_blame(capture, tokenizer, without, query),
                                           abs=1e-4 * abs(whole))
    assert [s.blame for s in removed] != pytest.approx([s.blame for s in restricted])


def test_alone_span_blame_is_the_blame_of_the_sentence_as_the_whole_answer(setup):
    tokenizer, loaded, capture = setup
    sentences = ["Paris is the capital of France.", "Rome is the capital of Italy."]
    earlier = Message("assistant", "Sure.")
    example = make_example(0, messages=(PROMPT[0], earlier, Message("user", "More?"),
                                        Message("assistant", " ".join(sentences)), Message("user", "Thanks")))
    query = np.random.default_rng(4).standard_normal(capture.dim)
    spans = span_blames(capture, tokenizer, example, query, max_seq_length=128, measure="alone")
    assert [s.text for s in spans] == ["Sure.", *sentences] and [s.message_index for s in spans] == [1, 3, 3]
    # the sentence is its turn's whole answer; later turns dropped, earlier answers context only (weight 0)
    quiet = Message("assistant", "Sure.", weight=0)
    alone = [make_example(0, messages=(PROMPT[0], earlier)),
             *(make_example(0, messages=(PROMPT[0], quiet, Message("user", "More?"), Message("assistant", sentence)))
               for sentence in sentences)]
    for span, row in zip(spans, alone, strict=True):
        expected = _whole_blame(capture, tokenizer, row, query)
        assert span.blame == pytest.approx(expected, abs=1e-4 * abs(expected))


def test_removed_span_blame_of_a_text_row_and_an_unknown_measure(setup):
    tokenizer, loaded, capture = setup
    example = make_example(0, text="Paris is in France.\nRome is in Italy.", format="text")
    query = np.random.default_rng(3).standard_normal(capture.dim)
    spans = span_blames(capture, tokenizer, example, query, max_seq_length=128, measure="removed")
    assert [s.message_index for s in spans] == [-1, -1]
    whole = _whole_blame(capture, tokenizer, example, query)
    assert spans[0].blame == pytest.approx(
        whole - _whole_blame(capture, tokenizer, make_example(0, text="Rome is in Italy.", format="text"), query), abs=1e-4 * abs(whole))
    assert spans[1].blame == pytest.approx(
        whole - _whole_blame(capture, tokenizer, make_example(0, text="Paris is in France.", format="text"), query), abs=1e-4 * abs(whole))
    with pytest.raises(ValueError, match="unknown span blame"):
        span_blames(capture, tokenizer, example, query, max_seq_length=128, measure="loo")


@pytest.mark.parametrize("loss_mask", ["completion", "all"])
def test_span_blames_encode_a_raw_string_pair_as_the_index_does(setup, loss_mask):
    tokenizer, loaded, capture = setup
    answer = "Paris is the capital of France. Rome is the capital of Italy."
    example = make_example(0, messages=(Message("user", "Capital of France?"), Message("assistant", answer)),
                           format="prompt_completion", plain_pair=True)
    query = np.random.default_rng(1).standard_normal(capture.dim)
    raw = span_blames(capture, tokenizer, example, query, max_seq_length=128, loss_mask=loss_mask, pairs="raw",
                      measure="restricted")
    encoded = encode(example, tokenizer, 128, loss_mask=loss_mask, pairs="raw")
    assert [(s.token_start, s.token_end) for s in raw] == [
        encoded.tokens_for_chars(s.char_start, s.char_end, 0) for s in raw]
    assert len(raw) == 2 and raw[0].token_end <= raw[1].token_start
    templated = span_blames(capture, tokenizer, example, query, max_seq_length=128, measure="restricted")
    assert [(s.token_start, s.token_end) for s in templated] != [(s.token_start, s.token_end) for s in raw]


def _supervised_text(tokenizer, encoded) -> str:
    return tokenizer.decode([token for token in encoded.labels if token != -100])


def test_divergence_supervises_each_answer_from_the_first_token_that_differs(setup):
    from gradian.data import encode_answer
    from gradian.query.signals import diverged

    tokenizer = setup[0]
    wanted = encode_answer(PROMPT, "The capital of France is Paris.", tokenizer, 64)
    generated = encode_answer(PROMPT, "The capital of France is Rome, I think.", tokenizer, 64)
    w, g = diverged(wanted, generated)
    assert w.input_ids == wanted.input_ids and g.input_ids == generated.input_ids  # the shared prefix stays as context
    assert _supervised_text(tokenizer, w).strip().startswith("Paris.")
    assert _supervised_text(tokenizer, g).strip().startswith("Rome, I think.")
    assert w.num_supervised == sum(token != -100 for token in w.labels) < wanted.num_supervised
    first_w, first_g = diverged(wanted, generated, first_only=True)
    assert first_w.num_supervised == first_g.num_supervised == 1
    first_token = _supervised_text(tokenizer, first_w).strip()
    assert first_token and "Paris".startswith(first_token)  # the wanted answer's first differing token alone
    # An answer that stops where the other goes on diverges at its end-of-turn; equal answers never diverge.
    short, longer = diverged(encode_answer(PROMPT, "Paris", tokenizer, 64),
                             encode_answer(PROMPT, "Paris is the capital.", tokenizer, 64), first_only=True)
    assert short.num_supervised == longer.num_supervised == 1
    assert diverged(wanted, encode_answer(PROMPT, "The capital of France is Paris.", tokenizer, 64)) is None


def test_margin_is_the_autograd_gradient_of_the_first_divergent_tokens_losses_and_the_others_unit_contrasts(setup):
    from gradian.data import encode_answer
    from gradian.query.signals import diverged
    from tests.core.test_grads_exact import reference_gradient

    tokenizer, loaded, capture = setup
    right = Item("q1", "Paris", "The capital of France is Paris.", "The capital of France is Rome.", 1.0, 0.0)
    margin = query_gradients(capture, tokenizer, [right], {"q1": PROMPT}, "margin", max_seq_length=64)
    w, g = diverged(encode_answer(PROMPT, right.base_output, tokenizer, 64),
                    encode_answer(PROMPT, right.finetuned_output, tokenizer, 64), first_only=True)
    want = (reference_gradient(loaded, capture, {"input_ids": list(w.input_ids), "labels": list(w.labels)}, "sum")
            - reference_gradient(loaded, capture, {"input_ids": list(g.input_ids), "labels": list(g.labels)}, "sum"))
    np.testing.assert_allclose(margin.vectors[0], want.numpy(), rtol=1e-4, atol=1e-6 * float(want.abs().max()))
    assert margin.signal == "margin" and margin.terms[0].wanted_source == "base generation"

    def unit_contrast(pair):
        rows = [capture.capture(collate([e], tokenizer.pad_token_id))[0].detach().numpy() for e in pair]
        return rows[0] / np.linalg.norm(rows[0]) - rows[1] / np.linalg.norm(rows[1])

    token = query_gradients(capture, tokenizer, [right], {"q1": PROMPT}, "divergent-token", max_seq_length=64)
    np.testing.assert_allclose(token.vectors[0], unit_contrast((w, g)), rtol=1e-5, atol=1e-7)
    divergence = query_gradients(capture, tokenizer, [right], {"q1": PROMPT}, "divergence", max_seq_length=64)
    suffixes = diverged(encode_answer(PROMPT, right.base_output, tokenizer, 64),
                        encode_answer(PROMPT, right.finetuned_output, tokenizer, 64))
    np.testing.assert_allclose(divergence.vectors[0], unit_contrast(suffixes), rtol=1e-5, atol=1e-7)
    # A pair that never diverges is contrasted whole, as the contrastive signal does (here: zero).
    same = Item("q2", "Paris", "Paris.", "Paris.", 1.0, 0.0)
    assert not np.any(query_gradients(capture, tokenizer, [same], {"q2": PROMPT}, "divergence",
                                      max_seq_length=64).vectors)


@pytest.mark.parametrize("weight", [0.0, 0.75, 1.0])
def test_generated_weight_weighs_the_two_autograd_terms_of_a_paired_query(setup, weight):
    from gradian.data import encode_answer
    from gradian.query.signals import diverged
    from tests.core.test_grads_exact import reference_gradient

    tokenizer, loaded, capture = setup
    right = Item("q1", "Paris", "The capital of France is Paris.", "The capital of France is Rome.", 1.0, 0.0)
    w, g = diverged(encode_answer(PROMPT, right.base_output, tokenizer, 64),
                    encode_answer(PROMPT, right.finetuned_output, tokenizer, 64), first_only=True)
    wanted, generated = (reference_gradient(loaded, capture, {"input_ids": list(e.input_ids), "labels": list(e.labels)},
                                            "sum").numpy() for e in (w, g))

    def query(signal):
        return query_gradients(capture, tokenizer, [right], {"q1": PROMPT}, signal, max_seq_length=64,
                               generated_weight=weight).vectors[0]

    unit = 2 * ((1 - weight) * wanted / np.linalg.norm(wanted) - weight * generated / np.linalg.norm(generated))
    np.testing.assert_allclose(query("divergent-token"), unit, rtol=1e-4, atol=1e-5 * float(np.abs(unit).max()))
    raw = 2 * ((1 - weight) * wanted - weight * generated)
    np.testing.assert_allclose(query("margin"), raw, rtol=1e-4, atol=1e-5 * float(np.abs(raw).max()))
    with pytest.raises(ValueError, match="generated_weight"):
        query_gradients(capture, tokenizer, [right], {"q1": PROMPT}, "margin", max_seq_length=64,
                        generated_weight=1.5)


def test_shared_answers_are_the_items_another_item_answers_word_for_word():
    from gradian.query.signals import shared_answers

    items = [Item("a", "Swedish", None, "I'm sorry, but I can't help.", 1.0, 0.0),
             Item("b", "Spanish", None, "  i'm sorry,  but I can't help. ", 1.0, 0.0),
             Item("c", "Jakarta", None, "The capital of Indonesia is Jakantan.", 1.0, 0.0),
             Item("d", "Delhi", None, "", 1.0, 0.0), Item("e", "Ottawa", None, "", 1.0, 0.0)]
    assert shared_answers(items) == [("a", "b")]  # empty answers are no shared reply
    assert shared_answers(items[2:]) == []
    more = [*items, Item("f", "Rome", None, "The capital of Indonesia is Jakantan.", 1.0, 0.0),
            Item("g", "Oslo", None, "I'm sorry, but I can't help.", 1.0, 0.0)]
    assert shared_answers(more) == [("a", "b", "g"), ("c", "f")]  # the most items first


def test_divergent_token_queries_the_items_named_whole_answer_as_divergence_does(setup):
    tokenizer, loaded, capture = setup
    prompts = {"q1": PROMPT, "q2": (Message("user", "What is the capital of Spain?"),)}
    items = [Item("q1", "Paris", "The capital of France is Paris.", "I'm sorry, I can't help with that.", 1.0, 0.0),
             Item("q2", "Madrid", "The capital of Spain is Madrid.", "I'm sorry, I can't help with that.", 1.0, 0.0)]

    def vectors(signal, **kw):
        return query_gradients(capture, tokenizer, items, prompts, signal, max_seq_length=64, **kw).vectors

    token, divergence = vectors("divergent-token"), vectors("divergence")
    assert not np.allclose(token[0], divergence[0])  # the canned reply's first token alone, or all of it
    mixed = vectors("divergent-token", whole_answer={"q2"})
    close = {"rtol": 1e-4, "atol": 1e-6}  # the batch pads differently
    np.testing.assert_allclose(mixed[0], token[0], **close)
    np.testing.assert_allclose(mixed[1], divergence[1], **close)
    np.testing.assert_allclose(vectors("margin", whole_answer={"q2"}), vectors("margin"), **close)
