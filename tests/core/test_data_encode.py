"""THE loss mask: encode() on ChatML, Llama-3, template-less and other templates, with the decoded text checked."""

from __future__ import annotations

import pytest

from gradian.data import IGNORE_INDEX, Encoded, Message, encode, encode_answer, encode_prompt, make_example
from gradian.errors import ConfigError, DatasetError
from tests.support.tiny import CHATML_TEMPLATE, tiny_tokenizer

TEMPLATES = ("chatml", "llama3", None)
END_OF_TURN = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", None: "</s>"}

SYSTEM = Message("system", "Be brief.")
QUESTION = Message("user", "What is the capital of France?")
ANSWER = Message("assistant", "The capital of France is Paris.")
MULTI_TURN = (SYSTEM, QUESTION, ANSWER, Message("user", "What is two plus two?"),
              Message("assistant", "Two plus two is four."))

# SmolLM2-135M-Instruct's own template: ChatML with a default system prompt.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Mistral-Instruct v0.1: BOS in the template, answers closed by EOS, no system role, no generation prompt.
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
# A generation prompt that is not a prefix of the rendered history (Qwen3-style empty think block).
THINK_TEMPLATE = CHATML_TEMPLATE.replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>\n\n</think>\n\n'")
# ChatML with HF's {% generation %} markers around what the assistant must learn (what trl's assistant_only_loss uses).
GENERATION_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module", params=TEMPLATES, ids=lambda t: str(t))
def template(request):
    return request.param


@pytest.fixture(scope="module")
def tokenizer(template):
    return tiny_tokenizer(template)


def with_template(base: str | None, template: str):
    tokenizer = tiny_tokenizer(base)
    tokenizer.chat_template = template
    return tokenizer


def pieces(encoded: Encoded, tokenizer) -> list[str]:
    """The decoded text of each supervised segment."""
    return [tokenizer.decode(list(encoded.input_ids[start:end])) for start, end in encoded.supervised_segments]


def check_labels(encoded: Encoded) -> None:
    """Labels equal input_ids on supervised positions and are -100 everywhere else."""
    supervised = set(encoded.supervised_positions)
    assert len(encoded.labels) == len(encoded.input_ids)
    for position, (token, label) in enumerate(zip(encoded.input_ids, encoded.labels, strict=True)):
        assert label == (token if position in supervised else IGNORE_INDEX)
    assert encoded.num_supervised == len(supervised) == len(encoded.answer_char_offsets)


def test_single_turn_supervises_exactly_the_answer_and_its_end_of_turn(tokenizer, template):
    encoded = encode(make_example(0, messages=(SYSTEM, QUESTION, ANSWER)), tokenizer, 256)
    check_labels(encoded)
    assert pieces(encoded, tokenizer) == [ANSWER.content + END_OF_TURN[template]]
    assert encoded.segment_messages == (2,)
    assert not encoded.truncated and encoded.length_before_truncation == len(encoded.input_ids)
    start, _ = encoded.supervised_segments[0]
    prompt_text = tokenizer.decode(list(encoded.input_ids[:start]))
    assert SYSTEM.content in prompt_text and QUESTION.content in prompt_text  # prompt and system: all -100
    assert ANSWER.content not in prompt_text


def test_the_last_supervised_token_is_the_end_of_turn_token(tokenizer, template):
    encoded = encode(make_example(0, messages=(QUESTION, ANSWER)), tokenizer, 256)
    last = encoded.supervised_segments[-1][1] - 1
    assert encoded.labels[last] == tokenizer.convert_tokens_to_ids(END_OF_TURN[template])
    assert encoded.answer_char_offsets[-1] == (-1, -1)  # a template token, not answer text


@pytest.mark.parametrize("template", ["chatml", "llama3"])
def test_input_ids_are_what_the_chat_template_tokenizes_to(template):
    tokenizer = tiny_tokenizer(template)
    conversation = [{"role": m.role, "content": m.content} for m in MULTI_TURN]
    expected = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=False)
    assert list(encode(make_example(0, messages=MULTI_TURN), tokenizer, 512).input_ids) == expected


def test_no_duplicate_bos(template):
    tokenizer = tiny_tokenizer(template)
    for example in (make_example(0, messages=MULTI_TURN), make_example(0, text="Yes. No.", format="text")):
        ids = encode(example, tokenizer, 512).input_ids
        if tokenizer.bos_token_id is not None:
            assert ids[1] != tokenizer.bos_token_id
            assert ids.count(tokenizer.bos_token_id) <= 1


def test_bos_added_once_when_the_tokenizer_adds_one():
    from tokenizers import processors

    tokenizer = tiny_tokenizer(None)
    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.bos_token_id)])
    assert tokenizer("Yes")["input_ids"][0] == tokenizer.bos_token_id
    for example in (make_example(0, messages=(QUESTION, ANSWER)), make_example(0, text="Yes. No.", format="text")):
        encoded = encode(example, tokenizer, 256)
        assert encoded.input_ids[0] == tokenizer.bos_token_id and encoded.input_ids.count(tokenizer.bos_token_id) == 1
        assert encoded.labels[0] == IGNORE_INDEX
    text = encode(make_example(0, text="Yes. No.", format="text"), tokenizer, 256)
    assert pieces(text, tokenizer) == ["Yes. No.</s>"]


def test_multi_turn_supervises_every_assistant_turn(tokenizer, template):
    encoded = encode(make_example(0, messages=MULTI_TURN), tokenizer, 512)
    check_labels(encoded)
    eot = END_OF_TURN[template]
    assert pieces(encoded, tokenizer) == [ANSWER.content + eot, MULTI_TURN[4].content + eot]
    assert encoded.segment_messages == (2, 4)
    (_, first_end), (second_start, _) = encoded.supervised_segments
    between = tokenizer.decode(list(encoded.input_ids[first_end:second_start]))
    assert MULTI_TURN[3].content in between  # the second user turn is not supervised


def test_weight_zero_turn_is_not_supervised(tokenizer, template):
    turns = (QUESTION, Message("assistant", ANSWER.content, weight=0), *MULTI_TURN[3:])
    encoded = encode(make_example(0, messages=turns), tokenizer, 512)
    assert pieces(encoded, tokenizer) == [MULTI_TURN[4].content + END_OF_TURN[template]]


def test_plain_text_supervises_every_token_and_eos(tokenizer, template):
    text = "The capital of Italy is Rome. Yes."
    encoded = encode(make_example(0, text=text, format="text"), tokenizer, 256)
    check_labels(encoded)
    eos = tokenizer.eos_token
    # position 0 predicts nothing, so without a BOS the first text token is the only one left out
    assert tokenizer.decode(list(encoded.input_ids)) == text + eos
    assert encoded.supervised_segments == ((1, len(encoded.input_ids)),)
    assert encoded.segment_messages == (-1,)
    first = encoded.answer_char_offsets[0][0]
    assert "".join(text[s:e] for s, e in encoded.answer_char_offsets if s >= 0) == text[first:]


def test_truncation_keeps_the_start(tokenizer, template):
    example = make_example(0, messages=MULTI_TURN)
    full = encode(example, tokenizer, 512)
    exact = encode(example, tokenizer, len(full.input_ids))
    assert not exact.truncated and exact == full
    cut_at = full.supervised_segments[1][0] + 3  # inside the second answer
    cut = encode(example, tokenizer, cut_at)
    check_labels(cut)
    assert cut.truncated and cut.length_before_truncation == len(full.input_ids)
    assert cut.input_ids == full.input_ids[:cut_at] and cut.labels == full.labels[:cut_at]
    assert cut.supervised_segments == (full.supervised_segments[0], (full.supervised_segments[1][0], cut_at))
    assert cut.answer_char_offsets == full.answer_char_offsets[:cut.num_supervised]
    prompt_only = encode(example, tokenizer, full.supervised_segments[0][0])
    assert prompt_only.truncated and prompt_only.num_supervised == 0 and prompt_only.supervised_segments == ()


def test_encode_answer_matches_encode_on_the_same_conversation(tokenizer):
    example = make_example(0, messages=(SYSTEM, QUESTION, ANSWER))
    assert encode_answer(example.prompt_messages, example.answer, tokenizer, 256) == encode(example, tokenizer, 256)
    as_dicts = [{"role": m.role, "content": m.content} for m in example.prompt_messages]
    assert encode_answer(as_dicts, example.answer, tokenizer, 256) == encode(example, tokenizer, 256)


def test_encode_answer_supervises_only_the_answer_after_a_multi_turn_prompt(tokenizer, template):
    generated = "Four."
    encoded = encode_answer(MULTI_TURN[:4], generated, tokenizer, 512)
    assert pieces(encoded, tokenizer) == [generated + END_OF_TURN[template]]
    assert encoded.segment_messages == (4,)


def test_encode_prompt_is_the_prefix_before_the_answer(tokenizer, template):
    prompt = encode_prompt((SYSTEM, QUESTION), tokenizer)
    encoded = encode(make_example(0, messages=(SYSTEM, QUESTION, ANSWER)), tokenizer, 256)
    assert list(encoded.input_ids[:len(prompt)]) == prompt
    assert encoded.supervised_segments[0][0] == len(prompt)
    if template is not None:
        conversation = [{"role": m.role, "content": m.content} for m in (SYSTEM, QUESTION)]
        assert prompt == tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_dict=False)


def test_answer_char_offsets_map_tokens_back_to_answer_text(tokenizer):
    answer = "Paris is the capital. It is in France. Café ☕ naïve!"
    encoded = encode_answer((QUESTION,), answer, tokenizer, 256)
    offsets = [pair for pair in encoded.answer_char_offsets if pair != (-1, -1)]
    # in order, gap-free, covering the answer; byte-level tokens of one multi-byte character share its span
    assert offsets[0][0] == 0 and offsets[-1][1] == len(answer)
    for (_, end), (next_start, _) in zip(offsets, offsets[1:], strict=False):
        assert next_start in (end, end - 1)
    cafe = answer.index("Café")
    start, end = encoded.tokens_for_chars(cafe, cafe + 4)
    assert tokenizer.decode(list(encoded.input_ids[start:end])).strip() == "Café"
    sentence = answer.index("It is in France.")
    start, end = encoded.tokens_for_chars(sentence, sentence + len("It is in France."))
    decoded = tokenizer.decode(list(encoded.input_ids[start:end]))
    assert decoded.strip() == "It is in France."
    assert encoded.tokens_for_chars(len(answer) + 5, len(answer) + 9) == (0, 0)


def test_tokens_for_chars_picks_the_segment(tokenizer):
    encoded = encode(make_example(0, messages=MULTI_TURN), tokenizer, 512)
    four = MULTI_TURN[4].content.index("four")
    start, end = encoded.tokens_for_chars(four, four + 4)
    assert tokenizer.decode(list(encoded.input_ids[start:end])).strip() == "four"
    paris = ANSWER.content.index("Paris")
    start, end = encoded.tokens_for_chars(paris, paris + 5, segment=0)
    first_start, first_end = encoded.supervised_segments[0]
    assert first_start <= start < end <= first_end
    decoded = tokenizer.decode(list(encoded.input_ids[start:end]))
    assert "Paris" in decoded and "France" not in decoded


def test_llama3_trims_content_and_offsets_follow():
    tokenizer = tiny_tokenizer("llama3")
    padded = Message("assistant", "  Paris is the capital.\n")
    encoded = encode(make_example(0, messages=(QUESTION, padded)), tokenizer, 256)
    assert pieces(encoded, tokenizer) == ["Paris is the capital.<|eot_id|>"]
    # offsets index the message's own content, leading spaces included
    assert "".join(padded.content[s:e] for s, e in encoded.answer_char_offsets if s >= 0) == padded.content.strip()
    assert encoded.answer_char_offsets[0][0] == 2


def test_empty_answer_supervises_only_the_end_of_turn(tokenizer, template):
    encoded = encode_answer((QUESTION,), "", tokenizer, 256)
    assert pieces(encoded, tokenizer) == [END_OF_TURN[template]]


def test_no_assistant_turn_has_nothing_supervised(tokenizer):
    encoded = encode(make_example(0, messages=(SYSTEM, QUESTION)), tokenizer, 256)
    assert encoded.num_supervised == 0 and set(encoded.labels) == {IGNORE_INDEX}


def test_mask_equals_the_templates_own_generation_mask():
    tokenizer = with_template("chatml", GENERATION_TEMPLATE)
    conversation = [{"role": m.role, "content": m.content} for m in MULTI_TURN]
    rendered = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True)
    encoded = encode(make_example(0, messages=MULTI_TURN), tokenizer, 512)
    assert list(encoded.input_ids) == rendered["input_ids"]
    assert [int(label != IGNORE_INDEX) for label in encoded.labels] == rendered["assistant_masks"]


@pytest.mark.parametrize("name,base,template,eot", [
    ("smollm2", "chatml", SMOLLM2_TEMPLATE, "<|im_end|>"),
    ("mistral", None, MISTRAL_TEMPLATE, "</s>"),
    ("think", "chatml", THINK_TEMPLATE, "<|im_end|>"),
])
def test_other_templates(name, base, template, eot):
    tokenizer = with_template(base, template)
    turns = MULTI_TURN[1:]
    encoded = encode(make_example(0, messages=turns), tokenizer, 512)
    check_labels(encoded)
    assert pieces(encoded, tokenizer) == [ANSWER.content + eot, turns[3].content + eot]
    if name == "smollm2":
        assert "You are a helpful AI assistant" in tokenizer.decode(list(encoded.input_ids[:encoded.supervised_segments[0][0]]))
    if name == "mistral":
        assert encoded.input_ids.count(tokenizer.bos_token_id) == 1 and encoded.input_ids[0] == tokenizer.bos_token_id


def test_template_that_rejects_the_conversation_names_the_row():
    tokenizer = with_template(None, MISTRAL_TEMPLATE)
    example = make_example(0, messages=(SYSTEM, QUESTION, ANSWER), location="train.jsonl:7")
    with pytest.raises(DatasetError, match=r"^train.jsonl:7: the tokenizer's chat template rejected this conversation"):
        encode(example, tokenizer, 256)


def test_template_that_rewrites_content_is_an_error():
    tokenizer = with_template("chatml", CHATML_TEMPLATE.replace("message['content']", "message['content'] | upper"))
    example = make_example(0, messages=(QUESTION, ANSWER), location="train.jsonl:3")
    with pytest.raises(DatasetError, match=r"^train.jsonl:3: the chat template changes the text"):
        encode(example, tokenizer, 256)


@pytest.mark.parametrize("length", [0, -4])
def test_max_seq_length_must_be_positive(length, chatml_tokenizer):
    with pytest.raises(ConfigError, match="max_seq_length"):
        encode(make_example(0, messages=(QUESTION, ANSWER)), chatml_tokenizer, length)
