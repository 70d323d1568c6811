"""Clusters: a planted cluster aligned with the failure is accused, a random one is not; membership and errors."""

from __future__ import annotations

import numpy as np
import pytest

from gradian.attribution import (
    ArraySource,
    ClusterAssignment,
    assign_clusters,
    auto_clusters,
    cluster_blame,
    clusters_from_field,
    default_num_clusters,
    diagonal_preconditioner,
    score_clusters,
    score_examples,
    sketch_rows,
)
from gradian.config import AttributionConfig
from gradian.data.examples import Message, make_example
from gradian.errors import DatasetError, GradientIndexError

N, DIM, PLANTED = 240, 48, 12


def _planted_scenario(seed: int = 0):
    """Clean examples from four sources, 12 planted ones sharing a direction that raises the failing items' loss."""
    rng = np.random.default_rng(seed)
    failure = rng.normal(size=DIM)
    failure /= np.linalg.norm(failure)
    train = rng.normal(size=(N, DIM))
    planted = np.sort(rng.choice(N, PLANTED, replace=False))
    # g = -q direction: a step on these rows raises the failing items' loss (positive blame).
    train[planted] = -2.0 * failure + 0.7 * rng.normal(size=(PLANTED, DIM))
    queries = failure + 0.5 * rng.normal(size=(6, DIM))
    sources = np.array(["wiki", "forum", "docs", "chat"])[rng.integers(0, 4, size=N)].astype(object)
    sources[planted] = "vendor-feed"
    rows = [{"source": str(s)} for s in sources]
    return train, queries, rows, planted


def test_planted_cluster_ranks_first_with_a_small_p_value_and_a_random_cluster_does_not():
    train, queries, rows, planted = _planted_scenario()
    rng = np.random.default_rng(99)
    clean = np.setdiff1d(np.arange(N), planted)
    decoy = rng.choice(clean, PLANTED, replace=False)
    for position in decoy:
        rows[position] = {"source": "random-decoy"}
    source = ArraySource(train)
    scores = score_examples(source, queries, preconditioner=diagonal_preconditioner((train**2).mean(axis=0)))
    result = cluster_blame(scores.blame, clusters_from_field(rows, "source"), permutations=500, seed=0)
    top = result.scores[0]
    assert (top.name, top.rank, top.size) == ("vendor-feed", 1, PLANTED)
    assert top.p_value == pytest.approx(1 / 501) and top.p_adjusted == pytest.approx(1 / 501)  # never reached
    assert top.blame == pytest.approx(scores.blame[planted].mean()) and top.z > 4
    assert result.accused is not None and result.accused.name == "vendor-feed"
    decoy_score = result.by_name("random-decoy")
    assert decoy_score.p_value > 0.05 and decoy_score.p_adjusted > 0.05
    assert [s.rank for s in result.scores] == list(range(1, len(result.scores) + 1))


def test_noise_accuses_nothing_even_when_one_cluster_alone_looks_significant():
    rng = np.random.default_rng(3)
    blame = rng.normal(size=200)
    labels = np.repeat(np.arange(5), 40)
    result = cluster_blame(blame, ClusterAssignment(tuple(f"c{i}" for i in range(5)), labels, "field", "source"),
                           permutations=300, seed=0)
    # With five clusters tested, one falls below 0.05 on its own by chance here; the family-wise p does not.
    assert result.scores[0].p_value < 0.05
    assert result.scores[0].p_adjusted > 0.05
    assert result.accused is None


def test_every_significant_cluster_is_accused_and_the_most_blamed_per_member_comes_first():
    """A large mildly blamed cluster out-z's a small strongly blamed one; both are accused, the small one first."""
    rng = np.random.default_rng(4)
    n = 400
    blame = rng.normal(size=n)
    labels = np.zeros(n, dtype=np.int64)  # "clean"
    labels[:46], labels[46:66] = 1, 2  # "broad" (46 rows), "planted" (20 rows)
    blame[:46] += 1.6
    blame[46:66] += 1.9
    result = cluster_blame(blame, ClusterAssignment(names=("clean", "broad", "planted"), labels=labels,
                                                    method="field", field="source"), permutations=400, seed=0)
    assert result.scores[0].name == "broad" and result.by_name("planted").z < result.scores[0].z
    assert [s.name for s in result.accused_all] == ["planted", "broad"]
    assert result.accused.name == "planted" and result.by_name("planted").effect > result.by_name("broad").effect
    assert result.by_name("planted").effect == pytest.approx((blame[46:66].mean() - blame.mean()) / blame.std())


def test_p_value_is_one_plus_exceedances_over_one_plus_permutations():
    blame = np.arange(10, dtype=float)
    everything = ClusterAssignment(("all",), np.zeros(10, dtype=np.int64), "field", "source")
    # Every random cluster of all 10 examples has the same mean: all 200 tie, p = 201 / 201.
    whole = cluster_blame(blame, everything, permutations=200).scores[0]
    assert (whole.p_value, whole.z) == (1.0, 0.0)
    split = ClusterAssignment(("rest", "top"), np.r_[np.zeros(9), 1].astype(np.int64), "field", "source")
    result = cluster_blame(blame, split, permutations=1000, seed=1)
    single = result.by_name("top")  # the one example with the largest blame
    assert single.size == 1 and single.blame == 9.0 and single.rank == 1
    # A random single example reaches 9 only when it is that example: about 1 draw in 10.
    assert 0.05 < single.p_value < 0.15
    assert single.p_value * 1001 == pytest.approx(round(single.p_value * 1001))
    assert single.p_adjusted >= single.p_value


def test_p_values_do_not_depend_on_cluster_order():
    rng = np.random.default_rng(4)
    blame = rng.normal(size=60)
    labels = rng.integers(0, 4, size=60)
    names = ("a", "b", "c", "d")
    forward = cluster_blame(blame, ClusterAssignment(names, labels, "field", "f"), permutations=100, seed=7)
    relabeled = ClusterAssignment(names[::-1], 3 - labels, "field", "f")
    backward = cluster_blame(blame, relabeled, permutations=100, seed=7)
    assert {s.name: s.p_value for s in forward.scores} == {s.name: s.p_value for s in backward.scores}


def test_field_missing_on_some_rows_names_the_count_and_the_first_row():
    examples = [make_example(i, messages=[Message("user", f"q{i}"), Message("assistant", f"a{i}")],
                             fields={"source": "wiki"} if i not in (3, 7) else {"category": "x"})
                for i in range(10)]
    with pytest.raises(DatasetError) as error:
        clusters_from_field(examples, "source")
    assert "2 of 10" in error.value.message and examples[3].id in error.value.message
    assert "cluster_field" in error.value.hint and "category" in error.value.hint
    blank = [{"source": "a"}, {"source": "  "}, {"source": None}]
    with pytest.raises(DatasetError, match="2 of 3"):
        clusters_from_field(blank, "source")


def test_field_clusters_keep_first_appearance_order_and_check_ids():
    examples = [make_example(i, text=f"text {i}", format="text", fields={"source": s})
                for i, s in enumerate(["b", "a", "b", 3])]
    assignment = clusters_from_field(examples, "source", ids=[e.id for e in examples])
    assert assignment.names == ("b", "a", "3") and list(assignment.labels) == [0, 1, 0, 2]
    assert assignment.describe() == "dataset field `source`"
    with pytest.raises(GradientIndexError):
        clusters_from_field(examples, "source", ids=[e.id for e in examples[::-1]])
    with pytest.raises(GradientIndexError):
        clusters_from_field(examples, "source", ids=[e.id for e in examples[:3]])


def test_automatic_clustering_is_deterministic_and_finds_separated_groups():
    rng = np.random.default_rng(5)
    directions = rng.normal(size=(3, 300))
    truth = np.repeat(np.arange(3), 30)
    # Different sizes along one direction must not split it: clustering is on unit-normalized sketches.
    train = directions[truth] * rng.uniform(0.2, 5.0, size=(90, 1)) + 0.05 * rng.normal(size=(90, 300))
    source = ArraySource(train.astype(np.float32))
    first = auto_clusters(source, num_clusters=3, seed=11, chunk_bytes=7 * 300 * 4)  # 7 float32 rows a chunk
    again = auto_clusters(source, num_clusters=3, seed=11, chunk_bytes=64 * 300 * 4)
    np.testing.assert_array_equal(first.labels, again.labels)
    assert first.names == ("auto-00", "auto-01", "auto-02") and first.method == "auto"
    np.testing.assert_array_equal(first.labels, truth)  # named by first member: group 0 is auto-00
    assert first.knobs["sketch_dim"] == 64 and first.knobs["k"] == 3
    assert "k-means" in first.describe()


def test_automatic_clustering_default_k_and_config_route():
    train, _, rows, _ = _planted_scenario()
    assert default_num_clusters(N) == round(np.sqrt(N / 2))
    assert default_num_clusters(3) == 2 and default_num_clusters(1) == 1
    source = ArraySource(train)
    auto = assign_clusters(AttributionConfig(seed=2), None, source)
    assert auto.method == "auto" and len(auto.names) <= default_num_clusters(N)
    assert sum(auto.sizes) == N and min(auto.sizes) > 0
    by_field = assign_clusters(AttributionConfig(cluster_field="source"), rows, source)
    assert by_field.method == "field" and "vendor-feed" in by_field.names
    result = score_clusters(AttributionConfig(cluster_field="source", permutations=50, seed=4),
                            np.arange(N, dtype=float), rows, source)
    assert (result.permutations, result.seed) == (50, 4) and result.assignment.field == "source"


def test_sketch_is_linear_streamed_and_passes_narrow_rows_through():
    rng = np.random.default_rng(6)
    wide = rng.normal(size=(20, 500))
    a = sketch_rows(ArraySource(wide), seed=3, chunk_bytes=6 * 500 * 4)  # 6 rows a chunk
    b = sketch_rows(ArraySource(wide), seed=3, chunk_bytes=20 * 500 * 4)
    np.testing.assert_array_equal(a, b)  # bit for bit: verify recomputes clusters under any budget
    doubled = sketch_rows(ArraySource(2 * wide), seed=3)
    np.testing.assert_allclose(doubled, 2 * a)
    # Feature hashing preserves norms on average.
    ratio = np.linalg.norm(a, axis=1) / np.linalg.norm(wide, axis=1)
    assert 0.7 < ratio.mean() < 1.3
    narrow = rng.normal(size=(5, 8))
    np.testing.assert_array_equal(sketch_rows(ArraySource(narrow), seed=3), narrow)


def test_duplicate_rows_do_not_break_automatic_clustering():
    train = np.tile(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), (10, 1))
    assignment = auto_clusters(ArraySource(train), num_clusters=5, seed=0)
    assert len(assignment.names) == 2  # only two distinct directions exist; empty clusters are dropped
    assert list(assignment.sizes) == [10, 10]
