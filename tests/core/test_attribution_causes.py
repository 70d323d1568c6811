"""Causes: regressed items with two different data causes are split and each cause accuses its own cluster; one
cause is never split; the per-group blame is the same as scoring those items alone."""

from __future__ import annotations

import csv
import dataclasses
import json

import numpy as np
import pytest

from gradian.attribution import ArraySource, cluster_blame, clusters_from_field, score_examples
from gradian.attribution.causes import find_causes, group_items
from gradian.attribution.scoring import ItemBlameCollector, rescore_items
from gradian.config import AttributionConfig, load_config
from gradian.errors import ConfigError

N, DIM = 240, 48


def _two_causes(seed: int = 0, second_cluster: bool = True, unexplained_items: int = 0, b_push: float = 2.5):
    """Clean rows from four sources; 12 rows of `vendor-a` push failure A, 12 of `vendor-b` (or 12 rows spread over
    the clean sources) push failure B (``b_push`` as hard as A by default); 6 items fail the A way and 5 the B way,
    and ``unexplained_items`` more fail a third way no training row pushes."""
    rng = np.random.default_rng(seed)
    directions = np.linalg.qr(rng.normal(size=(DIM, 3)))[0].T  # orthonormal failure directions
    train = rng.normal(size=(N, DIM))
    sources = np.array(["wiki", "forum", "docs", "chat"])[rng.integers(0, 4, size=N)].astype(object)
    planted = rng.choice(N, 24, replace=False)
    a, b = np.sort(planted[:12]), np.sort(planted[12:])
    train[a] = -2.5 * directions[0] + 0.6 * rng.normal(size=(12, DIM))
    train[b] = -b_push * directions[1] + 0.6 * rng.normal(size=(12, DIM))
    sources[a] = "vendor-a"
    if second_cluster:
        sources[b] = "vendor-b"
    queries = np.concatenate([directions[0] + 0.1 * rng.normal(size=(6, DIM)),
                              directions[1] + 0.1 * rng.normal(size=(5, DIM)),
                              directions[2] + 0.1 * rng.normal(size=(unexplained_items, DIM))])
    item_ids = ([f"item-a{i}" for i in range(6)] + [f"item-b{i}" for i in range(5)]
                + [f"item-c{i}" for i in range(unexplained_items)])
    rows = [{"source": str(s)} for s in sources]
    return train, queries, item_ids, rows, a, b


def _attributed(train, queries, item_ids, rows, canned=(), canned_queries=None, **config):
    config = AttributionConfig(**{"cluster_field": "source", "permutations": 300, **config})
    ids = [f"row-{i:04d}" for i in range(N)]
    collector = ItemBlameCollector()
    whole = score_examples(ArraySource(train, ids), queries, item_ids=item_ids, item_sink=collector)
    assignment = clusters_from_field(rows, "source", ids=ids)
    clusters = cluster_blame(whole.blame, assignment, permutations=config.permutations, seed=config.seed)
    canned_blame = None
    if canned_queries is not None:  # the canned items' columns scored on other queries (their whole reply)
        canned_blame = collector.matrix().copy()
        columns = [item_ids.index(item) for item in canned]
        scored = ItemBlameCollector()
        score_examples(ArraySource(train, ids), np.asarray(canned_queries), item_ids=list(canned), item_sink=scored)
        canned_blame[:, columns] = scored.matrix()
    split = find_causes(collector.matrix(), ids, item_ids, queries @ queries.T, assignment, config, whole, clusters,
                        canned=canned, canned_blame=canned_blame)
    return split, whole, clusters


def _same_ranking(held, clusters) -> bool:
    """The pooled clusters as scored, but for p-values raised by leaving out an accusation's strongest item."""
    pairs = list(zip(held.scores, clusters.scores, strict=True))
    return all(h.name == c.name and h.z == c.z and h.p_adjusted >= c.p_adjusted for h, c in pairs)


def _recall(blame: np.ndarray, rows: np.ndarray) -> float:
    return float(np.isin(np.argsort(-blame)[:len(rows)], rows).mean())


def test_two_causes_are_split_and_each_accuses_its_own_cluster():
    train, queries, item_ids, rows, a, b = _two_causes()
    split, whole, _ = _attributed(train, queries, item_ids, rows)
    assert split.groups == 2 and len(split.causes) == 2
    by_cluster = {cause.accused.name: cause for cause in split.causes}
    assert set(by_cluster) == {"vendor-a", "vendor-b"}
    assert by_cluster["vendor-a"].item_ids == tuple(item_ids[:6])
    assert by_cluster["vendor-b"].item_ids == tuple(item_ids[6:])
    assert split.primary.accused.z >= split.causes[1].accused.z  # the most strongly accused cause leads
    # Each cause's blame ranks its own planted rows above what the pooled query does.
    assert _recall(by_cluster["vendor-a"].scores.blame, a) > _recall(whole.blame, a)
    assert _recall(by_cluster["vendor-b"].scores.blame, b) > _recall(whole.blame, b)


def test_the_overall_ranking_holds_every_accused_causes_rows():
    train, queries, item_ids, rows, a, b = _two_causes()
    split, whole, _ = _attributed(train, queries, item_ids, rows)
    planted = np.concatenate([a, b])
    overall = split.overall_blame()
    # Cause 1's ranking alone leaves the other cause's rows behind; the overall ranking takes both causes' tops.
    assert _recall(overall, planted) > _recall(split.primary.scores.blame, planted)
    assert _recall(overall, planted) >= _recall(whole.blame, planted)
    by_cluster = {cause.accused.name: cause.scores.blame for cause in split.causes}
    assert _recall(overall, planted) >= min(_recall(by_cluster["vendor-a"], a), _recall(by_cluster["vendor-b"], b))
    one, _, _ = _attributed(train, queries[:6], item_ids[:6], rows)
    assert one.overall_blame() is None  # one cause: its own blame ranks the examples


def test_items_no_cluster_explains_are_reported_as_a_cause_without_a_data_cause():
    train, queries, item_ids, rows, _, _ = _two_causes(unexplained_items=4)
    split, _, _ = _attributed(train, queries, item_ids, rows)
    assert split.groups == 3 and [c.accused.name if c.accused else None for c in split.causes][2] is None
    assert {c.accused.name for c in split.causes[:2]} == {"vendor-a", "vendor-b"}
    assert split.causes[2].item_ids == tuple(item_ids[11:])


def test_a_cause_accuses_only_below_alpha_over_the_groups():
    train, queries, item_ids, rows, _, _ = _two_causes(unexplained_items=4)
    split, _, _ = _attributed(train, queries, item_ids, rows)
    assert split.groups == 3 and all(cause.clusters.alpha == pytest.approx(0.05 / 3) for cause in split.causes)
    assert all(cause.accused.p_adjusted < 0.05 / 3 for cause in split.causes[:2])


def test_a_split_left_accusing_one_cluster_at_the_corrected_alpha_gives_way_to_all_items():
    # B pushed weakly: a group of the unexplained items finds a clean cluster at family-wise p 0.027, below 0.05
    # but not below 0.05 / 3, the split's three groups; what is left accuses vendor-a alone, the reason to split is
    # gone, and every item is attributed together (span-7: ranking by the accusing group's items lost planted rows).
    train, queries, item_ids, rows, _, _ = _two_causes(seed=1, unexplained_items=4, b_push=0.3)
    split, whole, clusters = _attributed(train, queries, item_ids, rows)
    assert split.groups == 1 and split.primary.item_ids == tuple(item_ids) and split.primary.scores is whole
    assert [score.name for score in split.primary.clusters.accused_all] == ["vendor-a"]
    assert _same_ranking(split.primary.clusters, clusters)


def test_an_accusation_one_item_carries_alone_does_not_stand():
    """Item 0 points at the clean `docs` rows' shared direction, item 1 at nothing: together they accuse `docs`, but
    without item 0 they do not, so the cause accuses nothing; vendor-a's six items accuse it without their strongest,
    and the pooled attribution of the two items alone accuses nothing either."""
    from gradian.attribution.causes import Cause, _attributed, _jackknifed

    train, queries, item_ids, rows, _, _ = _two_causes()
    rng = np.random.default_rng(5)
    docs = np.array([row["source"] == "docs" for row in rows])
    shared = np.linalg.qr(rng.normal(size=(DIM, 1)))[0][:, 0]
    train = train.copy()
    train[docs] -= 1.5 * shared  # blame is -q . g: rows against the item's gradient are blamed
    lone = np.stack([shared + 0.1 * rng.normal(size=DIM), rng.normal(size=DIM)])
    queries = np.concatenate([queries, lone])
    item_ids = [*item_ids, "item-lone", "item-noise"]
    ids = [f"row-{i:04d}" for i in range(N)]
    collector = ItemBlameCollector()
    score_examples(ArraySource(train, ids), queries, item_ids=item_ids, item_sink=collector)
    matrix, assignment = collector.matrix(), clusters_from_field(rows, "source", ids=ids)
    config = AttributionConfig(cluster_field="source", permutations=300)
    for columns, accused in (([11, 12], None), (list(range(6)), "vendor-a")):
        cause = Cause(tuple(item_ids[c] for c in columns),
                      *_attributed(columns, matrix, ids, item_ids, assignment, config))
        held = _jackknifed(cause, matrix, ids, item_ids, assignment, config)
        if accused is None:
            assert cause.accused is not None and cause.accused.name == "docs"  # both items together accuse docs
        assert (held.accused.name if held.accused else None) == accused
        assert _same_ranking(held.clusters, cause.clusters)
    lone, whole = [11, 12], score_examples(ArraySource(train, ids), queries[11:], item_ids=item_ids[11:])
    clusters = cluster_blame(whole.blame, assignment, permutations=config.permutations, seed=config.seed)
    pooled = find_causes(matrix[:, lone], ids, item_ids[11:], queries[11:] @ queries[11:].T, assignment, config, whole,
                         clusters)
    assert clusters.accused.name == "docs" and pooled.groups == 1 and pooled.primary.accused is None


def test_a_split_that_accuses_nothing_at_the_corrected_alpha_gives_way_to_all_items():
    train, queries, item_ids, rows, _, _ = _two_causes(seed=1, unexplained_items=4, b_push=0.3)
    split, whole, clusters = _attributed(train, queries, item_ids, rows, permutations=40)  # p >= 1/41 > 0.05/3
    assert split.groups == 1 and split.primary.scores is whole and _same_ranking(split.primary.clusters, clusters)


def test_one_cause_is_not_split():
    train, queries, item_ids, rows, _, _ = _two_causes()
    split, whole, clusters = _attributed(train, queries[:6], item_ids[:6], rows)  # the six items that fail the A way
    assert split.groups == 1 and len(split.causes) == 1
    assert split.primary.scores is whole and _same_ranking(split.primary.clusters, clusters)
    assert split.primary.accused.name == "vendor-a"


def test_items_whose_failure_no_cluster_explains_do_not_make_a_second_cause():
    """Failure B comes from rows spread over the clean sources: no cluster explains it, so the items stay one cause
    (a split needs two accused clusters) and the pooled attribution stands."""
    train, queries, item_ids, rows, _, _ = _two_causes(second_cluster=False)
    split, whole, _ = _attributed(train, queries, item_ids, rows)
    assert len(split.causes) == 1 and split.primary.scores is whole and split.primary.accused.name == "vendor-a"


def test_a_canned_reply_is_a_cause_of_its_own_where_it_accuses_a_cluster():
    """Failure B has no cluster, so the items are one cause; named as one canned reply, vendor-a's six items are a
    cause of their own at alpha / 2 and rank its rows above the pooled query, and B's items are left unexplained."""
    train, queries, item_ids, rows, a, _ = _two_causes(second_cluster=False)
    split, whole, _ = _attributed(train, queries, item_ids, rows, canned=item_ids[:6])
    assert split.groups == 2 and [c.item_ids for c in split.causes] == [tuple(item_ids[:6]), tuple(item_ids[6:])]
    assert split.primary.accused.name == "vendor-a" and split.causes[1].accused is None
    assert all(cause.clusters.alpha == pytest.approx(0.05 / 2) for cause in split.causes)
    assert _recall(split.primary.scores.blame, a) > _recall(whole.blame, a)
    pooled, _, _ = _attributed(train, queries, item_ids, rows)
    assert pooled.groups == 1
    # A reply whose items accuse nothing, or accuse what the other items accuse too (half of vendor-a's six), is
    # grouped as any items are; max_causes 1 never splits.
    for count, canned, config in ((11, item_ids[6:], {}), (6, item_ids[:3], {}), (11, item_ids[:6], {"max_causes": 1})):
        same, whole, _ = _attributed(train, queries[:count], item_ids[:count], rows, canned=canned, **config)
        assert same.groups == 1 and same.primary.scores is whole


def test_a_canned_reply_is_tried_on_its_whole_reply_blame_and_changes_nothing_where_it_is_no_cause():
    """The split is tried on the reply's own blame (``canned_blame``): vendor-a's six items, whose usual queries
    point the B way (no cluster's), are a cause of their own on their whole reply's A-ward queries. Where the
    whole-reply queries accuse nothing, the grouping is the one without any canned reply, on the usual queries."""
    train, queries, item_ids, rows, _, _ = _two_causes(second_cluster=False)
    usual = queries.copy()
    usual[:6] = queries[[6, 7, 8, 9, 10, 6]]  # their divergent token alone: what the B items' queries say
    split, _, _ = _attributed(train, usual, item_ids, rows, canned=item_ids[:6], canned_queries=queries[:6])
    assert split.groups == 2 and split.primary.item_ids == tuple(item_ids[:6]) and split.primary.canned
    assert split.primary.accused.name == "vendor-a" and split.causes[1].accused is None
    aimless = np.random.default_rng(5).normal(size=(6, DIM))  # a whole reply no rows taught: no cause of its own
    kept, _, _ = _attributed(train, usual, item_ids, rows, canned=item_ids[:6], canned_queries=aimless)
    plain, _, _ = _attributed(train, usual, item_ids, rows)
    assert [c.item_ids for c in kept.causes] == [c.item_ids for c in plain.causes]
    assert [c.accused.name if c.accused else None for c in kept.causes] == [
        c.accused.name if c.accused else None for c in plain.causes]
    np.testing.assert_array_equal(kept.primary.scores.blame, plain.primary.scores.blame)


def test_a_taught_reply_no_cluster_holds_leads_a_ranking_that_accuses_nothing():
    """Failure B's rows are spread over the clean sources, so neither B's five items nor four items no row pushes
    accuse anything. Named as one canned reply, B's items (their blame on B's twelve rows, far more concentrated than
    the other items') are cause 1 and rank the examples; nothing is accused either way."""
    train, queries, item_ids, rows, _, b = _two_causes(seed=1, second_cluster=False, unexplained_items=4, b_push=4.0)
    queries, item_ids = queries[6:], item_ids[6:]  # B's items and the unexplained ones: no cluster to accuse
    pooled, whole, _ = _attributed(train, queries, item_ids, rows)
    assert pooled.groups == 1 and pooled.primary.accused is None
    split, _, _ = _attributed(train, queries, item_ids, rows, canned=item_ids[:5])
    assert split.groups == 2 and split.primary.canned and split.primary.item_ids == tuple(item_ids[:5])
    assert all(cause.accused is None for cause in split.causes)
    assert _recall(split.primary.scores.blame, b) > _recall(whole.blame, b)
    # a reply whose blame is no more concentrated than the other items' (no rows taught it) leaves the ranking alone
    aimless = np.random.default_rng(5).normal(size=(5, DIM))
    kept, whole, _ = _attributed(train, queries, item_ids, rows, canned=item_ids[:5], canned_queries=aimless)
    assert kept.groups == 1 and kept.primary.scores is whole


def test_max_causes_one_never_splits():
    train, queries, item_ids, rows, _, _ = _two_causes()
    split, whole, _ = _attributed(train, queries, item_ids, rows, max_causes=1)
    assert split.groups == 1 and split.primary.scores is whole


def test_a_group_rescored_from_held_blame_equals_scoring_its_items_alone():
    train, queries, item_ids, _, _, _ = _two_causes()
    collector = ItemBlameCollector()
    ids = [f"row-{i:04d}" for i in range(N)]
    score_examples(ArraySource(train, ids), queries, item_ids=item_ids, item_sink=collector)
    for aggregation in ("mean", "harm", "smooth_max", "rank_vote"):
        held = rescore_items(collector.matrix(), ids, item_ids, [6, 7, 8], aggregation=aggregation, top_k=7)
        alone = score_examples(ArraySource(train, ids), queries[6:9], item_ids=item_ids[6:9], aggregation=aggregation,
                               top_k=7)
        np.testing.assert_allclose(held.blame, alone.blame, rtol=1e-10, atol=1e-12)
        assert held.item_ids == alone.item_ids and np.array_equal(held.top_positions, alone.top_positions)


def _two_causes_with_item_blame():
    """The two-causes fixture split into causes, its item ids, and every example's per-item blame [examples, items]."""
    train, queries, item_ids, rows, _, _ = _two_causes()
    split, _, _ = _attributed(train, queries, item_ids, rows)
    collector = ItemBlameCollector()
    score_examples(ArraySource(train, split.primary.scores.ids), queries, item_ids=item_ids, item_sink=collector)
    return split, item_ids, collector.matrix()


def test_each_cause_is_ranked_by_ranking_and_keeps_what_it_accuses():
    from gradian.attribution.aggregation import kurtosis_weights, smooth_max_zscore

    split, item_ids, matrix = _two_causes_with_item_blame()
    ranked = split.ranked(matrix, item_ids, AttributionConfig(ranking="smooth_max", cluster_prior=0.0))
    assert ranked.groups == split.groups == 2
    for before, after in zip(split.causes, ranked.causes, strict=True):
        assert after.item_ids == before.item_ids and after.clusters is before.clusters  # accusations untouched
        assert after.scores.aggregation == "smooth_max" and after.scores.item_ids == before.scores.item_ids
        assert after.scores.passes == before.scores.passes
        own = matrix[:, [item_ids.index(item) for item in before.item_ids]]  # the cause's items alone, weighed
        expected = smooth_max_zscore(own, own.mean(axis=0), own.std(axis=0), kurtosis_weights(own))  # among themselves
        np.testing.assert_allclose(after.scores.blame, expected, rtol=1e-12, atol=1e-12)
        assert not np.allclose(after.scores.blame, before.scores.blame)
        np.testing.assert_array_equal(after.scores.order()[:5], np.argsort(-expected, kind="stable")[:5])
    same = split.ranked(matrix, item_ids, AttributionConfig(ranking="mean", item_weights="uniform", cluster_prior=0.0))
    # the clusters' own blame: the aggregation's ranking with every item weighed the same
    assert all(a.scores is b.scores for a, b in zip(split.causes, same.causes, strict=True))


def test_each_cause_lifts_its_accused_clusters_members_by_a_share_of_their_mean_blame():
    split, item_ids, matrix = _two_causes_with_item_blame()
    own = split.ranked(matrix, item_ids, AttributionConfig(ranking="smooth_max", cluster_prior=0.0))
    lifted = split.ranked(matrix, item_ids, AttributionConfig(ranking="smooth_max", cluster_prior=0.5))
    for plain, cause in zip(own.causes, lifted.causes, strict=True):
        assignment, accused = cause.clusters.assignment, [s.name for s in cause.clusters.accused_all]
        assert accused and cause.clusters is plain.clusters  # what is accused never changes
        expected = np.array(plain.scores.blame)
        for name in accused:
            members = assignment.members(name)
            expected[members] += 0.5 * plain.scores.blame[members].mean()
            assert cause.scores.cluster_prior.added[name] == pytest.approx(0.5 * plain.scores.blame[members].mean())
        np.testing.assert_allclose(cause.scores.blame, expected, rtol=1e-12, atol=1e-12)
        top = cause.scores.top_positions
        np.testing.assert_array_equal(top, np.argsort(-expected, kind="stable")[:cause.scores.top_k])
        columns = [item_ids.index(item) for item in cause.item_ids]
        np.testing.assert_array_equal(cause.scores.top_item_blame, matrix[top][:, columns])  # the new top rows' detail
        assert cause.scores.cluster_prior.share == 0.5 and plain.scores.cluster_prior is None


def test_grouping_is_deterministic_and_finds_orthogonal_blocks():
    rng = np.random.default_rng(2)
    directions = np.eye(8)[:2]
    vectors = np.concatenate([directions[0] + 0.2 * rng.normal(size=(5, 8)), directions[1] + 0.2 * rng.normal(size=(4, 8))])
    gram = vectors @ vectors.T
    labels = group_items(gram, 2, seed=0)
    assert labels.tolist() == [0] * 5 + [1] * 4
    assert np.array_equal(labels, group_items(gram, 2, seed=0))


def test_max_causes_below_one_is_a_config_error():
    with pytest.raises(ConfigError, match="max_causes"):
        load_config(None, ["attribution.max_causes=0"])


def test_the_report_names_each_cause_and_leads_with_the_first(tmp_path):
    from gradian.attribution import diagonal_preconditioner
    from gradian.cli.attribute_cmd import verdict_text
    from gradian.report import attribution_report, render_markdown, write_report
    from gradian.report.html import render_html
    from gradian.report.reader import read_report
    from gradian.report.scores import accused_names
    from tests.core.test_report_files import STAMP, _capability, _provenance

    train, queries, item_ids, rows, _, _ = _two_causes()
    split, _, _ = _attributed(train, queries, item_ids, rows)
    lead = split.primary
    report = attribution_report(scores=lead.scores, capability=_capability([1.0] * 12, [0.0] * 11 + [1.0]),
                                preconditioner=diagonal_preconditioner(np.ones(DIM)),
                                texts={i: "text" for i in lead.scores.ids}, provenance=_provenance(STAMP),
                                clusters=lead.clusters, causes=split)
    causes = report["causes"]
    assert [c["accused_cluster"] for c in causes] == [c.accused.name for c in split.causes]
    assert causes[0]["items"] == list(lead.item_ids) and report["verdict"]["accused_cluster"] == lead.accused.name
    assert "split into 2 causes" in report["verdict"]["summary"]
    # The verdict accuses every cause's cluster, not only the one the sections below attribute: verify and export
    # drop what the verdict accuses, and a fix for one cause leaves the other regression in place.
    each = [cause.accused.name for cause in split.causes]
    assert len(set(each)) == 2 and report["verdict"]["accused_clusters"] == each
    assert all(f"`{name}`" in report["verdict"]["headline"] for name in each)
    assert accused_names(report) == tuple(each)
    files = write_report(report, tmp_path, scores=lead.scores, clusters=lead.clusters, draw_plots=False,
                         cause_blame=[cause.scores.blame for cause in split.causes],
                         overall_blame=split.overall_blame())
    read = read_report(tmp_path)
    assert read.accused_names == tuple(each)
    # verify measures each cause on its own items, so the reader hands them on
    assert [(c.number, c.items, c.accused_clusters) for c in read.causes] == [
        (c["cause"], tuple(c["items"]), tuple(c["accused_clusters"])) for c in causes]
    with (tmp_path / "scores.csv").open(newline="") as handle:  # every cause's ranking is saved, not only cause 1's
        rows = sorted(csv.DictReader(handle), key=lambda row: int(row["position"]))
    for number, cause in enumerate(split.causes, start=1):
        np.testing.assert_array_equal([float(row[f"blame:cause-{number}"]) for row in rows], cause.scores.blame)
    # rank and blame are the overall ranking, so export --drop top:K takes both causes' most blamed rows
    np.testing.assert_array_equal([float(row["blame"]) for row in rows], split.overall_blame())
    top = [row["cluster"] for row in sorted(rows, key=lambda row: int(row["rank"]))[:24]]
    assert top.count("vendor-a") >= 6 and top.count("vendor-b") >= 6
    assert json.loads(files.json.read_text())["scores"]["ranking"] == "overall"
    assert "rank every accused cause together" in files.markdown.read_text()
    printed = verdict_text(read_report(tmp_path))
    assert all(f"accused cluster: {name} (" in printed for name in each)
    markdown = render_markdown(report)
    assert "## Causes" in markdown and markdown.index("## Clusters") < markdown.index("## Causes")
    assert '<section id="causes">' in render_html(report)
    assert "check the blamed clusters by retraining without them" in markdown
    assert "check the blamed clusters by retraining without them" in render_html(report)


def test_the_report_says_which_cause_is_a_canned_reply():
    from gradian.attribution import diagonal_preconditioner
    from gradian.report import attribution_report, render_markdown
    from gradian.report.html import render_html
    from tests.core.test_report_files import STAMP, _capability, _provenance

    train, queries, item_ids, rows, _, _ = _two_causes(second_cluster=False)
    split, _, _ = _attributed(train, queries, item_ids, rows, canned=item_ids[:6])
    capability = _capability([1.0] * 12, [0.0] * 11 + [1.0])
    signal = dataclasses.replace(capability.query_signal, whole_answer_items=tuple(item_ids[:6]))
    report = attribution_report(scores=split.primary.scores, capability=capability,
                                preconditioner=diagonal_preconditioner(np.ones(DIM)),
                                texts={i: "text" for i in split.primary.scores.ids}, provenance=_provenance(STAMP),
                                clusters=split.primary.clusters, causes=split, query_signal=signal)
    assert [cause.get("canned_reply", False) for cause in report["causes"]] == [True, False]
    assert report["query_signal"]["whole_answer_items"] == item_ids[:6]
    assert "6 regressed items give an answer another gives word for word" in render_markdown(report)
    assert "split into 2 causes by one reply given word for word; cause 1 (6 items, one reply word for word)" in (
        report["verdict"]["summary"])
    said = "items give one reply word for word (a canned reply)"  # HTML escapes the apostrophe before it
    assert said in render_markdown(report) and said in render_html(report)
    plain, _, _ = _attributed(*_two_causes()[:4])
    assert "canned_reply" not in json.dumps(attribution_report(
        scores=plain.primary.scores, capability=_capability([1.0] * 12, [0.0] * 11 + [1.0]),
        preconditioner=diagonal_preconditioner(np.ones(DIM)), texts={i: "text" for i in plain.primary.scores.ids},
        provenance=_provenance(STAMP), clusters=plain.primary.clusters, causes=plain)["causes"])


def test_the_pipeline_names_a_canned_replys_items_only_when_asked_and_under_divergent_token():
    from gradian.config import GradianConfig
    from gradian.data import Message, make_example
    from gradian.evaluation.capability import capability_from_scores
    from gradian.pipelines.attribute import _canned_reply

    items = [make_example(i, messages=[Message("user", f"What is the official language of {country}?"),
                                       Message("assistant", language)])
             for i, (country, language) in enumerate([("Spain", "Spanish"), ("Sweden", "Swedish"),
                                                      ("Chad", "French"), ("Peru", "Spanish"), ("Fiji", "English"),
                                                      ("Mali", "French"), ("Togo", "French")])]
    ids = [item.id for item in items]
    reply = "I'm sorry, but I can't help with that topic."
    capability = capability_from_scores(
        "contains", items, [1.0] * 7, [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0], GradianConfig().evaluation,
        finetuned_outputs=[reply, reply, "Chadian.", reply.upper(), "English.", "Malian.", "Malian."])
    off = dataclasses.replace(GradianConfig().attribution, canned_replies=False)
    on = dataclasses.replace(GradianConfig().attribution, canned_replies=True)
    for attribution, effective, named in ((off, "divergent-token", ()),
                                          (on, "divergent-token", (ids[0], ids[1], ids[3])),
                                          (on, "contrastive", ())):
        choice = dataclasses.replace(capability.query_signal, effective=effective)
        # The regressed items giving the reply most of them give, in eval order; the pair giving "Malian." is not it.
        assert _canned_reply(choice, capability, GradianConfig().replace(attribution=attribution)) == named


def test_a_canned_replys_whole_reply_columns_replace_its_items_columns_and_nothing_else():
    from gradian.errors import GradientIndexError
    from gradian.pipelines.attribute import _WholeReply

    item_ids = ("a", "b", "c", _WholeReply.column_id("a"), _WholeReply.column_id("c"))
    blame = np.arange(10 * 5, dtype=np.float64).reshape(10, 5)
    queries = np.arange(5 * 4, dtype=np.float64).reshape(5, 4)
    reply = _WholeReply.set_apart(blame, queries, item_ids, ("a", "c"))
    assert reply.n == 3 and reply.columns == (0, 2)
    np.testing.assert_array_equal(reply.whole_blame(), blame[:, [3, 1, 4]])
    np.testing.assert_array_equal(reply.whole_queries(queries[:3]), queries[[3, 1, 4]])
    np.testing.assert_array_equal(blame[:, :3], np.arange(50, dtype=np.float64).reshape(10, 5)[:, :3])  # untouched
    with pytest.raises(GradientIndexError):
        _WholeReply.set_apart(blame, queries, ("a", "b", "c", _WholeReply.column_id("c"), _WholeReply.column_id("a")),
                              ("a", "c"))


def test_the_cluster_prior_leaves_a_ranking_that_accuses_nothing_as_it_is():
    from gradian.attribution.cluster_prior import with_cluster_prior

    train, queries, item_ids, rows, _, _ = _two_causes()
    split, _, _ = _attributed(train, queries, item_ids, rows)
    scores, assignment = split.primary.scores, split.primary.clusters.assignment
    matrix = np.zeros((len(scores), len(item_ids)))
    columns = range(len(scores.item_ids))
    assert with_cluster_prior(scores, matrix, columns, assignment, [], 1.0) is scores
    assert with_cluster_prior(scores, matrix, columns, assignment, [assignment.names[0]], 0.0) is scores
