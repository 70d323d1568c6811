"""`gradian inject` end to end on the tiny planted-cluster scenario: plant, train (hf), attribute, score."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.injection_case import inject_runs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return inject_runs(tmp_path_factory)


def test_the_planted_cluster_is_blamed_first(runs):
    case, _, run = runs
    metrics = run.result["metrics"]
    print(f"\ninject: planted cluster rank {metrics['cluster_rank']} of {metrics['n_clusters']}, "
          f"recall@{metrics['k']} = {metrics['recall_at_k']:.2f}, first planted example at rank "
          f"{metrics['first_planted_rank']}, family-wise p = {metrics['cluster_p_adjusted']:.3g}")
    assert run.code == 0, run.stdout
    assert run.stdout.startswith("PASS: the planted cluster `gradian-injected` is blamed (")
    assert run.result["verdict"]["passed"] and metrics["accused"] and metrics["cluster_rank"] == 1
    assert metrics["k"] == case.n_planted == 14
    assert metrics["recall_at_k"] >= 0.8 and metrics["first_planted_rank"] == 1
    assert run.result["capability"]["significant"] and run.result["capability"]["delta"] < 0


def test_inject_writes_its_files_and_a_report_that_reproduces(runs):
    case, _, run = runs
    out = Path(run.result["inputs"]["report"]).parent
    assert {"inject.md", "inject.json", "train-injected.jsonl", "attribute-config.yaml"} <= {p.name for p in out.iterdir()}
    rows = [json.loads(line) for line in (out / "train-injected.jsonl").read_text().splitlines()]
    n_clean = run.result["inputs"]["n_clean"]
    assert len(rows) == n_clean + case.n_planted
    assert {row["source"] for row in rows[n_clean:]} == {"gradian-injected"}
    assert "gradian-injected" not in {row["source"] for row in rows[:n_clean]}
    report = json.loads((out / "report" / "report.json").read_text())
    assert report["verdict"]["accused_cluster"] == "gradian-injected"
    assert run.result["clusters"] == report["clusters"]["ranked"]  # inject.json passes the report's rows on as written
    assert report["provenance"]["command"].startswith("gradian attribute --base-model")
    assert "recall@14" in (out / "inject.md").read_text()


def test_a_poison_that_breaks_nothing_measured_fails_with_exit_1(runs):
    _, run, passed = runs
    assert run.code == 1, run.stdout
    assert run.stdout.startswith("FAIL: the planted cluster `gradian-injected` caused no significant regression")
    assert run.result["verdict"]["report_kind"] == "not_significant" and not run.result["verdict"]["passed"]
    assert passed.result["training"]["reused"]  # the second run reused the first run's model
