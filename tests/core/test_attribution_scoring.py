"""Streamed scoring: equal to dense scoring for any chunk size, exact top-k, the sign, z-score and rank-vote math."""

from __future__ import annotations

import numpy as np
import pytest

from gradian.attribution import (
    ArraySource,
    ExampleScores,
    average_ranks,
    diagonal_preconditioner,
    leading_rows,
    score_examples,
    score_with_config,
)
from gradian.attribution.aggregation import smooth_max_zscore, zscores
from gradian.config import AttributionConfig
from gradian.errors import GradientIndexError


def _data(n: int = 57, dim: int = 16, items: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, dim)), rng.normal(size=(items, dim))


def _bytes(rows: int, dim: int = 16) -> int:
    """The chunk budget that holds ``rows`` float32 rows of width ``dim``."""
    return rows * dim * 4


def _dense(train: np.ndarray, pq: np.ndarray, *, normalize: bool, aggregation: str) -> tuple[np.ndarray, np.ndarray]:
    """The whole items x examples matrix at once: the reference the streamed path must reproduce."""
    rows = train / np.linalg.norm(train, axis=1, keepdims=True) if normalize else train
    blame = -(rows @ pq.T)
    z = (blame - blame.mean(axis=0)) / blame.std(axis=0)
    if aggregation == "mean":
        return z.mean(axis=1), blame
    if aggregation == "harm":
        return np.maximum(z, 0.0).mean(axis=1), blame
    if aggregation == "smooth_max":
        return 2.0 * np.log(np.exp(z / 2.0).mean(axis=1)), blame
    ranks = np.column_stack([average_ranks(blame[:, q]) for q in range(pq.shape[0])])
    return 1.0 - (ranks.mean(axis=1) - 1.0) / (train.shape[0] - 1), blame


@pytest.mark.parametrize("aggregation", ["mean", "harm", "smooth_max", "rank_vote"])
@pytest.mark.parametrize("normalize", [False, True])
def test_chunked_scoring_equals_dense_for_every_chunk_size(aggregation, normalize):
    train, queries = _data()
    expected, blame = _dense(train, queries, normalize=normalize, aggregation=aggregation)
    order = np.lexsort((np.arange(train.shape[0]), -expected))
    for rows in (1, 5, 16, 57, 1000):
        scores = score_examples(ArraySource(train), queries, normalize=normalize, aggregation=aggregation,
                                top_k=10, chunk_bytes=_bytes(rows))
        np.testing.assert_allclose(scores.blame, expected, rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(scores.top_positions, order[:10])  # exact top-k, not approximate
        np.testing.assert_allclose(scores.top_item_blame, blame[order[:10]], rtol=1e-9, atol=1e-12)
        assert scores.ranks[order[0]] == 1 and sorted(scores.ranks) == list(range(1, train.shape[0] + 1))


def test_float32_index_scores_match_float64_closely():
    train, queries = _data(n=200, dim=64)
    exact = score_examples(ArraySource(train), queries, chunk_bytes=_bytes(32, 64))
    single = score_examples(ArraySource(train.astype(np.float32)), queries.astype(np.float32), chunk_bytes=_bytes(32, 64))
    np.testing.assert_allclose(single.blame, exact.blame, atol=1e-4)


def test_float32_rows_score_the_same_under_every_budget():
    train, queries = _data(n=57, dim=3000)
    rows = ArraySource(train.astype(np.float32))
    whole = score_examples(rows, queries, chunk_bytes=1 << 30)
    for chunk_rows in (1, 3, 5, 16):  # float32 sums differ around 1e-6 between the BLAS kernels of these shapes
        chunked = score_examples(rows, queries, chunk_bytes=_bytes(chunk_rows, 3000))
        np.testing.assert_allclose(chunked.blame, whole.blame, rtol=0, atol=1e-5)
        np.testing.assert_allclose(chunked.top_item_blame, whole.top_item_blame, rtol=0,
                                   atol=1e-5 * np.abs(whole.top_item_blame).max())
        np.testing.assert_array_equal(chunked.top_positions, whole.top_positions)


def test_passes_stay_within_the_score_budget():
    train, queries = _data(n=40)
    one_chunk = score_examples(ArraySource(train), queries, chunk_bytes=_bytes(64))
    assert one_chunk.passes == 1  # everything fit one chunk's budget: no second read
    streamed = score_examples(ArraySource(train), queries, chunk_bytes=_bytes(8))
    assert streamed.passes == 2  # 40 x 4 scores are more floats than 8 rows' bytes hold: the index is read twice
    np.testing.assert_allclose(streamed.blame, one_chunk.blame, rtol=1e-10)
    # rank_vote ranks whole columns: a budget of 80 floats holds 2 of 4 items' columns per pass, + 1 for top-k
    grouped = score_examples(ArraySource(train), queries, aggregation="rank_vote", chunk_bytes=_bytes(8), score_budget=80)
    whole = score_examples(ArraySource(train), queries, aggregation="rank_vote", chunk_bytes=_bytes(8),
                           score_budget=10**6)
    assert (grouped.passes, whole.passes) == (3, 1)
    np.testing.assert_allclose(grouped.blame, whole.blame)
    np.testing.assert_allclose(grouped.top_item_blame, whole.top_item_blame)


def test_positive_blame_means_the_example_pushed_toward_the_failure():
    q = np.array([[1.0, 0.0, 0.0]])
    train = np.array([[1.0, 0.0, 0.0],    # a step on it lowers the failing item's loss: helpful
                      [-1.0, 0.0, 0.0],   # a step on it raises that loss: harmful
                      [0.0, 1.0, 0.0]])   # unrelated
    scores = score_examples(ArraySource(train), q, aggregation="mean")
    assert scores.top_ids()[0] == "row-000001"
    assert scores.top_item_blame[0, 0] == 1.0  # raw blame -(q . g) = -(1 x -1)
    assert scores.blame[1] > scores.blame[2] > scores.blame[0]


def test_mean_aggregation_on_a_hand_made_example():
    train = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -2.0]])
    queries = np.array([[-1.0, 0.0], [0.0, -2.0]])
    # raw blame -(q . g): item a -> [1, 0, -1] (mean 0, std sqrt(2/3)); item b -> [0, 2, -4] (mean -2/3,
    # population std sqrt(56)/3); z-scores: a -> [1.2247, 0, -1.2247], b -> [0.2673, 1.0690, -1.3363]
    scores = score_examples(ArraySource(train), queries, item_ids=("a", "b"))
    np.testing.assert_allclose(scores.blame, [(1.2247449 + 0.2672612) / 2, (0 + 1.0690450) / 2,
                                              (-1.2247449 - 1.3363062) / 2], rtol=1e-6)
    np.testing.assert_allclose(scores.item_mean, [0.0, -2 / 3], atol=1e-15)
    np.testing.assert_allclose(scores.item_std, [np.sqrt(2 / 3), np.sqrt(56) / 3])
    assert scores.item_ids == ("a", "b")
    assert list(scores.ranks) == [1, 2, 3]
    np.testing.assert_allclose(scores.top_item_blame, [[1.0, 0.0], [0.0, 2.0], [-1.0, -4.0]])


def test_harm_on_a_hand_made_example_does_not_let_help_to_one_item_offset_harm_to_another():
    train = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -2.0]])
    queries = np.array([[-1.0, 0.0], [0.0, -2.0]])
    # the z-scores of the mean example: a -> [1.2247, 0, -1.2247], b -> [0.2673, 1.0690, -1.3363]
    scores = score_examples(ArraySource(train), queries, item_ids=("a", "b"), aggregation="harm")
    np.testing.assert_allclose(scores.blame, [(1.2247449 + 0.2672612) / 2, 1.0690450 / 2, 0.0], rtol=1e-6)
    assert scores.aggregation == "harm" and list(scores.ranks) == [1, 2, 3]
    # a row that breaks item a as no other row does and helps item b as much: the mean cancels it, harm keeps it
    train = np.array([[-3.0, 3.0], [-1.0, -1.0], [0.0, 0.0], [1.0, 1.0], [0.5, -0.5]])
    queries = np.array([[1.0, 0.0], [0.0, 1.0]])
    mean = score_examples(ArraySource(train), queries, aggregation="mean")
    harm = score_examples(ArraySource(train), queries, aggregation="harm")
    assert mean.top_positions[0] == 1 and harm.top_positions[0] == 0


def test_smooth_max_keeps_a_row_that_broke_one_item_alone_and_a_row_that_pushed_every_item():
    rng = np.random.default_rng(0)
    blame = rng.normal(size=(300, 8))
    blame[0] = [12.0, -4.0, -4.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # one item's own planted row, which two others disown
    blame[1:4] += 2.0  # rows that push every item a little
    mean, std = blame.mean(axis=0), blame.std(axis=0)
    z = zscores(blame, mean, std)
    smooth = smooth_max_zscore(blame, mean, std)
    assert np.all(z.mean(axis=1) <= smooth + 1e-12) and np.all(smooth <= z.max(axis=1) + 1e-12)
    # the mean sinks the lone row and the max the broad pushers; the soft maximum ranks all four in its first five
    assert average_ranks(z.mean(axis=1))[0] > 20 and average_ranks(z.max(axis=1))[1:4].max() > 10
    assert average_ranks(smooth)[:4].max() <= 5
    assert np.isfinite(smooth_max_zscore(blame * 1e3, mean * 1e3, std)).all()  # z in the thousands: no overflow


def test_rank_vote_on_a_hand_made_example():
    train = np.array([[3.0], [2.0], [1.0], [2.0]])
    queries = np.array([[-1.0], [1.0]])
    # item 0 blame [3, 2, 1, 2] -> ranks [1, 2.5, 4, 2.5]; item 1 blame [-3, -2, -1, -2] -> ranks [4, 2.5, 1, 2.5]
    scores = score_examples(ArraySource(train), queries, aggregation="rank_vote")
    mean_rank = np.array([2.5, 2.5, 2.5, 2.5])
    np.testing.assert_allclose(scores.blame, 1.0 - (mean_rank - 1.0) / 3)
    assert list(scores.top_positions[:4]) == [0, 1, 2, 3]  # all tied: position order


def test_zero_rows_and_zero_queries_never_give_nan():
    train, queries = _data(n=12, dim=6)
    train[[0, 5]] = 0.0
    for normalize in (True, False):
        scores = score_examples(ArraySource(train), queries, normalize=normalize, chunk_bytes=_bytes(4, 6))
        assert np.all(np.isfinite(scores.blame)) and np.all(np.isfinite(scores.top_item_blame))
    cos = score_examples(ArraySource(train), queries, normalize=True, aggregation="rank_vote", top_k=12)
    zero_rows = np.isin(cos.top_positions, [0, 5])
    np.testing.assert_array_equal(cos.top_item_blame[zero_rows], 0.0)
    zero_query = score_examples(ArraySource(train), np.zeros((2, 6)))
    np.testing.assert_array_equal(zero_query.blame, 0.0)


def test_normalized_zero_rows_score_zero_raw_blame():
    train = np.array([[0.0, 0.0], [3.0, 4.0]])
    scores = score_examples(ArraySource(train), np.array([[-1.0, 0.0]]), normalize=True, top_k=2)
    detail = dict(zip(scores.top_positions.tolist(), scores.top_item_blame[:, 0].tolist(), strict=True))
    assert detail == {0: 0.0, 1: pytest.approx(0.6)}


def test_preconditioner_is_applied_to_the_query_side():
    train, queries = _data(n=30, dim=8)
    pre = diagonal_preconditioner((train**2).mean(axis=0))
    with_pre = score_examples(ArraySource(train), queries, preconditioner=pre)
    pre_applied = score_examples(ArraySource(train), pre.apply(queries))
    np.testing.assert_allclose(with_pre.blame, pre_applied.blame)
    assert not np.allclose(with_pre.blame, score_examples(ArraySource(train), queries).blame)


def test_bad_index_rows_are_clear_errors():
    train, queries = _data(n=10, dim=4)
    train[7, 2] = np.nan
    with pytest.raises(GradientIndexError) as error:
        score_examples(ArraySource(train, ids=[f"ex-{i}" for i in range(10)]), queries, chunk_bytes=_bytes(3, 4))
    assert "ex-7" in error.value.message
    with pytest.raises(GradientIndexError) as width:
        score_examples(ArraySource(np.ones((3, 5))), queries)
    assert "projection" in width.value.hint


def test_results_are_frozen():
    train, queries = _data(n=10, dim=4)
    scores = score_examples(ArraySource(train), queries)
    assert isinstance(scores, ExampleScores)
    with pytest.raises(ValueError):
        scores.blame[0] = 1.0
    with pytest.raises(AttributeError):
        scores.aggregation = "rank_vote"  # type: ignore[misc]


def test_leading_rows_reads_only_what_it_needs():
    train, _ = _data(n=30, dim=4)
    np.testing.assert_allclose(leading_rows(ArraySource(train), 7, chunk_bytes=_bytes(3, 4)), train[:7].astype(np.float32))
    assert leading_rows(ArraySource(train), 100).shape == (30, 4)


def test_score_with_config_reads_the_attribution_section():
    train, queries = _data(n=30)
    config = AttributionConfig(aggregation="rank_vote", normalize=True, top_k=4, chunk_mb=7 * 16 * 4 / 2**20)
    scores = score_with_config(ArraySource(train), queries, config)
    direct = score_examples(ArraySource(train), queries, aggregation="rank_vote", normalize=True, top_k=4,
                            chunk_bytes=_bytes(7))
    assert (scores.aggregation, scores.normalize, scores.top_k) == ("rank_vote", True, 4)
    np.testing.assert_array_equal(scores.blame, direct.blame)


@pytest.mark.parametrize("aggregation", ["mean", "harm", "smooth_max", "rank_vote"])
def test_the_item_sink_gets_every_examples_per_item_blame_once_without_another_read(aggregation):
    from gradian.attribution.scoring import ItemBlameCollector, item_blame

    rng = np.random.default_rng(3)
    rows, queries = rng.normal(size=(37, 8)), rng.normal(size=(3, 8))
    collector = ItemBlameCollector()
    # Chunks of 4 rows and a budget of 8 floats: several chunks, and mean needs a second read of the index.
    scores = score_examples(ArraySource(rows), queries, aggregation=aggregation, chunk_bytes=4 * 8 * 4,
                            score_budget=8, item_sink=collector, top_k=5)
    matrix = collector.matrix()
    assert matrix.shape == (37, 3) and np.allclose(matrix, item_blame(rows, queries))
    assert np.array_equal(matrix[scores.top_positions], scores.top_item_blame)


def _diffuse_and_concentrated_items(seed: int = 0) -> np.ndarray:
    """Blame of 200 rows on 6 items: items 0-3 carried by planted rows 0-3 (one each) and, more weakly, rows 6-7;
    items 4-5 by nobody in particular, their most blamed rows 4-5 only the top of their noise."""
    rng = np.random.default_rng(seed)
    blame = rng.normal(size=(200, 6))
    for row in range(4):
        blame[row, row] += 14.0  # a planted row behind its own item, as a poisoned capital's profile is
    blame[6, 0] += 6.0  # planted rows the fine-tune learned less
    blame[7, 1] += 6.0
    blame[4, 4] += 5.5  # rows about the same topic as an item the learning rate broke
    blame[5, 5] += 5.5
    return blame


def test_kurtosis_weights_favour_items_whose_blame_few_rows_carry():
    from gradian.attribution.aggregation import kurtosis_weights

    weights = kurtosis_weights(_diffuse_and_concentrated_items())
    assert weights[:4].min() > 3 * weights[4:].max()
    z = zscores(_diffuse_and_concentrated_items(), *_moments(_diffuse_and_concentrated_items()))
    np.testing.assert_allclose(weights, (z**4).mean(axis=0))
    # no item with any spread: every item counts the same, not zero over zero
    np.testing.assert_array_equal(kurtosis_weights(np.ones((5, 3))), np.ones(3))


def _moments(blame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return blame.mean(axis=0), blame.std(axis=0)


@pytest.mark.parametrize("aggregation", ["mean", "harm", "smooth_max", "rank_vote"])
def test_kurtosis_weighted_ranking_lifts_the_rows_behind_concentrated_items(aggregation):
    from gradian.attribution.aggregation import kurtosis_weights
    from gradian.attribution.scoring import rescore_items

    blame = _diffuse_and_concentrated_items()
    ids, items = [f"ex-{i}" for i in range(200)], [f"item-{q}" for q in range(6)]
    uniform = rescore_items(blame, ids, items, range(6), aggregation=aggregation)
    weighted = rescore_items(blame, ids, items, range(6), aggregation=aggregation, item_weights="kurtosis")
    assert (uniform.item_weights, weighted.item_weights) == ("uniform", "kurtosis")
    share = kurtosis_weights(blame) / kurtosis_weights(blame).sum()
    z = zscores(blame, *_moments(blame))
    if aggregation == "rank_vote":  # the weighted mean rank, as a Borda score
        ranks = np.column_stack([average_ranks(blame[:, q]) for q in range(6)])
        expected = 1.0 - (ranks @ share - 1.0) / 199
    else:  # the weighted mean over items
        terms = {"mean": z, "harm": np.maximum(z, 0.0)}.get(aggregation, np.exp(z / 2.0))
        expected = terms @ share if aggregation != "smooth_max" else 2.0 * np.log(terms @ share)
    np.testing.assert_allclose(weighted.blame, expected)
    if aggregation == "smooth_max":  # the weaker planted rows 6-7 rise above rows 4-5, which equal weights put first
        assert max(weighted.ranks[[0, 1, 2, 3, 6, 7]]) == 6 and min(uniform.ranks[[4, 5]]) < max(uniform.ranks[[6, 7]])


def test_an_item_of_weight_zero_counts_for_nothing_in_the_smooth_max():
    blame = _diffuse_and_concentrated_items()
    blame[7, 5] = 1e6  # z in the hundreds on an item that is given no weight: no overflow, no effect
    mean, std = _moments(blame)
    weights = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    np.testing.assert_allclose(smooth_max_zscore(blame, mean, std, weights),
                               smooth_max_zscore(blame[:, :5], mean[:5], std[:5]))


def test_ranked_with_config_weighs_items_unless_told_uniform():
    from gradian.attribution.scoring import ranked_with_config, rescore_items

    blame = _diffuse_and_concentrated_items()
    ids, items = [f"ex-{i}" for i in range(200)], [f"item-{q}" for q in range(6)]
    pooled = rescore_items(blame, ids, items, range(6), aggregation="smooth_max")
    uniform = AttributionConfig(ranking="smooth_max", item_weights="uniform")
    assert ranked_with_config(blame, pooled, range(6), uniform) is pooled  # nothing to rescore
    weighted = ranked_with_config(blame, pooled, range(6), AttributionConfig(ranking="smooth_max"))  # the default
    np.testing.assert_array_equal(weighted.blame, rescore_items(blame, ids, items, range(6), aggregation="smooth_max",
                                                                item_weights="kurtosis").blame)
    with pytest.raises(ValueError, match="unknown item weights"):
        rescore_items(blame, ids, items, range(6), item_weights="loud")
