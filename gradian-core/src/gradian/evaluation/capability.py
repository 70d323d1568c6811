"""The capability delta: score every eval item with the adapter off and on, bootstrap the paired difference."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gradian.config import EvaluationConfig
from gradian.data import encode_answer, encode_prompt
from gradian.errors import EvaluationError
from gradian.evaluation.bootstrap import paired_bootstrap
from gradian.evaluation.generation import Progress, greedy_generate, pad_token_id
from gradian.evaluation.loglik import answer_logliks
from gradian.evaluation.metrics import get_metric
from gradian.evaluation.query_signal import QuerySignalChoice, validate_query_signal

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedTokenizerBase

    from gradian.data.examples import Example
    from gradian.model.loaded import LoadedModel

# A bootstrap of one item has no spread at all, so its "interval" says nothing about noise.
MIN_ITEMS_FOR_SIGNIFICANCE = 2


@dataclass(frozen=True)
class ItemResult:
    """One eval item scored twice: with the adapter disabled (base) and enabled (fine-tuned)."""

    id: str
    prompt: str
    wanted: str
    base_output: str | None
    finetuned_output: str | None
    base_score: float
    finetuned_score: float

    @property
    def regressed(self) -> bool:
        """True when the base model scored higher than the fine-tuned one on this item."""
        return self.base_score > self.finetuned_score


@dataclass(frozen=True)
class CapabilityResult:
    """Base vs fine-tuned on the eval set: means, delta with its paired bootstrap CI, per-item rows."""

    metric: str
    n_items: int
    base_mean: float
    finetuned_mean: float
    delta: float
    ci_low: float
    ci_high: float
    confidence: float
    bootstrap_samples: int
    seed: int
    significant: bool
    items: tuple[ItemResult, ...]
    regressed_ids: tuple[str, ...]
    query_signal: QuerySignalChoice

    @property
    def significant_regression(self) -> bool:
        """True when the CI excludes zero and the fine-tuned model is worse: a regression worth explaining."""
        return self.significant and self.delta < 0

    @property
    def regressed_items(self) -> tuple[ItemResult, ...]:
        """The items whose base score beat their fine-tuned score, in eval-set order."""
        return tuple(item for item in self.items if item.regressed)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict for report.json."""
        data = dataclasses.asdict(self)
        data["items"] = [dataclasses.asdict(item) | {"regressed": item.regressed} for item in self.items]
        data["query_signal"] = self.query_signal.to_dict()
        data["regressed_ids"] = list(self.regressed_ids)
        data["significant_regression"] = self.significant_regression
        return data


def capability_from_scores(metric: str, items: Sequence[Example], base_scores: Sequence[float],
                           finetuned_scores: Sequence[float], config: EvaluationConfig, *,
                           base_outputs: Sequence[str | None] | None = None,
                           finetuned_outputs: Sequence[str | None] | None = None) -> CapabilityResult:
    """Assemble the result from per-item scores of eval Examples: means, paired bootstrap CI, regressed ids."""
    n = len(items)
    if not (len(base_scores) == len(finetuned_scores) == n) or n == 0:
        raise ValueError("capability_from_scores needs one base and one fine-tuned score per item, and items")
    base_outputs = list(base_outputs) if base_outputs is not None else [None] * n
    finetuned_outputs = list(finetuned_outputs) if finetuned_outputs is not None else [None] * n
    interval = paired_bootstrap(base_scores, finetuned_scores, samples=config.bootstrap_samples,
                                confidence=config.confidence, seed=config.seed)
    rows = tuple(
        ItemResult(id=example.id, prompt=_prompt_text(example), wanted=example.answer,
                   base_output=base_out, finetuned_output=ft_out,
                   base_score=float(base), finetuned_score=float(ft))
        for example, base, ft, base_out, ft_out in zip(items, base_scores, finetuned_scores, base_outputs,
                                                       finetuned_outputs, strict=True)
    )
    return CapabilityResult(
        metric=metric,
        n_items=n,
        base_mean=sum(r.base_score for r in rows) / n,
        finetuned_mean=sum(r.finetuned_score for r in rows) / n,
        delta=interval.delta,
        ci_low=interval.low,
        ci_high=interval.high,
        confidence=interval.confidence,
        bootstrap_samples=interval.samples,
        seed=interval.seed,
        significant=interval.excludes_zero and n >= MIN_ITEMS_FOR_SIGNIFICANCE,
        items=rows,
        regressed_ids=tuple(r.id for r in rows if r.regressed),
        query_signal=validate_query_signal(metric, config.query_signal),
    )


def evaluate_capability(model: LoadedModel | tuple[PeftModel, PreTrainedTokenizerBase], eval_dataset: Iterable[Example],
                        config: EvaluationConfig,
                        progress: Progress | None = None, *, max_seq_length: int | None = None) -> CapabilityResult:
    """Score the eval set with the adapter disabled and enabled and measure the capability delta.

    ``model`` is a LoadedModel (``.model`` a peft model, ``.tokenizer``) or a ``(peft_model, tokenizer)`` pair.
    ``progress(stage, done, total)`` is called after each batch, stage ``base`` or ``finetuned``.
    ``max_seq_length`` truncates prompt + answer for the ``loglik`` metric (None: no truncation).
    """
    peft_model, tokenizer = _unpack_model(model)
    metric = get_metric(config.metric)
    validate_query_signal(config.metric, config.query_signal)  # fail before minutes of generation, not after
    items = checked_eval_items(eval_dataset)
    if metric.generates_text:
        prompts = [encode_prompt(example.prompt_messages, tokenizer) for example in items]

        def run(stage: str) -> list[str]:
            return greedy_generate(peft_model, tokenizer, prompts, max_new_tokens=config.max_new_tokens,
                                   batch_size=config.batch_size, progress=progress, stage=stage)

        with peft_model.disable_adapter():
            base_outputs = run("base")
        finetuned_outputs = run("finetuned")
        base_scores = [metric.score(out, ex.answer) for out, ex in zip(base_outputs, items, strict=True)]
        finetuned_scores = [metric.score(out, ex.answer) for out, ex in zip(finetuned_outputs, items, strict=True)]
        return capability_from_scores(config.metric, items, base_scores, finetuned_scores, config,
                                      base_outputs=base_outputs, finetuned_outputs=finetuned_outputs)

    encoded = _encode_answers(items, tokenizer, max_seq_length)
    pad_id = pad_token_id(tokenizer)
    with peft_model.disable_adapter():
        base_scores = answer_logliks(peft_model, encoded, pad_id=pad_id, batch_size=config.batch_size,
                                     progress=progress, stage="base")
    finetuned_scores = answer_logliks(peft_model, encoded, pad_id=pad_id, batch_size=config.batch_size,
                                      progress=progress, stage="finetuned")
    return capability_from_scores(config.metric, items, base_scores, finetuned_scores, config)


def checked_eval_items(eval_dataset: Iterable[Example]) -> list[Example]:
    """The eval Examples as a list; an empty set or items without a prompt or an answer are EvaluationErrors."""
    items = list(eval_dataset)
    if not items:
        raise EvaluationError("the eval set is empty",
                              "give --eval-dataset a file with at least one item: a prompt and the answer you wanted")
    missing = [example.id for example in items if not (example.answer or "").strip()]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise EvaluationError(
            f"{len(missing)} eval item(s) have no wanted answer: {shown}",
            "every eval item needs a final assistant turn holding the answer you wanted",
        )
    promptless = [example.id for example in items if not example.prompt_messages]
    if promptless:
        shown = ", ".join(promptless[:5]) + (f" and {len(promptless) - 5} more" if len(promptless) > 5 else "")
        raise EvaluationError(f"{len(promptless)} eval item(s) have no prompt before the answer: {shown}",
                              "every eval item needs a user turn before the wanted answer")
    return items


def refusal_message(result: CapabilityResult) -> str:
    """Why attribution is refused for this result, with the numbers and the spec's advice."""
    numbers = (
        f"{result.metric} is {result.base_mean:.4g} for the base model and {result.finetuned_mean:.4g} fine-tuned "
        f"over {result.n_items} eval items: delta {result.delta:+.4g}, {result.confidence:.0%} CI "
        f"[{result.ci_low:+.4g}, {result.ci_high:+.4g}] ({result.bootstrap_samples} paired bootstrap resamples, "
        f"seed {result.seed})."
    )
    if result.significant and result.delta > 0:
        return (
            f"The fine-tuned model is significantly better on this eval set, not worse: {numbers} "
            "There is no regression to explain. If you expected one, check that the eval set describes the "
            "capability that got worse, with the answers you wanted."
        )
    if result.significant:
        raise ValueError("refusal_message called for a significant regression, which is attributed, not refused")
    small = (f" With {result.n_items} item(s) there is no spread to bootstrap."
             if result.n_items < MIN_ITEMS_FOR_SIGNIFICANCE else "")
    return (
        f"The capability delta is not significant: {numbers} The confidence interval includes zero, so there is "
        f"no established regression to explain, and Gradian does not attribute.{small}\n\n"
        "Usually the eval set is too small. Widen it. If you are certain the regression is real, check that "
        "evaluation.metric suits the capability, since an exact_match metric on free-form answers will measure "
        "formatting rather than correctness.\n\n"
        "Do not reach for evaluation.require_significant: false. That removes the main guard against reading "
        "noise as a result."
    )


def _prompt_text(example: Example) -> str:
    """The message the answer replies to (the last prompt turn), as the report shows it."""
    messages = example.prompt_messages
    return messages[-1].content if messages else ""


def _unpack_model(model: LoadedModel | tuple[PeftModel, PreTrainedTokenizerBase]
                  ) -> tuple[PeftModel, PreTrainedTokenizerBase]:
    """(peft_model, tokenizer) from a LoadedModel or a pair; a model without an adapter is an EvaluationError."""
    if isinstance(model, tuple):
        peft_model, tokenizer = model
    else:
        peft_model, tokenizer = model.model, model.tokenizer
    if not hasattr(peft_model, "disable_adapter"):
        raise EvaluationError("the model has no LoRA adapter, so base and fine-tuned cannot be compared",
                              "pass --adapter with the PEFT adapter directory of your fine-tune")
    return peft_model, tokenizer


def _encode_answers(items: Sequence[Example], tokenizer: PreTrainedTokenizerBase,
                    max_seq_length: int | None) -> list[tuple[list[int], list[int]]]:
    """Prompt + wanted answer per item as (input_ids, labels); an answer truncated away is an EvaluationError."""
    # No limit by default: the eval set is scored whole, however long its prompts are.
    limit = max_seq_length if max_seq_length is not None else 1 << 30
    encoded = []
    for example in items:
        enc = encode_answer(example.prompt_messages, example.answer, tokenizer, limit)
        input_ids, labels = list(enc.input_ids), list(enc.labels)
        if not any(label != -100 for label in labels[1:]):
            raise EvaluationError(f"eval item {example.id} has no answer tokens left after truncation",
                                  f"raise the max_seq_length the eval set is encoded with (now {max_seq_length})")
        encoded.append((input_ids, labels))
    return encoded
