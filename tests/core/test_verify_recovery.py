"""The arithmetic of `gradian verify`: recovered fraction, its paired bootstrap CI, and the random control drop sets."""

from __future__ import annotations

import numpy as np
import pytest

from gradian.counterfactual.controls import control_sets
from gradian.counterfactual.recovery import item_recovery, margin, recovered_fraction, recovery
from gradian.errors import DatasetError
from gradian.evaluation import paired_bootstrap

BASE = [1.0] * 8
FULL = [0.0] * 8


@pytest.mark.parametrize("dropped, expected", [
    ([1.0] * 8, 1.0),  # everything the fine-tune lost came back
    ([0.0] * 8, 0.0),  # nothing came back
    ([1, 1, 1, 1, 0, 0, 0, 0], 0.5),
    ([0, 0, 0, 0, 0, 0, 0, -1], -0.125),  # dropping made it worse still
])
def test_recovered_fraction_is_the_share_of_the_lost_capability_that_came_back(dropped, expected):
    assert recovered_fraction(BASE, FULL, dropped) == pytest.approx(expected)


def test_the_fraction_uses_means_over_items_not_per_item_ratios():
    base, full, dropped = [1.0, 0.5, 0.2], [0.0, 0.5, 0.0], [1.0, 0.5, 0.0]
    # lost = mean(1, 0, 0.2) = 0.4, recovered = mean(1, 0, 0) = 1/3: the unchanged middle item counts in both
    assert recovered_fraction(base, full, dropped) == pytest.approx((1 / 3) / 0.4)


def test_nothing_lost_means_no_fraction():
    assert recovered_fraction([0.5, 0.5], [0.5, 0.6], [1.0, 1.0]) is None
    result = recovery([0.5, 0.5], [0.5, 0.6], [1.0, 1.0], samples=200)
    assert result.fraction is None and result.fraction_low is None and result.lost < 0
    assert result.recovered == pytest.approx(0.45)


def test_the_recovered_delta_interval_is_the_paired_bootstrap_of_full_vs_dropped():
    rng = np.random.default_rng(3)
    base = rng.uniform(0.6, 1.0, 30)
    full = base - rng.uniform(0.2, 0.6, 30)
    dropped = full + rng.uniform(-0.1, 0.5, 30)
    result = recovery(base, full, dropped, samples=2000, confidence=0.9, seed=11)
    interval = paired_bootstrap(full, dropped, samples=2000, confidence=0.9, seed=11)
    assert (result.recovered, result.recovered_low, result.recovered_high) == pytest.approx(
        (interval.delta, interval.low, interval.high))
    assert result.fraction == pytest.approx(float(np.mean(dropped - full) / np.mean(base - full)))
    assert result.fraction_low < result.fraction < result.fraction_high
    assert result.fraction_resamples == 2000 and result.recovered_significant


def test_the_interval_is_seeded():
    rng = np.random.default_rng(0)
    base, full, dropped = rng.uniform(size=20) + 1, rng.uniform(size=20), rng.uniform(size=20) + 0.5
    first = recovery(base, full, dropped, samples=500, seed=4)
    assert recovery(base, full, dropped, samples=500, seed=4) == first
    assert recovery(base, full, dropped, samples=500, seed=5).fraction_low != first.fraction_low


def test_identical_per_item_gains_give_a_point_interval():
    result = recovery(BASE, FULL, [0.25] * 8, samples=300)
    assert result.recovered_low == result.recovered_high == pytest.approx(0.25)
    assert result.fraction_low == result.fraction_high == pytest.approx(0.25)


def test_a_fraction_whose_denominator_vanishes_in_many_resamples_has_no_interval():
    base, full = [1.0] + [0.0] * 19, [0.0] * 20  # one item carries all the loss: about 36% of resamples miss it
    result = recovery(base, full, [1.0] + [0.0] * 19, samples=1000, seed=0)
    assert result.fraction == pytest.approx(1.0)
    assert result.fraction_low is None and result.fraction_high is None
    assert 500 < result.fraction_resamples < 950  # fewer than 95% of resamples lost anything


def test_the_margin_says_which_drop_recovered_more():
    accused, control = [1.0, 1.0, 0.5, 1.0], [0.0, 0.5, 0.0, 0.0]
    m = margin(accused, control, samples=1000)
    assert m.delta == pytest.approx(0.75) and m.significant
    assert not margin(control, accused, samples=1000).significant


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError):
        recovery([1.0, 1.0], [0.0], [0.0, 1.0])
    with pytest.raises(ValueError):
        recovered_fraction([], [], [])


# --- controls -------------------------------------------------------------------------------------

IDS = tuple(f"ex-{i:06d}-00000000" for i in range(40))
ACCUSED = IDS[5:13]


def test_controls_have_the_accused_size_and_never_touch_it():
    sets = control_sets(IDS, ACCUSED, 5, seed=0)
    assert len(sets) == 5
    for drop in sets:
        assert len(drop) == len(ACCUSED) == len(set(drop))
        assert not set(drop) & set(ACCUSED)
        assert list(drop) == sorted(drop, key=IDS.index)  # dataset order
    assert len(set(sets)) == 5  # five different draws


def test_controls_are_seeded_and_do_not_depend_on_how_many_are_asked_for():
    assert control_sets(IDS, ACCUSED, 3, seed=7) == control_sets(IDS, ACCUSED, 3, seed=7)
    assert control_sets(IDS, ACCUSED, 1, seed=7)[0] == control_sets(IDS, ACCUSED, 4, seed=7)[0]
    assert control_sets(IDS, ACCUSED, 1, seed=7) != control_sets(IDS, ACCUSED, 1, seed=8)


def test_no_controls_is_allowed_and_too_big_a_drop_set_is_an_error():
    assert control_sets(IDS, ACCUSED, 0) == ()
    with pytest.raises(DatasetError, match="no random control of the same size fits"):
        control_sets(IDS, IDS[:25], 1)


def test_regressed_items_are_sorted_into_back_without_the_drop_and_stuck_under_every_retrain():
    ids = ["a", "b", "c", "d", "e"]
    base, full = [1, 1, 1, 1, 0], [0, 0, 0, 0, 0]  # e never regressed
    dropped = [1, 0, 0, 0.5, 0]  # a back; d partly back (moved, not back)
    controls = {"control-1": [0, 1, 0, 0, 1], "control-2": [0, 0, 0, 0, 0]}  # b moved by a control, c by nothing
    by_item = item_recovery(ids, base, full, dropped, controls)
    assert by_item.regressed == ["a", "b", "c", "d"]
    assert by_item.back == ["a"]
    assert by_item.stuck == ["c"]  # only c stays at the full model's score in every retrain
    assert item_recovery(ids, base, full, dropped, {}).stuck == ["b", "c"]  # with no controls, the drop alone


def test_each_cause_is_measured_on_its_own_items_and_the_dropped_causes_pooled():
    from gradian.counterfactual.summary import causes_recovery
    from gradian.report.reader import CauseRow

    ids = ["a", "b", "c", "d", "e", "f"]
    base, full = [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]
    dropped = [1, 1, 0, 0, 1, 0]  # cause 1's items back, cause 2's not, f (held up) slipped
    controls = {"control-1": [0, 1, 0, 1, 1, 1]}
    causes = (CauseRow(1, ("a", "b"), ("planted",)), CauseRow(2, ("c", "d"), ()),
              CauseRow(3, ("zz",), ("other",)))  # cause 3's item is not in this eval set
    boot = {"samples": 200, "confidence": 0.95, "seed": 0}
    rows, pooled = causes_recovery(causes, ("planted",), ids, base, full, dropped, controls, boot)
    assert recovered_fraction(base, full, dropped) == pytest.approx(0.25)  # the overall figure mixes both causes
    assert [row["cause"] for row in rows] == [1, 2]
    one, two = rows
    assert one["in_drop"] and one["fraction"] == pytest.approx(1.0) and one["lost"] == pytest.approx(1.0)
    assert one["controls"]["control-1"]["fraction"] == pytest.approx(0.5)
    assert not two["in_drop"] and two["fraction"] == pytest.approx(0.0)
    assert pooled["causes"] == [1] and pooled["items"] == ["a", "b"] and pooled["fraction"] == pytest.approx(1.0)
    _, not_dropped = causes_recovery(causes, ("other",), ids, base, full, dropped, controls, boot)
    assert not_dropped is None  # cause 3 accuses `other`, but none of its items is scored here
    assert causes_recovery((), ("planted",), ids, base, full, dropped, controls, boot) == (None, None)
