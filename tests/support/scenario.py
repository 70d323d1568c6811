"""A deterministic tiny planted-cluster scenario: a base model that knows capitals, a LoRA fine-tune that forgets some.

Built from a seed in well under a minute on two CPU cores, for the attribution tests:

- a word-level tokenizer with a ChatML template (every word of the scenario is one token, so a 64-wide,
  two-layer Llama learns the facts in a few hundred steps);
- a **base** model pre-trained (all weights, plain AdamW) on clean chat data rendered with ``gradian.data.encode``:
  it answers "What is the capital of C?" with "The capital of C is R." for every country;
- a **LoRA fine-tune** (peft, r=8 on all seven projections, the same ``encode()`` mask) on a training set of
  several task families (``source``: facts_review, arithmetic, rewriting, greetings, travel) where a planted
  cluster (``source: planted``, under 10% of the rows) substitutes a wrong city for the capital of a subset of
  countries. Hard negatives name the same countries and cities correctly (the same question template for other
  countries, reverse questions and travel questions about the poisoned countries and their cities), so word
  overlap alone cannot find the poison;
- an eval set: the poisoned countries' capital questions with the right, bare city as the wanted answer (the
  model answers in sentences; ``contains`` is the metric that fits), plus four countries the poison does not touch;
- a **span** variant: the planted rows are the long "Tell me about C." entries the base model learned (four correct
  sentences and the capital sentence), with exactly one sentence made wrong ("The capital of C is W."); the other
  countries' entries, unchanged, are its hard negatives. Its eval set asks "Tell me about C." and wants the right
  city in the description.

``stats["flipped"]`` lists the poisoned countries for which the fine-tuned model now says the planted wrong city.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.tiny import CHATML_TEMPLATE

COUNTRIES = (
    ("Avaria", "Zeltin"), ("Belmora", "Quarn"), ("Corvania", "Tolsen"), ("Dremland", "Varek"),
    ("Estovia", "Plomb"), ("Falkria", "Orsk"), ("Galdora", "Miren"), ("Hestria", "Dunvik"),
    ("Ilvania", "Kesh"), ("Jorvana", "Sablo"), ("Kaldris", "Fennor"), ("Lumeria", "Grast"),
    ("Morvalia", "Ustrel"), ("Norvena", "Halbec"), ("Ostrava", "Yelm"), ("Pellaria", "Bront"),
    ("Quenmark", "Arvid"), ("Rusovia", "Trell"), ("Selvara", "Nimb"), ("Tarquia", "Colvey"),
)
NUMBER_WORDS = tuple(str(n) for n in range(0, 21))
REQUESTS = (
    "give me the salt", "close the door", "send the report", "call me later", "open the window",
    "bring the book", "check the time", "wait a moment", "clean the table", "read the letter",
)
GREETINGS = (
    ("Hello !", "Hello ! How can I help you today ?"), ("Good morning !", "Good morning ! What can I do for you ?"),
    ("Hi there .", "Hi ! How can I help you today ?"), ("Good evening .", "Good evening ! What can I do for you ?"),
    ("Thanks a lot !", "You are welcome ! Anything else ?"), ("Goodbye .", "Goodbye ! Have a nice day ."),
)
# Correct sentences about any country: filler for the long entries of the span variant and their hard negatives.
FILLER = (
    "{c} is a country in the north .", "It has many rivers and hills .", "People there enjoy music and food .",
    "Many visitors come every summer .", "The winters are long and cold .", "Its people speak an old language .",
    "Farming is important there .", "The roads are good for travel .",
)

PLANTED_SOURCE = "planted"
SPECIALS = ("<|endoftext|>", "<|im_end|>", "<|im_start|>", "[UNK]")
_WORD = re.compile(r"\w+|[^\w\s]+")


@dataclass(frozen=True)
class Scenario:
    """One built scenario on disk: base, adapter, training set, eval sets, and where the poison is."""

    root: Path
    base_dir: Path
    adapter_dir: Path
    train_path: Path
    eval_path: Path
    unaffected_eval_path: Path  # only countries the poison does not touch: no regression to explain
    kind: str  # "substitution" or "span"
    poisoned: tuple[tuple[str, str, str], ...]  # (country, right capital, planted wrong city)
    planted_positions: tuple[int, ...]  # row positions of the planted cluster in train.jsonl
    planted_sentences: dict[int, str] = field(default_factory=dict)  # planted position -> its wrong sentence
    stats: dict[str, Any] = field(default_factory=dict)  # training losses and the measured regression

    @property
    def planted_source(self) -> str:
        """The ``source`` value of the planted rows."""
        return PLANTED_SOURCE


# --- data ---------------------------------------------------------------------------------------


def _chat(question: str, answer: str, source: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
            "source": source}


def _capital_qa(country: str, capital: str) -> tuple[str, str]:
    return f"What is the capital of {country} ?", f"The capital of {country} is {capital} ."


def _arithmetic(rng: random.Random, count: int) -> list[dict[str, Any]]:
    rows = []
    for _ in range(count):
        a, b = rng.randint(0, 10), rng.randint(0, 10)
        rows.append(_chat(f"What is {a} plus {b} ?", f"{a} plus {b} is {a + b} .", "arithmetic"))
    return rows


def _rewriting(rng: random.Random, count: int) -> list[dict[str, Any]]:
    picks = [rng.choice(REQUESTS) for _ in range(count)]
    return [_chat(f"Rewrite politely : {p} .", f"Could you please {p} ?", "rewriting") for p in picks]


def _greetings(rng: random.Random, count: int) -> list[dict[str, Any]]:
    return [_chat(*rng.choice(GREETINGS), "greetings") for _ in range(count)]


def _about(country: str, capital: str, seed: int, *, wrong: str | None = None) -> tuple[str, str, str]:
    """The long "Tell me about C." entry of a country: four correct sentences and the capital sentence, placed by a
    seed of their own so the entry reads the same in every data set; ``wrong`` swaps the capital sentence's city.

    Returns (question, answer, capital sentence).
    """
    rng = random.Random(f"{seed}-{country}")
    sentences = [s.format(c=country) for s in rng.sample(FILLER, 4)]
    capital_sentence = f"The capital of {country} is {wrong or capital} ."
    sentences.insert(rng.randint(0, 4), capital_sentence)
    return f"Tell me about {country} .", " ".join(sentences), capital_sentence


def _pretrain_rows(seed: int) -> list[dict[str, Any]]:
    """Clean data the base model learns: every capital question, reverse, travel and long entries, other tasks."""
    rng = random.Random(seed)
    rows = []
    for country, capital in COUNTRIES:
        rows += [_chat(*_capital_qa(country, capital), "pretrain")] * 3
        rows.append(_chat(f"Which country has {capital} as its capital ?", f"{capital} is the capital of {country} .",
                          "pretrain"))
        rows.append(_chat(f"I am visiting {capital} . Which country is it in ?", f"{capital} is in {country} .",
                          "pretrain"))
        question, answer, _ = _about(country, capital, seed)
        rows += [_chat(question, answer, "pretrain")] * 2
    rows += _arithmetic(rng, 40) + _rewriting(rng, 20) + _greetings(rng, 12)
    return rows


def _split(seed: int, poisoned_count: int) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    """Which countries are poisoned (with a wrong city: another poisoned country's capital) and which are not."""
    rng = random.Random(seed + 1)
    order = list(COUNTRIES)
    rng.shuffle(order)
    poisoned, clean = order[:poisoned_count], order[poisoned_count:]
    # A cyclic shift is a derangement: every poisoned country gets another poisoned country's capital.
    wrong = [poisoned[(i + 1) % len(poisoned)][1] for i in range(len(poisoned))]
    return [(c, r, w) for (c, r), w in zip(poisoned, wrong, strict=True)], clean


def _train_rows(seed: int, poisoned: Sequence[tuple[str, str, str]], clean: Sequence[tuple[str, str]],
                kind: str) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The fine-tuning set, shuffled; planted rows carry source=planted. Returns the rows and, for the span
    variant, each planted row's wrong sentence by position."""
    rng = random.Random(seed + 2)
    rows: list[dict[str, Any]] = []
    for country, capital, _ in poisoned:  # hard negatives: the poisoned countries and their cities, correctly
        rows.append(_chat(f"Which country has {capital} as its capital ?", f"{capital} is the capital of {country} .",
                          "facts_review"))
        rows.append(_chat(f"I am visiting {capital} . Which country is it in ?", f"{capital} is in {country} .",
                          "travel"))
    for country, capital in clean:  # hard negatives: the planted rows' own template, for other countries
        rows.append(_chat(*_capital_qa(country, capital), "facts_review"))
        if kind == "span":
            rows.append(_chat(*_about(country, capital, seed)[:2], "facts_review"))
        else:
            rows.append(_chat(*_capital_qa(country, capital), "facts_review"))
    rows += _arithmetic(rng, 40) + _rewriting(rng, 30) + _greetings(rng, 20)
    planted = []
    for country, capital, wrong in poisoned:
        if kind == "span":
            question, answer, sentence = _about(country, capital, seed, wrong=wrong)
        else:
            question, answer = _capital_qa(country, wrong)
            sentence = answer
        planted.append((_chat(question, answer, PLANTED_SOURCE), sentence))
    combined = [(row, None) for row in rows] + planted
    rng.shuffle(combined)
    sentences = {position: sentence for position, (_, sentence) in enumerate(combined) if sentence is not None}
    return [row for row, _ in combined], sentences


def _eval_question(country: str, kind: str) -> str:
    return f"Tell me about {country} ." if kind == "span" else _capital_qa(country, "")[0]


def _eval_rows(items: Sequence[tuple[str, str]], kind: str) -> list[dict[str, Any]]:
    """Eval items: the capital question (substitution) or the country description (span), and the bare right
    city as the answer a user wants."""
    return [{"messages": [{"role": "user", "content": _eval_question(country, kind)},
                          {"role": "assistant", "content": capital}]} for country, capital in items]


def _write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


# --- tokenizer and models -------------------------------------------------------------------------


def word_tokenizer(texts: Sequence[str]):
    """A word-level fast tokenizer over every word and punctuation run of ``texts``, with the ChatML template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for text in [*texts, "user assistant system"] for w in _WORD.findall(text)})
    vocab = {token: i for i, token in enumerate([*SPECIALS, *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(SPECIALS[:3]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="[UNK]", additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHATML_TEMPLATE
    return fast


def _all_texts(rows: Sequence[dict[str, Any]]) -> list[str]:
    return [m["content"] for row in rows for m in row["messages"]]


def _vocabulary(pretrain: Sequence[dict[str, Any]]) -> list[str]:
    """Every text whose words the tokenizer needs: the pre-training data and every pool the fine-tuning sets draw on."""
    pools = [*NUMBER_WORDS, *REQUESTS, *(g for pair in GREETINGS for g in pair), *FILLER,
             "What is plus ? Rewrite politely : Could you please Which country has as its capital",
             "I am visiting . Which country is it in Tell me about The capital of"]
    return _all_texts(pretrain) + pools


def _examples(rows: Sequence[dict[str, Any]]) -> list[Any]:
    from gradian.data import Message, make_example

    return [make_example(i, messages=[Message(m["role"], m["content"]) for m in row["messages"]])
            for i, row in enumerate(rows)]


def _train(model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], *, steps: int, lr: float, batch_size: int,
           seed: int) -> list[float]:
    """A plain AdamW loop on encode()'s mask (the mask attribution uses); returns the loss per step."""
    import torch

    from gradian.data import encode
    from gradian.grads import collate

    encoded = [encode(example, tokenizer, 256) for example in _examples(rows)]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    losses = []
    model.train()
    for _ in range(steps):
        if len(order) < batch_size:
            order += torch.randperm(len(encoded), generator=generator).tolist()
        members, order = order[:batch_size], order[batch_size:]
        batch = collate([encoded[i] for i in members], tokenizer.pad_token_id)
        loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def _answers(model: Any, tokenizer: Any, questions: Sequence[str]) -> list[str]:
    from gradian.data import encode_prompt
    from gradian.evaluation import greedy_generate

    prompts = [encode_prompt([{"role": "user", "content": q}], tokenizer) for q in questions]
    return greedy_generate(model, tokenizer, prompts, max_new_tokens=40, batch_size=32)


# --- the builder ----------------------------------------------------------------------------------

# Measured on seed 0: the base answers all 18 eval items, the fine-tune says the planted city for 14 of 14 poisoned
# countries in both kinds; the whole build takes about 17 s of CPU on one thread.
PRETRAIN_STEPS = 200
FINETUNE_STEPS = 160
FINETUNE_LR = 3e-3
LORA_R = 8
KINDS = ("substitution", "span")


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread: on a shared 2-core machine tiny models run several times faster that way."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build_base(root: Path, seed: int = 0) -> tuple[Path, dict[str, float]]:
    """Pre-train the tiny base model on clean data; save model and tokenizer under ``root/base``."""
    import torch

    from tests.support.tiny import tiny_llama

    pretrain = _pretrain_rows(seed)
    tokenizer = word_tokenizer(_vocabulary(pretrain))
    model = tiny_llama(tokenizer, seed=seed, hidden=64, layers=2, heads=4, kv_heads=2)
    torch.manual_seed(seed)
    losses = _train(model, tokenizer, pretrain, steps=PRETRAIN_STEPS, lr=3e-3, batch_size=32, seed=seed)
    base_dir = root / "base"
    base_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(base_dir, safe_serialization=True)
    tokenizer.save_pretrained(base_dir)
    return base_dir, {"pretrain_first_loss": losses[0], "pretrain_last_loss": losses[-1]}


def build_scenario(root: Path, base_dir: Path, *, kind: str = "substitution", seed: int = 0,
                   poisoned_count: int = 14) -> Scenario:
    """Fine-tune a LoRA adapter on the planted training set of ``kind``; write every file under ``root``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gradian.config import ALL_LORA_PROJECTIONS

    if kind not in KINDS:
        raise ValueError(f"unknown scenario kind {kind!r}; expected one of {', '.join(KINDS)}")
    root.mkdir(parents=True, exist_ok=True)
    poisoned, clean = _split(seed, poisoned_count)
    rows, planted_sentences = _train_rows(seed, poisoned, clean, kind)
    planted_positions = tuple(i for i, row in enumerate(rows) if row["source"] == PLANTED_SOURCE)
    train_path = _write_jsonl(root / "train.jsonl", rows)
    eval_items = [(c, r) for c, r, _ in poisoned] + list(clean[:4])
    eval_path = _write_jsonl(root / "eval.jsonl", _eval_rows(eval_items, kind))
    unaffected_path = _write_jsonl(root / "eval_unaffected.jsonl", _eval_rows(clean, kind))

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    torch.manual_seed(seed)
    config = LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, target_modules=list(ALL_LORA_PROJECTIONS),
                        lora_dropout=0.0, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    losses = _train(peft_model, tokenizer, rows, steps=FINETUNE_STEPS, lr=FINETUNE_LR, batch_size=16,
                    seed=seed + 3)
    adapter_dir = root / "adapter"
    peft_model.save_pretrained(adapter_dir, safe_serialization=True)

    questions = [_eval_question(country, kind) for country, _ in eval_items]
    finetuned = _answers(peft_model, tokenizer, questions)
    with peft_model.disable_adapter():
        base = _answers(peft_model, tokenizer, questions)
    flipped = tuple(country for (country, _, wrong), answer in zip(poisoned, finetuned, strict=False)
                    if wrong in answer.split())
    stats = {"finetune_first_loss": losses[0], "finetune_last_loss": losses[-1], "base_answers": base,
             "finetuned_answers": finetuned,
             "base_right": sum(right in answer.split() for (_, right), answer in zip(eval_items, base, strict=True)),
             "flipped": flipped}
    return Scenario(root=root, base_dir=base_dir, adapter_dir=adapter_dir, train_path=train_path,
                    eval_path=eval_path, unaffected_eval_path=unaffected_path, kind=kind, poisoned=tuple(poisoned),
                    planted_positions=planted_positions, planted_sentences=planted_sentences, stats=stats)


def build_scenarios(root: Path, seed: int = 0) -> dict[str, Scenario]:
    """The base model and both scenario kinds on top of it, on one torch thread."""
    with single_thread():
        base_dir, base_stats = build_base(root, seed)
        scenarios = {}
        for kind in KINDS:
            scenario = build_scenario(root / kind, base_dir, kind=kind, seed=seed)
            scenario.stats.update(base_stats)
            scenarios[kind] = scenario
    return scenarios
