"""Regressed items grouped into causes: items whose query gradients point different ways are attributed apart.

A regression seen on many eval items can have more than one cause: a bad cluster, and damage the learning rate or
another cluster did to other items. Pooled into one query, a weaker cause's items dilute the stronger one's.

Items are grouped by kernel k-means on the cosine of their preconditioned query gradients (q_i . P q_j, the inner
product blame is scored with), for k = 2 .. ``attribution.max_causes``, each group holding at least
``MIN_GROUP_ITEMS`` items. Each group is attributed from the per-item blame scoring already holds (no further read of
the index) and its clusters are tested as the whole set's are. Groups that accuse the same cluster are one cause;
groups that accuse none are together the unexplained items ("no data cause found"). A split is kept only when its
groups accuse two or more distinct clusters; among those, the most distinct accused clusters win, then the largest
sum of their z. Otherwise the items are one cause and the attribution of all of them stands: splitting one cause's items only
makes each query noisier, and keeping a split because its one accused cluster's z rose cost the span case two
planted rows (bench/results/causes.md).

That choice is made at the clusters' own alpha, because a split focuses each group's query (format-1: 0.85 recall@k
for the lead cause against 0.50 pooled). What the kept split accuses is held to alpha / k (Bonferroni over its k
groups, each a family of cluster tests): a group of incidental items tests every cluster again, and on a held-out
behaviour case three wrong-capital items accused a clean cluster at family-wise p 0.034 with nothing planted there.
A kept split that accuses fewer than two distinct clusters at the corrected alpha gives way to the attribution of all
items together, for the reason a split is kept at all: on span-7 the split left a 4-item cause accusing
`country_profiles` beside 8 items whose strongest cluster was the same one, short of alpha / 3, and ranking by the 4
found 0.60 of the planted rows against 0.80 for all 12 (bench/results/one_cluster_splits.md).

With ``attribution.canned_replies`` the items that give one reply word for word (a canned deflection, the same
answer to different questions) are tried first as a cause of their own and the other items as a second, each at
alpha / 2: no search picks them, the reply does. That trial scores them by queries of the whole reply
(``gradian.query.signals``), which only the rows that taught it share. They stay apart only where they accuse a
cluster that the other items do not; otherwise every item is grouped as usual, on its usual query: on a held-out
two-causes case, two French replies queried whole moved the k-means grouping and cost the capital rule's rows
0.80 -> 0.68 recall@k although the reply was no cause of its own. Where that grouping accuses nothing either and
the reply's blame rests on clearly fewer rows than the other items' (CONCENTRATED_BY), the reply's items and the
others are two causes, neither accusing anything, and the reply's lead the ranking: a reply given word for word to
different questions was taught by some rows even where no cluster holds them.

Every accusation, pooled or one cause's, must also hold without the item that supports it most (the item whose
standardized blame is highest over the cluster's members): its p-values are the larger of the two. One eval item is
one anecdote, and the split is a search for groups that accuse something. On the held-out clean controls (nothing
planted, regressed by the learning rate) one wrong capital alone carried each false accusation: seed 5's two-item
groups accused the clean `geography_qa` at p 0.001 and `rewriting` at p 0.002 (the other item alone: p 0.18 and
0.94; all items pooled accused nothing), and seed 7's ten pooled items accused `geography_qa` at p 0.03 (0.44
without its strongest item), which `gradian verify` refuted: dropping it lost more capability, not less.

scores.csv ranks every example once. Where two or more causes accuse a cluster, that ranking is ``overall_blame``:
each example's highest blame among those causes, each cause's blame first standardized over the examples (its
scale depends on how many items it holds). Cause 1's ranking alone left a second planted cluster's rows far down
(0.45 and 0.53 recall@k over both planted clusters on two held-out two-causes cases; this ranking gives 0.78 on the
second), so ``export --drop top:K`` would have missed them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gradian.attribution.aggregation import kurtosis_weights, zscores
from gradian.attribution.cluster_prior import with_cluster_prior
from gradian.attribution.clusters import cluster_blame
from gradian.attribution.results import ClusterAssignment, ClusterResult, ClusterScore, ExampleScores
from gradian.attribution.scoring import ranked_with_config, rescore_items

if TYPE_CHECKING:
    from gradian.config import AttributionConfig

MIN_GROUP_ITEMS = 2
# How much more concentrated (kurtosis of blame over the examples) a canned reply's blame must be than the other
# items' to lead a ranking that accuses nothing. Queried whole, the planted deflection's is 1.7, 1.5 and 2.5 times
# theirs on behaviour-4, -10 and -9; a reply no rows taught (the tests' random whole-reply queries) 0.9-1.03 times.
CONCENTRATED_BY = 1.25
_RESTARTS = 10
_MAX_ITERATIONS = 50


@dataclass(frozen=True, eq=False)
class Cause:
    """Regressed items attributed together: their blame and the clusters it accuses (none: unexplained)."""

    item_ids: tuple[str, ...]
    scores: ExampleScores
    clusters: ClusterResult
    canned: bool = False  # the items give one reply word for word, and are a cause for that

    @property
    def accused(self) -> ClusterScore | None:
        """The first cluster this cause's items accuse, or None when their regression has no data cause found."""
        return self.clusters.accused


@dataclass(frozen=True, eq=False)
class CauseSplit:
    """The causes of a regression: the most strongly accused first, the unexplained items (if any) last."""

    causes: tuple[Cause, ...]
    groups: int  # the k whose split was kept; 1 when the items are one cause

    @property
    def primary(self) -> Cause:
        """The cause the report leads with."""
        return self.causes[0]

    def ranked(self, item_blame: np.ndarray, item_ids: Sequence[str], config: AttributionConfig, *,
               other_blame: bool = False) -> CauseSplit:
        """Each cause's examples ranked by ``attribution.ranking`` over its own items, its accused clusters' members
        lifted by ``attribution.cluster_prior``; what it accuses unchanged. ``other_blame``: ``item_blame`` is not
        the blame the causes were tested on (queries of another generated weight)."""
        position = {item: column for column, item in enumerate(item_ids)}

        def ranking(cause: Cause) -> ExampleScores:
            columns = [position[item] for item in cause.item_ids]
            scores = ranked_with_config(item_blame, cause.scores, columns, config, other_blame=other_blame)
            return with_cluster_prior(scores, item_blame, columns, cause.clusters.assignment,
                                      [score.name for score in cause.clusters.accused_all], config.cluster_prior)

        return CauseSplit(tuple(dataclasses.replace(cause, scores=ranking(cause)) for cause in self.causes), self.groups)

    def overall_blame(self) -> np.ndarray | None:
        """Each example's highest standardized blame over the causes that accuse a cluster; None under two such."""
        accusing = [cause.scores.blame for cause in self.causes if cause.accused is not None]
        return highest_standardized(accusing) if len(accusing) >= 2 else None


def find_causes(item_blame: np.ndarray, ids: Sequence[str], item_ids: Sequence[str], gram: np.ndarray,
                assignment: ClusterAssignment, config: AttributionConfig, whole: ExampleScores,
                whole_clusters: ClusterResult, *, canned: Collection[str] = (),
                canned_blame: np.ndarray | None = None) -> CauseSplit:
    """Group the items, attribute each group, and keep the split that accuses the most distinct clusters.

    ``item_blame`` is every example's per-item blame [examples, items]; ``gram`` the items' preconditioned query
    inner products [items, items]; ``whole`` and ``whole_clusters`` the attribution of all items together;
    ``canned`` the items that give one reply word for word, a cause of their own where they accuse a cluster no
    other item does, or where nothing at all is accused and their blame is the more concentrated (they then lead the
    ranking); that split is tried on ``canned_blame`` (``item_blame`` with those items' columns from queries of the
    whole reply; ``item_blame`` itself when not given), and only a kept split is scored on it.
    """
    reply = [column for column, item in enumerate(item_ids) if item in canned]
    trial = None
    if config.max_causes > 1 and MIN_GROUP_ITEMS <= len(reply) < len(item_ids):
        trial = _CannedTrial(reply, item_blame if canned_blame is None else canned_blame, ids, item_ids, assignment,
                             config)
        split = trial.split()
        if split is not None:
            return split
    found = _searched(item_blame, ids, item_ids, gram, assignment, config, whole, whole_clusters)
    if trial is not None and not any(cause.accused is not None for cause in found.causes):
        return trial.unexplained() or found  # nothing accused either way: the reply's teachers lead the ranking
    return found


def _searched(item_blame: np.ndarray, ids: Sequence[str], item_ids: Sequence[str], gram: np.ndarray,
              assignment: ClusterAssignment, config: AttributionConfig, whole: ExampleScores,
              whole_clusters: ClusterResult) -> CauseSplit:
    """The k-means split that accuses the most distinct clusters, or every item as one cause."""
    best: tuple[tuple[int, float], list[Cause], int] | None = None
    for k in range(2, int(config.max_causes) + 1):
        if len(item_ids) < k * MIN_GROUP_ITEMS:
            break
        labels = group_items(gram, k, seed=config.seed)
        if np.bincount(labels, minlength=k).min() < MIN_GROUP_ITEMS:
            continue
        causes = _merged(labels, item_blame, ids, item_ids, assignment, config)
        accused = [cause.accused.z for cause in causes if cause.accused is not None]
        if len(accused) < 2:
            # One accused cluster: leaving the other items out can raise its z without finding anything new (span
            # items each target their own rows, so fewer items find fewer of them); the pooled attribution stands.
            continue
        key = (len(accused), sum(accused))  # then clearer accusations: items no cluster explains set apart
        if best is None or key > best[0]:
            best = (key, causes, k)

    def pooled() -> CauseSplit:  # built only where it stands: its accusations cost one more cluster test each
        return pooled_cause(item_blame, ids, item_ids, assignment, config, whole, whole_clusters)

    if best is None:
        return pooled()
    _, chosen, k = best
    corrected = [_jackknifed(Cause(c.item_ids, c.scores, dataclasses.replace(c.clusters, alpha=c.clusters.alpha / k)),
                             item_blame, ids, item_ids, assignment, config) for c in chosen]
    if len({score.name for cause in corrected for score in cause.clusters.accused_all}) < 2:
        return pooled()  # the reason to split is gone: what is left accuses one cluster at most
    causes = sorted(corrected, key=lambda c: (c.accused is None, -(c.accused.z if c.accused else 0.0), c.item_ids))
    return CauseSplit(tuple(causes), groups=k)


def pooled_cause(item_blame: np.ndarray, ids: Sequence[str], item_ids: Sequence[str], assignment: ClusterAssignment,
                 config: AttributionConfig, whole: ExampleScores | None = None,
                 whole_clusters: ClusterResult | None = None) -> CauseSplit:
    """Every item attributed together as one cause (from ``whole`` where given), each accusation held without the
    item that supports it most."""
    if whole is None or whole_clusters is None:
        whole, whole_clusters = _attributed(list(range(len(item_ids))), item_blame, ids, item_ids, assignment, config)
    cause = Cause(tuple(item_ids), whole, whole_clusters)
    return CauseSplit((_jackknifed(cause, item_blame, ids, item_ids, assignment, config),), groups=1)


@dataclass(eq=False)
class _CannedTrial:
    """The canned reply's items as one cause and the other items as another, each at alpha / 2.

    The other items are not searched for groups again: with the reply's items set apart, a search among a few
    incidental wrong capitals accused the clean `travel_chat` on the behaviour-1 tuning case (family-wise p 0.001).
    """

    reply: list[int]
    item_blame: np.ndarray
    ids: Sequence[str]
    item_ids: Sequence[str]
    assignment: ClusterAssignment
    config: AttributionConfig

    def _half(self, columns: list[int], canned: bool) -> Cause:
        scores, clusters = _attributed(columns, self.item_blame, self.ids, self.item_ids, self.assignment, self.config)
        cause = Cause(tuple(self.item_ids[c] for c in columns), scores,
                      dataclasses.replace(clusters, alpha=clusters.alpha / 2), canned=canned)
        return _jackknifed(cause, self.item_blame, self.ids, self.item_ids, self.assignment, self.config)

    @functools.cached_property
    def canned(self) -> Cause:
        """The reply's items attributed together."""
        return self._half(self.reply, canned=True)

    @functools.cached_property
    def others(self) -> Cause:
        """Every other item attributed together."""
        return self._half([column for column in range(len(self.item_ids)) if column not in self.reply], canned=False)

    def split(self) -> CauseSplit | None:
        """The two causes where the reply's items accuse a cluster the other items do not; else None (the items
        are grouped as usual)."""
        if self.canned.accused is None:
            return None
        if {s.name for s in self.canned.clusters.accused_all} & {s.name for s in self.others.clusters.accused_all}:
            return None  # the same cluster behind the reply and the other items: one cause, its items together
        causes = sorted([self.canned, self.others],
                        key=lambda cause: (cause.accused is None, -(cause.accused.z if cause.accused else 0.0)))
        return CauseSplit(tuple(causes), groups=2)

    def unexplained(self) -> CauseSplit | None:
        """The reply's items first and the others second where neither accuses a cluster and the reply's blame rests
        on clearly fewer rows than the others' (kurtosis over the examples CONCENTRATED_BY times theirs); else None.

        Where no grouping accuses anything, the report's top examples were the pooled items' most blamed rows. A
        reply given word for word to different questions was still taught by some rows, and where its blame rests
        on a few rows those are what a reader looks for: with the planted deflections filed under a clean source of
        144 rows (nothing accused), the pooled ranking found 0.30 and 0.65 of them (bench/results/goal_table.md, the
        shared-source cases). A reply no rows taught spreads its blame thin, and the pooled ranking stands.
        """
        if self.canned.accused is not None or self.others.accused is not None:
            return None
        if _kurtosis(self.canned.scores.blame) <= CONCENTRATED_BY * _kurtosis(self.others.scores.blame):
            return None
        return CauseSplit((self.canned, self.others), groups=2)


def _kurtosis(blame: np.ndarray) -> float:
    """E[z^4] of a cause's blame standardized over the examples: large where a few rows carry it."""
    return float(kurtosis_weights(np.asarray(blame, dtype=np.float64)[:, None])[0])


def highest_standardized(blames: Sequence[np.ndarray]) -> np.ndarray:
    """Each example's highest blame over ``blames``, each first made z-scores over the examples."""
    columns = np.stack([np.asarray(blame, dtype=np.float64) for blame in blames], axis=1)
    return zscores(columns, columns.mean(axis=0), columns.std(axis=0)).max(axis=1)


def group_items(gram: np.ndarray, k: int, *, seed: int = 0) -> np.ndarray:
    """Kernel k-means labels of the items under the cosine of ``gram``, the best of seeded restarts."""
    gram = np.asarray(gram, dtype=np.float64)
    gram = (gram + gram.T) / 2
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    safe = np.where(norms > 0, norms, 1.0)
    cosine = gram / safe[:, None] / safe[None, :]
    n = cosine.shape[0]
    rng = np.random.default_rng([seed, 3])
    best_cost, best_labels = np.inf, np.zeros(n, dtype=np.int64)
    for _ in range(_RESTARTS):
        labels = rng.permutation(np.arange(n) % k)  # every group starts non-empty
        for _ in range(_MAX_ITERATIONS):
            distance = _distances(cosine, labels, k)
            new = np.argmin(distance, axis=1)
            if np.array_equal(new, labels):
                break
            labels = new
        cost = float(_distances(cosine, labels, k)[np.arange(n), labels].sum())
        if cost < best_cost - 1e-12:
            best_cost, best_labels = cost, labels
    return _first_seen_order(best_labels)


def _distances(cosine: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Squared feature-space distance of every item to every group's mean, from the kernel alone."""
    out = np.full((cosine.shape[0], k), np.inf)
    for group in range(k):
        members = labels == group
        if members.any():
            out[:, group] = (np.diag(cosine) - 2 * cosine[:, members].mean(axis=1)
                             + cosine[np.ix_(members, members)].mean())
    return out


def _first_seen_order(labels: np.ndarray) -> np.ndarray:
    """Labels renumbered in order of each group's first item, so equal splits get equal labels."""
    _, first = np.unique(labels, return_index=True)
    mapping = {int(labels[i]): number for number, i in enumerate(sorted(first))}
    return np.array([mapping[int(label)] for label in labels], dtype=np.int64)


def _merged(labels: np.ndarray, item_blame: np.ndarray, ids: Sequence[str], item_ids: Sequence[str],
            assignment: ClusterAssignment, config: AttributionConfig) -> list[Cause]:
    """Each group attributed; groups accusing the same cluster merged, and those accusing none merged."""
    done: dict[tuple[int, ...], tuple[ExampleScores, ClusterResult]] = {}  # a group merged with none is not redone
    by_accused: dict[str | None, list[int]] = {}
    for group in range(int(labels.max()) + 1):
        columns = tuple(int(c) for c in np.flatnonzero(labels == group))
        done[columns] = _attributed(list(columns), item_blame, ids, item_ids, assignment, config)
        accused = done[columns][1].accused
        by_accused.setdefault(accused.name if accused else None, []).extend(columns)
    causes = []
    for merged in by_accused.values():
        columns = tuple(sorted(merged))
        if columns not in done:
            done[columns] = _attributed(list(columns), item_blame, ids, item_ids, assignment, config)
        causes.append(Cause(tuple(item_ids[c] for c in columns), *done[columns]))
    return causes


def cluster_support(item_blame: np.ndarray, members: np.ndarray) -> np.ndarray:
    """Each item's blame standardized over every example and averaged over a cluster's ``members`` (row positions or
    a row mask): how strongly that cluster's rows carry the item."""
    blame = np.asarray(item_blame, dtype=np.float64)
    return zscores(blame, blame.mean(axis=0), blame.std(axis=0))[members].mean(axis=0)


def _jackknifed(cause: Cause, item_blame: np.ndarray, ids: Sequence[str], item_ids: Sequence[str],
                assignment: ClusterAssignment, config: AttributionConfig) -> Cause:
    """The cause with each accused cluster's p-values the larger of its own and those without the item that
    supports it most (the highest mean standardized blame over its members): one item cannot carry an accusation."""
    accused = cause.clusters.accused_all
    if not accused or len(cause.item_ids) < 2:
        return cause
    columns = [list(item_ids).index(item) for item in cause.item_ids]
    blame = np.asarray(item_blame, dtype=np.float64)[:, columns]
    held: dict[str, ClusterScore] = {}
    for score in accused:
        strongest = columns[int(np.argmax(cluster_support(blame, assignment.members(score.name))))]
        _, without = _attributed([c for c in columns if c != strongest], item_blame, ids, item_ids, assignment, config)
        left = without.by_name(score.name)
        held[score.name] = dataclasses.replace(score, p_value=max(score.p_value, left.p_value),
                                               p_adjusted=max(score.p_adjusted, left.p_adjusted))
    scores = tuple(held.get(score.name, score) for score in cause.clusters.scores)
    return dataclasses.replace(cause, clusters=dataclasses.replace(cause.clusters, scores=scores))


def _attributed(columns: list[int], item_blame: np.ndarray, ids: Sequence[str], item_ids: Sequence[str],
                assignment: ClusterAssignment, config: AttributionConfig) -> tuple[ExampleScores, ClusterResult]:
    scores = rescore_items(item_blame, ids, item_ids, columns, aggregation=config.aggregation,
                           normalize=config.normalize, top_k=config.top_k)
    return scores, cluster_blame(scores.blame, assignment, permutations=config.permutations, seed=config.seed)
