"""diagnose's batched encoding gives exactly encode()'s records: the one loss mask, only faster."""

from __future__ import annotations

import pytest

from gradian.data import Message, encode, make_example
from gradian.diagnose.encoding import encode_examples
from gradian.errors import DatasetError
from tests.support.tiny import tiny_tokenizer

CONVERSATIONS = [
    [("user", "What is the capital of France?"), ("assistant", "The capital of France is Paris.")],
    [("system", "Answer in one short sentence."), ("user", "Two plus two?"), ("assistant", "Two plus two is four.")],
    [("user", "Hello!"), ("assistant", "Hello! How are you?"), ("user", "I am fine."), ("assistant", "Yes. No. Maybe.")],
    [("user", "Tokyo?"), ("assistant", "  Tokyo Japan  ")],  # whitespace a template may trim
    [("user", "Nothing to answer")],
    [("user", "Empty"), ("assistant", "")],
]


def examples():
    rows = [make_example(i, messages=[Message(role, content) for role, content in turns])
            for i, turns in enumerate(CONVERSATIONS)]
    rows.append(make_example(len(rows), messages=[Message("user", "a"), Message("assistant", "skip me", weight=0),
                                                  Message("user", "b"), Message("assistant", "learn me")]))
    rows.append(make_example(len(rows), text="The capital of Italy is Rome.", format="text"))
    return rows


@pytest.mark.parametrize("template", ["chatml", "llama3", None])
@pytest.mark.parametrize("max_length", [1 << 30, 12])
def test_equal_to_encode(template, max_length):
    tokenizer = tiny_tokenizer(template)
    rows = examples()
    batched, failures = encode_examples(rows, tokenizer, max_length)
    assert failures == []
    assert batched == [encode(example, tokenizer, max_length) for example in rows]


def test_a_template_that_rejects_a_conversation_is_reported_like_encode():
    tokenizer = tiny_tokenizer("chatml")
    tokenizer.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                               "{{ raise_exception('no system role') }}{% endif %}"
                               "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
                               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    rows = examples()
    batched, failures = encode_examples(rows, tokenizer, 1 << 30)
    assert [example.index for example, _ in failures] == [1]
    with pytest.raises(DatasetError) as caught:
        encode(rows[1], tokenizer, 1 << 30)
    assert failures[0][1] == caught.value.message
    assert batched[1] is None
    assert [b for i, b in enumerate(batched) if i != 1] == [encode(e, tokenizer, 1 << 30) for i, e in enumerate(rows) if i != 1]


@pytest.mark.embedded
def test_equal_to_encode_with_the_smollm2_tokenizer():
    from gradian.model import embedded

    if embedded.package_dir() is None or not embedded.is_complete(embedded.cached_model_dir()):
        pytest.skip("the embedded SmolLM2 is not installed and cached")
    from gradian.model.base import load_tokenizer

    tokenizer = load_tokenizer(embedded.EMBEDDED_ALIAS)
    rows = examples()
    assert encode_examples(rows, tokenizer, 1 << 30)[0] == [encode(example, tokenizer, 1 << 30) for example in rows]
