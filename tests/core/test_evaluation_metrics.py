"""Text metrics: SQuAD-style normalization, exact_match, contains, token_f1, and the metric registry."""

from __future__ import annotations

import pytest

from gradian.errors import EvaluationError
from gradian.evaluation.metrics import METRICS, contains, exact_match, get_metric, normalize_answer, token_f1


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The capital is Paris.", "capital is paris"),
        ("  An   apple,\ta pear\n", "apple pear"),
        ("Paris,France", "paris france"),
        ("theatre anthem", "theatre anthem"),  # articles only as whole words
        ("«Paris» — ¡sí!", "paris sí"),  # Unicode punctuation goes, accents stay
        ("Ｐａｒｉｓ", "paris"),  # full-width forms
        ("STRASSE Straße", "strasse strasse"),  # casefold, not just lower
        ("", ""),
        ("...", ""),
        ("The", ""),
    ],
)
def test_normalize_answer(text, normalized):
    assert normalize_answer(text) == normalized


@pytest.mark.parametrize(
    ("predicted", "wanted", "score"),
    [
        ("Paris", "Paris", 1.0),
        ("the paris!", "Paris", 1.0),
        ("Paris.", "paris", 1.0),
        ("The capital of France is Paris.", "Paris", 0.0),
        ("Rome", "Paris", 0.0),
        ("", "", 1.0),
        ("", "Paris", 0.0),
        ("café", "cafe", 0.0),
    ],
)
def test_exact_match(predicted, wanted, score):
    assert exact_match(predicted, wanted) == score


@pytest.mark.parametrize(
    ("predicted", "wanted", "score"),
    [
        ("The capital of France is Paris.", "Paris", 1.0),
        ("The capital of France is Paris.", "the capital of France", 1.0),
        ("It is Parisian food.", "Paris", 0.0),  # whole words only
        ("Rome.", "Paris", 0.0),
        ("", "Paris", 0.0),
        ("", "", 1.0),
        ("anything", "The.", 0.0),  # a wanted answer that normalizes to nothing matches only nothing
        ("«Paris»", "paris", 1.0),
    ],
)
def test_contains(predicted, wanted, score):
    assert contains(predicted, wanted) == score


def test_token_f1_partial_overlap():
    # predicted tokens: capital is paris (3); wanted: paris france (2); overlap 1 -> P=1/3, R=1/2, F1=0.4
    assert token_f1("The capital is Paris", "Paris, France") == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("predicted", "wanted", "score"),
    [
        ("Paris", "the Paris.", 1.0),
        ("Rome", "Paris", 0.0),
        ("", "", 1.0),
        ("", "Paris", 0.0),
        ("Paris", "", 0.0),
        ("paris paris", "paris", pytest.approx(2 * 0.5 * 1.0 / 1.5)),  # repeated tokens count once each
    ],
)
def test_token_f1_edges(predicted, wanted, score):
    assert token_f1(predicted, wanted) == score


def test_registry_names_and_kinds():
    assert list(METRICS) == ["exact_match", "contains", "token_f1", "loglik"]
    assert [m.generates_text for m in METRICS.values()] == [True, True, True, False]
    assert get_metric("token_f1").score is token_f1
    assert get_metric("loglik").score is None


def test_unknown_metric_lists_the_choices():
    with pytest.raises(EvaluationError) as info:
        get_metric("bleu")
    line = info.value.one_line()
    assert "bleu" in line
    for name in METRICS:
        assert name in line
