"""Sentence boundaries of span drill-down: abbreviations, initials, decimals, lists, quotes and CJK punctuation."""

from __future__ import annotations

import numpy as np
import pytest

from gradian.data import Message, make_example
from gradian.query import sentence_spans, span_blames


def sentences(text: str) -> list[str]:
    return [text[a:b] for a, b in sentence_spans(text)]


@pytest.mark.parametrize(("text", "expected"), [
    ("The U.S. capital is Washington. It is on the Potomac.",
     ["The U.S. capital is Washington.", "It is on the Potomac."]),
    ("He moved to the U.S. He works in Boston.", ["He moved to the U.S.", "He works in Boston."]),
    ("Dr. Smith met Mrs. Jones at 3 p.m. yesterday. They talked.",
     ["Dr. Smith met Mrs. Jones at 3 p.m. yesterday.", "They talked."]),
    ("J. R. R. Tolkien and George W. Bush never met. True.",
     ["J. R. R. Tolkien and George W. Bush never met.", "True."]),
    ("Pi is 3.14 and e is 2.718. Both are irrational.", ["Pi is 3.14 and e is 2.718.", "Both are irrational."]),
    ("Eat fruit, e.g. apples, i.e. anything sweet. Then rest.",
     ["Eat fruit, e.g. apples, i.e. anything sweet.", "Then rest."]),
    ("We packed pens, paper, etc. We left at noon.", ["We packed pens, paper, etc.", "We left at noon."]),
    ("Smith et al. Nature reported it. See Fig. 3 and No. 5. Say no. Then stop.",
     ["Smith et al. Nature reported it.", "See Fig. 3 and No. 5.", "Say no.", "Then stop."]),
    ("1. Preheat the oven.\n2. Bake for 20 min.", ["1. Preheat the oven.", "2. Bake for 20 min."]),
    ('"Why?" she asked. "Because!" He left.', ['"Why?" she asked.', '"Because!"', "He left."]),
    ("Wait... what? Nothing... It was fine.", ["Wait... what?", "Nothing...", "It was fine."]),
    ("Paris is the capital. It is big!  Rome is in Spain.\nDone",
     ["Paris is the capital.", "It is big!", "Rome is in Spain.", "Done"]),
])
def test_western_sentences(text, expected):
    assert sentences(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("巴黎是法国的首都。柏林是德国的首都！你知道吗？知道。",
     ["巴黎是法国的首都。", "柏林是德国的首都！", "你知道吗？", "知道。"]),
    ("东京是日本的首都。“真的吗？”他问。", ["东京是日本的首都。", "“真的吗？”", "他问。"]),
    ("「はい。」と彼は言った。東京は日本の首都です。", ["「はい。」と彼は言った。", "東京は日本の首都です。"]),
    ("这是中文。 This is English. 日本語です！", ["这是中文。", "This is English.", "日本語です！"]),
])
def test_cjk_sentences_split_without_spaces(text, expected):
    assert sentences(text) == expected


def test_offsets_are_exact_and_whitespace_is_trimmed():
    text = "  The U.S. capital is Washington.  \n\n  巴黎是首都。柏林也是。 \n"
    spans = sentence_spans(text)
    assert [text[a:b] for a, b in spans] == ["The U.S. capital is Washington.", "巴黎是首都。", "柏林也是。"]
    assert all(not text[a].isspace() and not text[b - 1].isspace() for a, b in spans)
    assert sentence_spans("   ") == [] and sentence_spans("") == []


def test_drill_down_blames_whole_sentences_with_abbreviations():
    """An answer naming "the U.S." is blamed as two sentences, each covering its own tokens."""
    from gradian.grads import GradientCapture
    from gradian.model.loaded import LoadedModel
    from tests.support.tiny import tiny_llama, tiny_lora, tiny_tokenizer

    tokenizer = tiny_tokenizer("chatml")
    loaded = LoadedModel(tiny_lora(tiny_llama(tokenizer, seed=3), r=4, seed=4), tokenizer)
    capture = GradientCapture(loaded, loss_reduction="sum")
    answer = "The U.S. capital is Washington. Dr. Smith lives in Paris."
    example = make_example(0, messages=(Message("user", "Where?"), Message("assistant", answer)))
    spans = span_blames(capture, tokenizer, example, np.ones(capture.dim), max_seq_length=128, measure="restricted")
    assert [s.text for s in spans] == ["The U.S. capital is Washington.", "Dr. Smith lives in Paris."]
    assert [answer[s.char_start:s.char_end] for s in spans] == [s.text for s in spans]
    assert spans[0].token_end <= spans[1].token_start and all(s.token_end > s.token_start for s in spans)
