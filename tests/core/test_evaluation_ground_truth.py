"""One scorer of "did it find the planted rows" for the demo, inject and the benchmarks: pinned numbers."""

from __future__ import annotations

import numpy as np
import pytest

from gradian.demo.scenarios import make_scenario
from gradian.evaluation.ground_truth import GroundTruth, cluster_ranks, clusters_by_mean_blame, rank_planted


def test_a_known_ranking():
    blame = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    truth = GroundTruth(planted_rows=(1, 2), sources=("a", "p", "p", "b", "b", "a"), planted_clusters=("p",),
                        reproduced_rows=(2,))
    metrics = truth.score(blame)
    assert metrics["recall_at_k"] == 0.5  # top 2 are rows 0 and 1
    assert metrics["first_hit_rank"] == 2
    assert metrics["auprc"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert metrics["recall_reproduced"] == 0.0  # row 2 is not the top 1
    assert metrics["cluster_rank"] == 1  # mean blame p 3.5 > a 2.5 > b 1.5


def test_a_truncated_ranking_counts_the_planted_rows_it_lists():
    found = rank_planted(["c1", "p2", "c2", "p1"], ["p1", "p2", "p3"])
    assert found.hit_ranks == (2, 4) and found.planted == 3 and found.listed == 4
    assert (found.hits_at(1), found.hits_at(2), found.hits_at(10)) == (0, 1, 2) and found.first_hit_rank == 2
    assert rank_planted(["c1"], ["p1"]).first_hit_rank is None
    assert np.isnan(rank_planted(["c1"], ["p1"]).average_precision())
    assert cluster_ranks(["a", "p", "b"], ["p", "q"]) == (2, None)


def _two_causes_case():
    """two_causes seed 0, a fixed blame vector (planted rows and the reproduced ones lifted), the reproduced ids."""
    scenario = make_scenario("two_causes", 0)
    blame = np.random.default_rng(11).normal(size=len(scenario.train))
    blame[list(scenario.planted_rows)] += 1.0
    learned = sorted({target for target in scenario.planted_targets if target is not None})[:4]
    blame[[row for row, target in zip(scenario.planted_rows, scenario.planted_targets, strict=True)
           if target in learned]] += 1.0
    # The fine-tuned model answers each learned capital with the first decoy planted for it.
    first_wrong: dict[str, str] = {}
    for target, wrong in zip(scenario.planted_targets, scenario.planted_wrong, strict=True):
        if target in learned:
            first_wrong.setdefault(target, wrong)
    reproduced = {row_id for row_id, target, wrong in zip(scenario.planted_ids, scenario.planted_targets,
                                                           scenario.planted_wrong, strict=True)
                  if target in learned and wrong == first_wrong[target]}
    return scenario, blame, reproduced


def test_pinned_numbers_of_a_fixed_blame_vector():
    # Pinned before the demo, inject and the benchmarks shared this scorer, from bench/accuracy.py's ranking_metrics,
    # demo.run.check_ground_truth and counterfactual.inject.inject_metrics on this blame vector (the report's top 60).
    scenario, blame, reproduced = _two_causes_case()
    assert len(reproduced) == 8
    assert scenario.ground_truth(reproduced).score(blame) == {
        "recall_at_k": 0.35, "auprc": 0.2984045294425063, "first_hit_rank": 4, "recall_reproduced": 0.375,
        "cluster_rank": 2}
    order = np.argsort(-blame, kind="stable")
    top = [scenario.train[row].id for row in order[:60]]
    found = rank_planted(top, scenario.planted_ids)
    assert (found.hits_at(40), found.hits_at(10), found.first_hit_rank) == (14, 4, 4)  # demo and inject, k 40 / 10
    untargeted = {row_id for row_id, target in zip(scenario.planted_ids, scenario.planted_targets, strict=True)
                  if target is None}
    assert rank_planted([row_id for row_id in top if row_id not in untargeted], reproduced).hits_at(8) == 3
    ranked = clusters_by_mean_blame(blame, [str(example.fields["source"]) for example in scenario.train])
    assert len(ranked) == 9 and cluster_ranks(ranked, scenario.planted_clusters) == (1, 2)
