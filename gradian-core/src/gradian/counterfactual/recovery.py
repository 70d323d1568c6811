"""How much of the lost capability a retrain without some examples gets back, with a paired bootstrap CI.

Per eval item i there are three scores: ``base`` (adapter off), ``full`` (the model trained on everything) and
``dropped`` (trained without the drop set). The fine-tune lost ``mean(base - full)``; dropping recovered
``mean(dropped - full)``; the recovered fraction is their ratio: 1 means dropping gave back all of it, 0 nothing,
negative that dropping made it worse still. Both come with percentile intervals from one joint resampling of the
items (the same resampled items for the numerator and the denominator, so their correlation is kept).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gradian.evaluation import paired_bootstrap
from gradian.evaluation.bootstrap import resampled_means

# Below this lost capability (in metric units) the ratio is noise over nothing and is not reported.
MIN_LOST = 1e-12


@dataclass(frozen=True)
class Recovery:
    """Recovered delta and fraction of one retrained model, with their bootstrap intervals."""

    lost: float  # mean(base - full): what the fine-tune took away
    recovered: float  # mean(dropped - full)
    recovered_low: float
    recovered_high: float
    fraction: float | None  # recovered / lost; None when nothing was lost
    fraction_low: float | None
    fraction_high: float | None
    confidence: float
    samples: int
    seed: int
    fraction_resamples: int  # resamples in which something was lost, over which the fraction's CI is taken
    # fraction_low / fraction_high are None when fewer than ``confidence`` of the resamples lost anything

    @property
    def recovered_significant(self) -> bool:
        """True when the recovered delta's interval lies above zero."""
        return self.recovered_low > 0.0


@dataclass(frozen=True)
class Margin:
    """How much more one drop set recovered than another: mean(dropped_a - dropped_b) with its interval."""

    delta: float
    low: float
    high: float

    @property
    def significant(self) -> bool:
        """True when the interval lies above zero (a recovered more than b)."""
        return self.low > 0.0


def recovered_fraction(base: Sequence[float], full: Sequence[float], dropped: Sequence[float]) -> float | None:
    """(mean(dropped) - mean(full)) / (mean(base) - mean(full)); None when the full model lost nothing."""
    b, f, d = _arrays(base, full, dropped)
    lost = float(np.mean(b - f))
    return float(np.mean(d - f)) / lost if lost > MIN_LOST else None


def recovery(base: Sequence[float], full: Sequence[float], dropped: Sequence[float], *, samples: int = 10_000,
             confidence: float = 0.95, seed: int = 0) -> Recovery:
    """The recovered delta and fraction with percentile CIs from a paired bootstrap over eval items."""
    b, f, d = _arrays(base, full, dropped)
    if samples < 1 or not 0.0 < confidence < 1.0:
        raise ValueError("recovery needs samples >= 1 and 0 < confidence < 1")
    gained, lost = d - f, b - f
    # The resampler paired_bootstrap uses: the recovered delta's interval is the paired bootstrap of full vs dropped.
    gained_means, lost_means = resampled_means([gained, lost], samples=samples, seed=seed)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(gained_means, [tail, 1.0 - tail])
    valid = lost_means > MIN_LOST
    fraction = recovered_fraction(b, f, d)
    fraction_low = fraction_high = None
    # When more resamples than the tail lose nothing, the lost capability's own interval reaches zero and the
    # ratio is unbounded at that confidence: no interval is honest then.
    if fraction is not None and valid.mean() >= confidence:
        ratios = gained_means[valid] / lost_means[valid]
        fraction_low, fraction_high = (float(v) for v in np.quantile(ratios, [tail, 1.0 - tail]))
    return Recovery(lost=float(lost.mean()), recovered=float(gained.mean()), recovered_low=float(low),
                    recovered_high=float(high), fraction=fraction, fraction_low=fraction_low,
                    fraction_high=fraction_high, confidence=float(confidence), samples=int(samples), seed=int(seed),
                    fraction_resamples=int(valid.sum()))


def margin(dropped_a: Sequence[float], dropped_b: Sequence[float], *, samples: int = 10_000,
           confidence: float = 0.95, seed: int = 0) -> Margin:
    """mean(dropped_a - dropped_b) over items with its paired bootstrap interval (a: accused, b: a control)."""
    interval = paired_bootstrap(dropped_b, dropped_a, samples=samples, confidence=confidence, seed=seed)
    return Margin(delta=interval.delta, low=interval.low, high=interval.high)


@dataclass(frozen=True)
class ItemRecovery:
    """Which regressed items a drop gave back, and which no retrain gave back (ids, in eval order)."""

    regressed: list[str]  # base > full: what the fine-tune broke
    back: list[str]  # regressed, and the model trained without the drop set scores the base's score again
    stuck: list[str]  # regressed, and no retrained model (the accused drop or a control) scores above full


def item_recovery(ids: Sequence[str], base: Sequence[float], full: Sequence[float], dropped: Sequence[float],
                  controls: Mapping[str, Sequence[float]]) -> ItemRecovery:
    """Sort the regressed items by what the retrains did to each: back without the drop set, or stuck under all."""
    # An item no retrain moves is regressed by something every retrain shares (the learning rate, the rows no drop
    # removed), so it caps the fraction the accused drop can recover, however right the accusation.
    b, f, d, *c = _arrays(base, full, dropped, *controls.values())
    regressed, unmoved = b > f, d <= f
    for column in c:
        unmoved &= column <= f

    def pick(mask: np.ndarray) -> list[str]:
        return [item for item, chosen in zip(ids, mask, strict=True) if chosen]

    return ItemRecovery(regressed=pick(regressed), back=pick(regressed & (d >= b)), stuck=pick(regressed & unmoved))


@dataclass(frozen=True)
class SubsetRecovery:
    """The recovery of the dropped model and of each control on a subset of the eval items (one cause's)."""

    items: tuple[str, ...]  # the subset's ids, in eval order
    dropped: Recovery
    controls: dict[str, Recovery]


def subset_recovery(ids: Sequence[str], subset: Collection[str], base: Sequence[float], full: Sequence[float],
                    dropped: Sequence[float], controls: Mapping[str, Sequence[float]], *, samples: int = 10_000,
                    confidence: float = 0.95, seed: int = 0) -> SubsetRecovery | None:
    """``recovery`` over the items in ``subset`` only, for the drop and each control; None when none is in ``ids``."""
    keep = [position for position, item in enumerate(ids) if item in subset]
    if not keep:
        return None

    def on_subset(column: Sequence[float]) -> list[float]:
        return [column[position] for position in keep]

    def recover(column: Sequence[float]) -> Recovery:
        return recovery(on_subset(base), on_subset(full), on_subset(column), samples=samples, confidence=confidence,
                        seed=seed)

    return SubsetRecovery(items=tuple(ids[position] for position in keep), dropped=recover(dropped),
                          controls={name: recover(column) for name, column in controls.items()})


def _arrays(*columns: Sequence[float]) -> list[np.ndarray]:
    arrays = [np.asarray(column, dtype=np.float64) for column in columns]
    if arrays[0].ndim != 1 or arrays[0].shape[0] == 0 or any(a.shape != arrays[0].shape for a in arrays):
        raise ValueError("recovery needs one score per eval item for base, full and dropped (same length, >= 1)")
    return arrays
