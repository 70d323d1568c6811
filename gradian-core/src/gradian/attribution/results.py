"""Frozen results of attribution: per-example blame, cluster assignment and cluster blame, span blame.

Sign convention everywhere: positive blame means training on the example pushed the model toward the failure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    from gradian.query.spans import SpanBlame

ACCUSE_ALPHA = 0.05  # a cluster is named as accused only when its permutation p-value is below this


def _frozen(array: np.ndarray, dtype: npt.DTypeLike) -> np.ndarray:
    """A read-only copy, so a frozen record cannot be changed through its arrays."""
    out = np.array(array, dtype=dtype, copy=True)
    out.setflags(write=False)
    return out


@dataclass(frozen=True)
class ClusterPrior:
    """What the ranking added to the members of each accused cluster: ``share`` of that cluster's mean blame."""

    share: float
    added: Mapping[str, float]  # accused cluster name -> the amount added to each member's blame

    def __post_init__(self) -> None:
        object.__setattr__(self, "added", MappingProxyType(dict(self.added)))


@dataclass(frozen=True, eq=False)
class ExampleScores:
    """Aggregated blame of every training example against the regressed items, plus exact top-k detail.

    ``blame[i]`` is example i's aggregated blame (higher = more blamed); ``ranks[i]`` its 1-based rank
    (ties broken by position). ``top_positions`` are the top-k positions in rank order and
    ``top_item_blame[j, q]`` is the per-item blame -(P q_q) . g_i of the j-th of them (unit-normalized g_i when
    ``normalize``), before any per-item standardization; ``item_mean`` / ``item_std`` are each item's mean and
    population std over all examples, so ``(top_item_blame - item_mean) / item_std`` are the z-scores.
    """

    ids: tuple[str, ...]
    blame: np.ndarray
    ranks: np.ndarray
    item_ids: tuple[str, ...]
    item_mean: np.ndarray
    item_std: np.ndarray
    top_positions: np.ndarray
    top_item_blame: np.ndarray
    aggregation: str
    normalize: bool
    passes: int = 1  # full reads of the index the scoring took
    item_weights: str = "uniform"  # how the aggregation weighed the items (attribution.item_weights)
    cluster_prior: ClusterPrior | None = None  # added to the blame of accused clusters' members (attribution.cluster_prior)

    def __post_init__(self) -> None:
        n, q = len(self.ids), len(self.item_ids)
        object.__setattr__(self, "blame", _frozen(self.blame, np.float64))
        object.__setattr__(self, "ranks", _frozen(self.ranks, np.int64))
        object.__setattr__(self, "item_mean", _frozen(self.item_mean, np.float64))
        object.__setattr__(self, "item_std", _frozen(self.item_std, np.float64))
        object.__setattr__(self, "top_positions", _frozen(self.top_positions, np.int64))
        object.__setattr__(self, "top_item_blame", _frozen(self.top_item_blame, np.float64).reshape(-1, q))
        if self.blame.shape != (n,) or self.ranks.shape != (n,):
            raise ValueError("blame and ranks need one value per example id")
        if self.item_mean.shape != (q,) or self.item_std.shape != (q,):
            raise ValueError("item_mean and item_std need one value per item id")
        if self.top_item_blame.shape[0] != self.top_positions.shape[0]:
            raise ValueError("top_item_blame needs one row per top position")

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def top_k(self) -> int:
        """How many examples carry per-item detail."""
        return int(self.top_positions.shape[0])

    def order(self) -> np.ndarray:
        """Every position, most blamed first (ties by position)."""
        return np.argsort(self.ranks, kind="stable")

    def top_ids(self) -> tuple[str, ...]:
        """Ids of the top-k examples, most blamed first."""
        return tuple(self.ids[int(p)] for p in self.top_positions)


@dataclass(frozen=True, eq=False)
class ClusterAssignment:
    """Which cluster each training example belongs to: ``labels[i]`` indexes ``names``."""

    names: tuple[str, ...]
    labels: np.ndarray
    method: str  # "field" or "auto"
    field: str | None = None
    knobs: Mapping[str, Any] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _frozen(self.labels, np.int64))
        object.__setattr__(self, "knobs", MappingProxyType(dict(self.knobs)))
        if self.labels.ndim != 1:
            raise ValueError("labels must be one label per example")
        if self.labels.size and (self.labels.min() < 0 or self.labels.max() >= len(self.names)):
            raise ValueError("every label must index a cluster name")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def sizes(self) -> np.ndarray:
        """Members per cluster, aligned with ``names``."""
        return np.bincount(self.labels, minlength=len(self.names))

    def members(self, name: str) -> np.ndarray:
        """Positions of the examples in the named cluster."""
        return np.flatnonzero(self.labels == self.names.index(name))

    def name_of(self, position: int) -> str:
        """The cluster name of the example at ``position``."""
        return self.names[int(self.labels[position])]

    def describe(self) -> str:
        """How membership was decided, in one phrase for the report."""
        if self.method == "field":
            return f"dataset field `{self.field}`"
        return (f"automatic: seeded k-means (k={self.knobs.get('k')}) on a {self.knobs.get('sketch_dim')}-d "
                f"signed feature-hash sketch of the unit-normalized stored gradients (seed {self.knobs.get('seed')})")


@dataclass(frozen=True)
class ClusterScore:
    """One cluster's blame and the evidence for it; clusters are ranked by ``z`` (1 = strongest).

    ``blame`` is the mean of its members' blame; ``z`` how far that mean sits above the mean of a random
    cluster of the same size, in that mean's standard deviations; ``p_value`` the permutation p-value of this
    cluster alone; ``p_adjusted`` the family-wise one (the same test against the best of all clusters in each
    permutation), which is what an accusation needs when many clusters were tested.
    """

    name: str
    size: int
    blame: float
    z: float
    p_value: float
    p_adjusted: float
    rank: int
    # (mean blame - overall mean) / blame std: how blamed a typical member is, whatever the cluster's size (z
    # grows with sqrt(size), so a large mildly blamed cluster can out-z a small strongly blamed one).
    effect: float = 0.0


@dataclass(frozen=True)
class ClusterResult:
    """Every cluster scored and ranked, and the accused ones (none when no cluster stands out)."""

    assignment: ClusterAssignment
    scores: tuple[ClusterScore, ...]  # in rank order
    permutations: int
    seed: int
    alpha: float = ACCUSE_ALPHA

    @property
    def accused_all(self) -> tuple[ClusterScore, ...]:
        """Every cluster blamed above a random one with a family-wise p-value below ``alpha``, largest effect first."""
        significant = [s for s in self.scores if s.p_adjusted < self.alpha and s.z > 0]
        return tuple(sorted(significant, key=lambda s: (-s.effect, s.rank)))

    @property
    def accused(self) -> ClusterScore | None:
        """The first accused cluster (the most blamed per member among the significant ones), else None."""
        accused = self.accused_all
        return accused[0] if accused else None

    def by_name(self, name: str) -> ClusterScore:
        """The score of the named cluster."""
        for score in self.scores:
            if score.name == name:
                return score
        raise KeyError(name)


@dataclass(frozen=True)
class SpanDrill:
    """Span drill-down of one top example against the query built from one regressed item.

    ``spans`` are ``gradian.query.spans.SpanBlame`` records (text, char_start, char_end, message_index, blame).
    """

    example_id: str
    position: int
    query_item: str
    spans: tuple[SpanBlame, ...]

    @property
    def top_span(self) -> SpanBlame | None:
        """The most blamed span (first on ties), or None without spans."""
        if not self.spans:
            return None
        return max(self.spans, key=lambda span: span.blame)
