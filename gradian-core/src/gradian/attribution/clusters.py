"""Clusters of training examples and their blame: membership from a dataset field or automatic, permutation p-values.

Automatic clustering (when no ``attribution.cluster_field`` is set), deterministic for a seed:

1. Sketch: each stored gradient row is hashed to ``sketch_dim`` (64) coordinates with signed feature hashing
   (every stored coordinate goes to one seeded bucket with a seeded random sign; Weinberger et al. 2009), streamed
   ``chunk_bytes`` of rows at a time; only the [n, sketch_dim] sketch is held, never the rows. Rows no wider than
   the sketch are used as they are. The sketch does not depend on the chunk size, bit for bit, so `gradian verify`
   recomputes the same clusters under any memory budget.
2. Each sketch is scaled to unit length, so clusters group gradient directions rather than gradient sizes
   (long examples have large gradients; size is not what a "kind of example" is).
3. k-means with k-means++ seeding and Lloyd iterations until no assignment changes (at most 100), with
   k = ``num_clusters`` or round(sqrt(n / 2)). An emptied cluster is re-seeded at the point farthest from its
   center; clusters still empty at the end are dropped. Clusters are named auto-00, auto-01, ... in the
   order of their first member in the dataset.

Cluster blame is the mean blame of its members; ``z`` is that mean's distance above the overall mean in
standard deviations of a random cluster's mean of the same size (without replacement). Permutation test: each
of ``permutations`` seeded shuffles of the blame over the fixed membership makes every cluster a random cluster
of its own size. Per cluster, p = (1 + #{random mean >= observed}) / (1 + permutations). Because many clusters
are tested, the accusation uses the family-wise p-value (Westfall-Young maxT): the same count against the
largest z of any cluster in each shuffle. Clusters are ranked by z. Every cluster whose family-wise p-value is
below 0.05 is accused, the one with the largest effect (mean blame above the overall mean in blame standard
deviations) first: z grows with the square root of a cluster's size, so among clusters that all stand out the
first accused is the one whose members are the most blamed, not the largest; otherwise no cluster stands out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gradian.attribution.results import ACCUSE_ALPHA, ClusterAssignment, ClusterResult, ClusterScore
from gradian.attribution.scoring import ChunkSource
from gradian.data.examples import Example
from gradian.errors import DatasetError, GradientIndexError
from gradian.index.store import DEFAULT_CHUNK_BYTES, rows_per_chunk

if TYPE_CHECKING:
    from gradian.config import AttributionConfig

# A training example, or a plain mapping of its fields (clusters_from_field takes either).
ExampleRow = Example | Mapping[str, Any]

DEFAULT_SKETCH_DIM = 64
MAX_KMEANS_ITERATIONS = 100
_DISTANCE_BATCH = 4096  # rows per distance block, so n x k distances are never held at once
# Rows hashed at once within a chunk: hashing permutes and signs a copy of its rows, which must stay small
# next to the chunk itself.
_HASH_SLAB_BYTES = 16 << 20


def assign_clusters(config: AttributionConfig, examples: Sequence[ExampleRow] | None,
                    source: ChunkSource) -> ClusterAssignment:
    """Membership as an ``AttributionConfig`` asks: its cluster_field when set, else automatic clustering."""
    if config.cluster_field:
        if examples is None:
            raise ValueError("clustering by a dataset field needs the training examples")
        return clusters_from_field(examples, config.cluster_field, ids=source.ids)
    return auto_clusters(source, num_clusters=config.num_clusters, seed=config.seed, chunk_bytes=config.chunk_bytes)


def score_clusters(config: AttributionConfig, blame: np.ndarray, examples: Sequence[ExampleRow] | None,
                   source: ChunkSource) -> ClusterResult:
    """Membership and cluster blame as an ``AttributionConfig`` asks (field or automatic; its permutations, seed)."""
    assignment = assign_clusters(config, examples, source)
    return cluster_blame(blame, assignment, permutations=config.permutations, seed=config.seed)


def clusters_from_field(examples: Sequence[ExampleRow], field: str, *,
                        ids: Sequence[str] | None = None) -> ClusterAssignment:
    """Membership from a dataset field of each example (``Example.fields`` or a plain mapping per row)."""
    if ids is not None:
        _check_same_examples(examples, ids)
    values = [_field_value(example, field) for example in examples]
    missing = [position for position, value in enumerate(values) if value is None]
    if missing:
        first = missing[0]
        where = f"row {first}" + (f" ({examples[first].id})" if hasattr(examples[first], "id") else "")
        present = sorted(_fields_of(examples[first]))
        raise DatasetError(
            f"attribution.cluster_field {field!r} is missing on {len(missing)} of {len(values)} training rows; "
            f"the first is {where}",
            f"add `{field}` to every row, or unset attribution.cluster_field to cluster automatically"
            + (f"; that row has the fields {', '.join(present)}" if present else ""),
        )
    names: dict[str, int] = {}
    labels = np.array([names.setdefault(value, len(names)) for value in values], dtype=np.int64)
    return ClusterAssignment(names=tuple(names), labels=labels, method="field", field=field)


def default_num_clusters(n: int) -> int:
    """About sqrt(n / 2) clusters, at least 2 (and at most n)."""
    return max(1, min(n, max(2, round(math.sqrt(n / 2)))))


def auto_clusters(source: ChunkSource, *, num_clusters: int | None = None, seed: int = 0,
                  chunk_bytes: int = DEFAULT_CHUNK_BYTES, sketch_dim: int = DEFAULT_SKETCH_DIM) -> ClusterAssignment:
    """Deterministic seeded k-means over a signed feature-hash sketch of the unit-normalized stored gradients."""
    n = len(source)
    if n == 0:
        raise GradientIndexError("the gradient index has no rows", "build it from a non-empty training set")
    features = sketch_rows(source, seed=seed, sketch_dim=sketch_dim, chunk_bytes=chunk_bytes)
    norms = np.linalg.norm(features, axis=1)
    features = features / np.where(norms > 0, norms, 1.0)[:, None]
    requested = num_clusters if num_clusters is not None else default_num_clusters(n)
    k = min(requested, n)
    labels, iterations = _kmeans(features, k, np.random.default_rng([seed, 1]))
    labels, used = _relabel_by_first_member(labels)
    width = max(2, len(str(used - 1)))
    names = tuple(f"auto-{j:0{width}d}" for j in range(used))
    knobs = {"k_requested": int(requested), "k": int(used), "sketch_dim": int(features.shape[1]),
             "seed": int(seed), "iterations": int(iterations), "unit_normalized": True}
    return ClusterAssignment(names=names, labels=labels, method="auto", knobs=knobs)


def sketch_rows(source: ChunkSource, *, seed: int, sketch_dim: int = DEFAULT_SKETCH_DIM,
                chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> np.ndarray:
    """Signed feature-hash sketch [n, sketch_dim] (float64) of every row, streamed; narrow rows pass through."""
    n = len(source)
    sketch: np.ndarray | None = None
    plan: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
    for offset, chunk in source.iter_chunks(rows_per_chunk(chunk_bytes, source.dim)):
        dim = chunk.shape[1]
        if sketch is None:
            sketch = np.zeros((n, min(dim, sketch_dim)), dtype=np.float64)
            if dim > sketch_dim:
                plan = _hash_plan(dim, sketch_dim, seed)
        if plan is None:
            sketch[offset:offset + chunk.shape[0]] = chunk
            continue
        order, signs, starts, nonempty = plan
        slab = rows_per_chunk(_HASH_SLAB_BYTES, dim)
        for start in range(0, chunk.shape[0], slab):  # each row's sketch is its own: slabs change no bits
            signed = np.asarray(chunk[start:start + slab])[:, order]
            signed *= signs
            at = offset + start
            sketch[at:at + signed.shape[0], nonempty] = np.add.reduceat(signed, starts, axis=1, dtype=np.float64)
    if sketch is None:
        return np.zeros((0, 0), dtype=np.float64)
    if not np.all(np.isfinite(sketch)):
        bad = int(np.flatnonzero(~np.all(np.isfinite(sketch), axis=1))[0])
        raise GradientIndexError(f"index row {bad} ({source.ids[bad]}) holds non-finite gradient values",
                                 "rebuild the index with grads.storage_dtype float32")
    return sketch


def cluster_blame(blame: np.ndarray, assignment: ClusterAssignment, *, permutations: int = 1000, seed: int = 0,
                  alpha: float = ACCUSE_ALPHA) -> ClusterResult:
    """Each cluster's mean blame, z, per-cluster and family-wise permutation p-values, ranked by z."""
    blame = np.asarray(blame, dtype=np.float64)
    if blame.shape != (len(assignment),):
        raise ValueError("cluster_blame needs one blame value per example of the assignment")
    if permutations < 1:
        raise ValueError("permutations must be positive")
    labels, k, n = assignment.labels, len(assignment.names), blame.shape[0]
    sizes = assignment.sizes
    present = sizes > 0
    observed = _cluster_means(blame, labels, sizes)
    spread = _mean_spread(blame, sizes)
    z = _standardized(observed, blame.mean(), spread)
    # Random means differ from a same-valued observed mean only by summation order; count those as ties.
    tolerance = 1e-9 * max(1.0, float(np.abs(blame).max(initial=0.0)))
    exceed = np.zeros(k, dtype=np.int64)
    exceed_best = np.zeros(k, dtype=np.int64)
    rng = np.random.default_rng([seed, 2])
    for _ in range(permutations):
        # One shuffle of the blame over the fixed labels makes every cluster a random cluster of its own size.
        means = _cluster_means(blame[rng.permutation(n)], labels, sizes)
        exceed += means >= observed - tolerance
        best = _standardized(means, blame.mean(), spread)[present].max(initial=0.0)
        exceed_best += best >= z - 1e-9 * np.maximum(1.0, np.abs(z))
    p_value = (1 + exceed) / (1 + permutations)
    p_adjusted = (1 + exceed_best) / (1 + permutations)
    order = sorted(np.flatnonzero(present), key=lambda c: (-z[c], -observed[c], assignment.names[c]))
    std = float(blame.std())
    effect = (observed - blame.mean()) / std if std > 0 else np.zeros_like(observed)
    scores = tuple(ClusterScore(name=assignment.names[c], size=int(sizes[c]), blame=float(observed[c]),
                                z=float(z[c]), p_value=float(p_value[c]), p_adjusted=float(p_adjusted[c]), rank=rank,
                                effect=float(effect[c]))
                   for rank, c in enumerate(order, start=1))
    return ClusterResult(assignment=assignment, scores=scores, permutations=permutations, seed=seed, alpha=alpha)


def _cluster_means(blame: np.ndarray, labels: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    sums = np.bincount(labels, weights=blame, minlength=sizes.shape[0])
    return sums / np.maximum(sizes, 1)


def _mean_spread(blame: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Standard deviation of the mean of a random cluster of each size (drawn without replacement)."""
    n = blame.shape[0]
    if n < 2:
        return np.zeros(sizes.shape[0])
    m = np.maximum(sizes, 1).astype(np.float64)
    return blame.std() * np.sqrt(np.clip(n - m, 0.0, None) / (m * (n - 1)))


def _standardized(means: np.ndarray, center: float, spread: np.ndarray) -> np.ndarray:
    """(mean - center) / spread; a cluster whose random mean cannot vary (it is everything) gets 0."""
    out = np.zeros_like(means)
    varies = spread > 0
    out[varies] = (means[varies] - center) / spread[varies]
    return out


def _hash_plan(dim: int, sketch_dim: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Coordinate order grouped by bucket, signs in that order, each non-empty bucket's start, which are non-empty."""
    rng = np.random.default_rng([seed, 0])
    bucket = rng.integers(0, sketch_dim, size=dim)
    signs = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=dim)
    order = np.argsort(bucket, kind="stable")
    counts = np.bincount(bucket, minlength=sketch_dim)
    nonempty = counts > 0
    starts = (np.cumsum(counts) - counts)[nonempty]
    return order, signs[order], starts, nonempty


def _kmeans(x: np.ndarray, k: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Lloyd's k-means from k-means++ seeds; returns (labels, iterations run)."""
    centers = _kmeans_plus_plus(x, k, rng)
    labels = np.full(x.shape[0], -1, dtype=np.int64)
    iterations = 0
    while iterations < MAX_KMEANS_ITERATIONS:
        iterations += 1
        new_labels, distances = _nearest(x, centers)
        if np.array_equal(new_labels, labels):
            break
        labels = new_labels
        centers = _recenter(x, labels, centers, distances)
    return labels, iterations


def _kmeans_plus_plus(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    n = x.shape[0]
    chosen = [int(rng.integers(n))]
    closest = ((x - x[chosen[0]]) ** 2).sum(axis=1)
    for _ in range(1, k):
        total = closest.sum()
        if total > 0:
            pick = int(rng.choice(n, p=closest / total))
        else:  # every point sits on a center already; any point is as good as another
            pick = int(rng.integers(n))
        chosen.append(pick)
        closest = np.minimum(closest, ((x - x[pick]) ** 2).sum(axis=1))
    return x[chosen].copy()


def _nearest(x: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the nearest center per row and the squared distance to it, computed in row blocks."""
    labels = np.empty(x.shape[0], dtype=np.int64)
    best = np.empty(x.shape[0], dtype=np.float64)
    center_sq = (centers**2).sum(axis=1)
    for start in range(0, x.shape[0], _DISTANCE_BATCH):
        block = x[start:start + _DISTANCE_BATCH]
        d = (block**2).sum(axis=1)[:, None] - 2.0 * block @ centers.T + center_sq[None, :]
        labels[start:start + block.shape[0]] = np.argmin(d, axis=1)
        best[start:start + block.shape[0]] = np.clip(d.min(axis=1), 0.0, None)
    return labels, best


def _recenter(x: np.ndarray, labels: np.ndarray, old: np.ndarray, distances: np.ndarray) -> np.ndarray:
    """Member means; an emptied cluster moves to the point farthest from its center (each point used once)."""
    k = old.shape[0]
    counts = np.bincount(labels, minlength=k)
    sums = np.zeros_like(old)
    np.add.at(sums, labels, x)
    centers = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], old)
    far = np.argsort(-distances, kind="stable")
    for slot, empty in enumerate(np.flatnonzero(counts == 0)):
        if slot < far.shape[0] and distances[far[slot]] > 0:
            centers[empty] = x[far[slot]]
    return centers


def _relabel_by_first_member(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """Labels renumbered 0.. in order of each cluster's first member; empty clusters vanish."""
    _, first = np.unique(labels, return_index=True)
    order = labels[np.sort(first)]
    mapping = np.full(labels.max() + 1, -1, dtype=np.int64)
    mapping[order] = np.arange(order.shape[0])
    return mapping[labels], int(order.shape[0])


def _field_value(example: ExampleRow, field: str) -> str | None:
    """The field as a cluster name; absent, None and blank strings count as missing."""
    fields = _fields_of(example)
    if field not in fields:
        return None
    value = fields[field]
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _fields_of(example: ExampleRow) -> Mapping[str, Any]:
    if isinstance(example, Mapping):
        return example
    return getattr(example, "fields", {}) or {}


def _check_same_examples(examples: Sequence[ExampleRow], ids: Sequence[str]) -> None:
    """The examples must be the rows the index was built from, in the same order."""
    if len(examples) != len(ids):
        raise GradientIndexError(
            f"the training set has {len(examples)} examples and the gradient index {len(ids)} rows",
            "the index was built from another dataset; pass the same --dataset, or let Gradian rebuild the index",
        )
    for position, (example, expected) in enumerate(zip(examples, ids, strict=True)):
        actual = getattr(example, "id", None)
        if actual is not None and actual != expected:
            raise GradientIndexError(
                f"training example {position} is {actual} and the gradient index has {expected} there",
                "the index was built from another dataset or order; pass the same --dataset, or rebuild the index",
            )
