"""The report's next step: which `gradian verify` checks its answer, the same in report.md, report.html and the terminal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradian.attribution import ArraySource, cluster_blame, clusters_from_field, diagonal_preconditioner, score_examples
from gradian.config import EvaluationConfig, GradianConfig
from gradian.data.examples import Message, make_example
from gradian.evaluation import capability_from_scores
from gradian.report import Provenance, attribution_report, refusal_report, render_markdown
from gradian.report.html import render_html
from gradian.report.json_report import next_step

N_ROWS, DIM, TOP = 80, 12, 5
PLANTED = range(10, 18)


def _report(host: str | None, spread: bool = False):
    """A real attributed report of 80 rows: 8 planted rows filed under ``host`` (their own cluster where None)."""
    rng = np.random.default_rng(0)
    failure = rng.normal(size=DIM)
    train = rng.normal(size=(N_ROWS, DIM))
    train[list(PLANTED)] = -3 * failure + 0.3 * rng.normal(size=(len(PLANTED), DIM))

    def source(i: int) -> str:
        if i in PLANTED and not spread:
            return host or "vendor"
        return ("wiki", "forum", "mail", "news")[i % 4] if spread else ("wiki" if i % 2 else "forum")

    examples = [make_example(i, messages=[Message("user", f"Tell me about {i}."), Message("assistant", f"Entry {i}.")],
                             fields={"source": source(i)}) for i in range(N_ROWS)]
    ids = [e.id for e in examples]
    items = [make_example(i, messages=[Message("user", f"Capital {i}?"), Message("assistant", f"City {i}")])
             for i in range(12)]
    capability = capability_from_scores("exact_match", items, [1.0] * 12, [0.0] * 9 + [1.0] * 3,
                                        EvaluationConfig(bootstrap_samples=1000),
                                        base_outputs=[f"City {i}" for i in range(12)],
                                        finetuned_outputs=[f"City {i}" if i >= 9 else "Town" for i in range(12)])
    queries = failure + 0.2 * rng.normal(size=(len(capability.regressed_ids), DIM))
    pre = diagonal_preconditioner((train**2).mean(axis=0))
    scores = score_examples(ArraySource(train, ids), queries, preconditioner=pre, item_ids=capability.regressed_ids,
                            top_k=TOP)
    clusters = cluster_blame(scores.blame, clusters_from_field(examples, "source", ids=ids), permutations=200)
    provenance = Provenance(command="gradian attribute", manifest={}, index_id="idx", versions={},
                            config=GradianConfig().to_dict(), generated_at="2025-01-01T00:00:00+00:00")
    return attribution_report(scores=scores, capability=capability, preconditioner=pre,
                              texts={e.id: e.supervised_text for e in examples}, provenance=provenance,
                              clusters=clusters)


def test_a_small_accused_cluster_is_checked_by_dropping_it_whole():
    report = _report(host=None)
    assert report["verdict"]["accused_clusters"] == ["vendor"]
    step = next_step(report)
    assert step.startswith("Next: check the blamed cluster by retraining without it against a random drop")
    assert "`gradian verify --report REPORT_DIR --out VERIFY_DIR`" in step
    assert "`gradian export --report REPORT_DIR --out CLEANED_DATASET --drop accused`" in step
    assert "top:" not in step  # 8 rows: no narrower drop to offer
    assert step in render_markdown(report)
    assert "<code>gradian verify --report REPORT_DIR --out VERIFY_DIR</code>" in render_html(report)


def test_an_accused_host_wider_than_twice_the_top_k_offers_its_most_blamed_instead():
    report = _report(host="forum")  # the 8 planted rows among 36 clean forum rows
    assert report["verdict"]["accused_clusters"] == ["forum"]
    step = next_step(report)
    assert f"It holds 44 examples: where the blame sits in a few of them, `--drop top:{TOP}` checks the {TOP} most " \
           "blamed instead." in step
    assert step in render_markdown(report)


def test_nothing_accused_points_at_the_top_examples_and_their_drop():
    report = _report(host=None, spread=True)  # planted rows spread over four sources: no cluster stands out
    assert report["verdict"]["kind"] == "attributed" and not report["verdict"]["accused_clusters"]
    step = next_step(report, Path("runs/report"))
    assert step == (f"Next: read the top examples; `gradian verify --report runs/report --out runs/verify "
                    f"--drop top:{TOP}` retrains without the {TOP} most blamed against a random drop of {TOP}, and "
                    f"`gradian export --report runs/report --out CLEANED_DATASET --drop top:{TOP}` writes the "
                    "dataset without them.")


@pytest.mark.parametrize("improved", [False, True])
def test_a_report_that_attributed_nothing_has_no_next_step(improved):
    items = [make_example(i, messages=[Message("user", f"Q{i}?"), Message("assistant", "A")]) for i in range(12)]
    fine = [1.0] * 12 if improved else [1.0] * 11 + [0.0]
    capability = capability_from_scores("exact_match", items, [1.0] * 11 + [0.0], fine,
                                        EvaluationConfig(bootstrap_samples=200))
    provenance = Provenance(command="gradian attribute", manifest={}, index_id="idx", versions={},
                            config=GradianConfig().to_dict(), generated_at="2025-01-01T00:00:00+00:00")
    report = refusal_report(capability=capability, provenance=provenance)
    assert next_step(report) == "" and "Next:" not in render_markdown(report)


def test_a_directory_with_a_space_is_quoted_for_the_shell():
    step = next_step(_report(host=None), Path("my runs/report"))
    assert "--report 'my runs/report' --out 'my runs/verify'" in step


def test_a_split_report_offers_the_most_blamed_of_every_cause_that_accuses_a_cluster():
    from tests.core.test_attribution_causes import DIM as CAUSES_DIM
    from tests.core.test_attribution_causes import _attributed, _two_causes

    train, queries, _, rows, _, _ = _two_causes()
    items = [make_example(i, messages=[Message("user", f"Capital {i}?"), Message("assistant", f"City {i}")])
             for i in range(11)]
    capability = capability_from_scores("exact_match", items, [1.0] * 11, [0.0] * 11,
                                        EvaluationConfig(bootstrap_samples=1000))
    split, _, _ = _attributed(train, queries, capability.regressed_ids, rows)
    report = attribution_report(scores=split.primary.scores, capability=capability,
                                preconditioner=diagonal_preconditioner(np.ones(CAUSES_DIM)), texts={},
                                provenance=Provenance(command="gradian attribute", versions={},
                                                      generated_at="2025-01-01T00:00:00+00:00"),
                                clusters=split.primary.clusters, causes=split, top_k=TOP)
    assert [cause["accused_cluster"] for cause in report["causes"]] == ["vendor-a", "vendor-b"]
    # 24 accused rows: more than twice the 2 x 5 most blamed, so the narrower drop covers both causes
    assert (f"They hold 24 examples: where the blame sits in a few of them, `--drop top:{2 * TOP}` checks the "
            f"{2 * TOP} most blamed instead ({TOP} for each of the 2 causes that accuse a cluster; scores.csv ranks "
            "every example by its highest blame among them).") in next_step(report)
