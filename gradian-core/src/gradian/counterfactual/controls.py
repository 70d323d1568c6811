"""Control drop sets: random examples, as many as the accused cluster holds, none of them in it.

A control answers "would dropping *any* that many examples have given the capability back?". Each control is
drawn without replacement from the examples outside the accused cluster, from its own seeded generator
(``[seed, CONTROL_STREAM, number]``), so control 2 is the same whether 1 or 5 controls are asked for.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from gradian.errors import DatasetError

CONTROL_STREAM = 0x7C0  # keeps control draws apart from the other seeded streams built from the same seed


def control_sets(ids: Sequence[str], accused: Collection[str], count: int, *, seed: int = 0) -> tuple[tuple[str, ...], ...]:
    """``count`` random drop sets of ``len(accused)`` ids each, disjoint from ``accused``, in dataset order."""
    if count < 0:
        raise ValueError("the number of controls cannot be negative")
    accused_set = set(accused)
    size = len(accused_set)
    if size == 0:
        raise ValueError("control sets need a non-empty accused set to match in size")
    eligible = np.array([position for position, example_id in enumerate(ids) if example_id not in accused_set],
                        dtype=np.int64)
    if count and eligible.shape[0] < size:
        raise DatasetError(
            f"the drop set holds {size} of {len(ids)} examples, so no random control of the same size fits "
            f"outside it ({eligible.shape[0]} examples left)",
            "drop a smaller cluster, or pass --controls 0 to skip the random control",
        )
    sets = []
    for number in range(1, count + 1):
        rng = np.random.default_rng([seed, CONTROL_STREAM, number])
        chosen = np.sort(rng.choice(eligible, size=size, replace=False))
        sets.append(tuple(ids[int(position)] for position in chosen))
    return tuple(sets)
