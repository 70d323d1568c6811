"""Paired bootstrap CI of the capability delta: deterministic, and significant only for real differences."""

from __future__ import annotations

import numpy as np
import pytest

from gradian.evaluation.bootstrap import DeltaInterval, paired_bootstrap


def test_same_seed_same_interval_other_seed_other_interval():
    rng = np.random.default_rng(7)
    before = rng.integers(0, 2, 200).astype(float)
    after = rng.integers(0, 2, 200).astype(float)
    first = paired_bootstrap(before, after, samples=2000, seed=3)
    again = paired_bootstrap(before, after, samples=2000, seed=3)
    other = paired_bootstrap(before, after, samples=2000, seed=4)
    assert first == again
    assert (first.low, first.high) != (other.low, other.high)
    assert first.delta == pytest.approx(after.mean() - before.mean())


def test_clear_regression_is_significant():
    before = np.ones(40)
    after = np.r_[np.zeros(25), np.ones(15)]  # 25 of 40 items lost
    interval = paired_bootstrap(before, after, samples=5000, seed=0)
    assert interval.delta == pytest.approx(-25 / 40)
    assert interval.high < 0
    assert interval.excludes_zero


def test_identical_scores_are_not_significant():
    scores = np.linspace(0, 1, 30)
    interval = paired_bootstrap(scores, scores, samples=1000, seed=0)
    assert (interval.delta, interval.low, interval.high) == (0.0, 0.0, 0.0)
    assert not interval.excludes_zero


def test_tiny_noisy_difference_on_few_items_is_not_significant():
    before = [1, 1, 0, 1, 0, 1]
    after = [1, 0, 1, 1, 0, 0]  # one net loss out of six, with a gain alongside
    interval = paired_bootstrap(before, after, samples=10000, seed=0)
    assert interval.low < 0 < interval.high
    assert not interval.excludes_zero


def test_false_positive_rate_under_the_null_is_near_the_nominal_level():
    # Base and fine-tuned drawn from the same distribution: a 95% interval should exclude zero about 5% of the time.
    rng = np.random.default_rng(0)
    hits = 0
    trials = 200
    for trial in range(trials):
        before = rng.integers(0, 2, 60).astype(float)
        after = rng.integers(0, 2, 60).astype(float)
        hits += paired_bootstrap(before, after, samples=2000, seed=trial).excludes_zero
    assert 0.01 <= hits / trials <= 0.12


def test_interval_narrows_with_confidence():
    rng = np.random.default_rng(1)
    before, after = rng.random(100), rng.random(100)
    wide = paired_bootstrap(before, after, samples=4000, confidence=0.99, seed=0)
    narrow = paired_bootstrap(before, after, samples=4000, confidence=0.80, seed=0)
    assert wide.low < narrow.low < narrow.high < wide.high


def test_chunked_resampling_matches_a_single_draw_layout():
    # Chunks are sized by n only, so any sample count reproduces the same first resamples.
    rng = np.random.default_rng(2)
    before, after = rng.random(50), rng.random(50)
    small = paired_bootstrap(before, after, samples=100, seed=5)
    direct = np.random.default_rng(5).integers(0, 50, size=(100, 50))
    means = (after - before)[direct].mean(axis=1)
    assert small.low == pytest.approx(float(np.quantile(means, 0.025)))
    assert small.high == pytest.approx(float(np.quantile(means, 0.975)))


@pytest.mark.parametrize(("before", "after"), [([], []), ([1.0], [1.0, 0.0])])
def test_bad_shapes_raise(before, after):
    with pytest.raises(ValueError):
        paired_bootstrap(before, after)


def _scores(n: int = 1500):
    rng = np.random.default_rng(20240611)
    base = rng.uniform(0.5, 1.0, n)
    full = base - rng.uniform(0.0, 0.5, n)
    return base, full, full + rng.uniform(-0.1, 0.4, n)


def test_the_capability_interval_and_verify_s_recovery_draw_the_same_pinned_resamples():
    # Pinned before paired_bootstrap and recovery shared one resampler: the same seed gives these numbers to the last
    # bit, over 1500 items in two chunks of resamples.
    from gradian.counterfactual.recovery import Margin, Recovery, margin, recovery

    base, full, dropped = _scores()
    assert paired_bootstrap(base, full, samples=5000, confidence=0.9, seed=7) == DeltaInterval(
        delta=-0.24814502087271564, low=-0.254304517870296, high=-0.24204643678000207, confidence=0.9, samples=5000,
        seed=7)
    assert recovery(base, full, dropped, samples=5000, confidence=0.9, seed=7) == Recovery(
        lost=0.24814502087271564, recovered=0.1527818266609713, recovered_low=0.14673430687368524,
        recovered_high=0.15878561092712978, fraction=0.6156957174624903, fraction_low=0.5874330516100789,
        fraction_high=0.6447794466945405, confidence=0.9, samples=5000, seed=7, fraction_resamples=5000)
    assert margin(dropped, full, samples=5000, seed=3) == Margin(
        delta=0.1527818266609713, low=0.1455631561082764, high=0.1601236108412604)
    small = recovery([1, 1, 0, 1, 0, 1, 1, 1], [0, 1, 0, 0, 0, 1, 0, 0], [1, 1, 0, 0, 1, 1, 0, 1], samples=1000)
    assert small == Recovery(lost=0.5, recovered=0.375, recovered_low=0.125, recovered_high=0.75, fraction=0.75,
                             fraction_low=0.2, fraction_high=2.0, confidence=0.95, samples=1000, seed=0,
                             fraction_resamples=995)
