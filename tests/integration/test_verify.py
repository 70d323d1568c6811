"""`gradian verify` on the injected scenario: dropping the accused cluster recovers more than a random drop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradian.cli.app import main
from gradian.counterfactual.summary import verify_markdown
from gradian.evaluation.metrics import get_metric
from tests.integration.injection_case import inject_runs
from tests.support.bench import bench_module
from tests.support.scenario import single_thread

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    _, _, run = inject_runs(tmp_path_factory)
    assert run.code == 0, run.stdout
    return Path(run.result["inputs"]["report"])


def test_dropping_the_accused_cluster_recovers_more_than_a_random_control(report_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))
    with single_thread():
        code = main(["verify", "--report", str(report_dir), "--out", str(tmp_path / "verify"), "--controls", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads((tmp_path / "verify" / "verify.json").read_text())
    dropped = next(row for row in result["models"] if row["role"] == "dropped")
    control = next(row for row in result["models"] if row["role"] == "control")
    ev = result["evaluation"]
    print(f"\nverify: base {ev['base_mean']:.3f}, full {ev['full_mean']:.3f}, lost {ev['lost']:.3f}; "
          f"dropped {dropped['mean']:.3f} -> fraction {dropped['fraction']:.2f} "
          f"[{dropped['fraction_low']}, {dropped['fraction_high']}], recovered {dropped['recovered']:+.3f} "
          f"[{dropped['recovered_low']:+.3f}, {dropped['recovered_high']:+.3f}]; control {control['mean']:.3f} -> "
          f"fraction {control['fraction']:.2f}; accused minus control {result['comparisons'][0]['delta']:+.3f} "
          f"[{result['comparisons'][0]['low']:+.3f}, {result['comparisons'][0]['high']:+.3f}]")
    assert result["drop"]["cluster"] == "gradian-injected" and result["drop"]["size"] == 14
    assert result["inputs"]["full_model"] == "the original adapter"
    assert any("gradian-train.yaml" in source for source in result["inputs"]["config_sources"])
    assert ev["lost"] > 0 and ev["base_scores_consistent"]
    assert dropped["recovered"] > control["recovered"]
    assert dropped["fraction"] > control["fraction"]
    assert result["comparisons"][0]["significant"] and result["verdict"]["confirmed"]
    assert not set(control["drop_ids"]) & set(result["drop"]["ids"])
    by_item, items = result["regressed_items"], {item["id"]: item for item in result["items"]}
    assert by_item["count"] == sum(item["base"] > item["full"] for item in items.values()) > 0
    assert by_item["back"] and all(items[i]["dropped"] >= items[i]["base"] for i in by_item["back"])
    assert all(max(items[i]["dropped"], items[i]["control-1"]) <= items[i]["full"] for i in by_item["stuck"])
    assert f"Of the {by_item['count']} regressed items, {len(by_item['back'])} came back" in out
    assert "no retrain gave back" not in (tmp_path / "verify" / "verify.md").read_text()  # none stuck here
    goal_table = bench_module("goal_table")  # the benchmark counts the same items from the per-item scores
    assert goal_table.verify_summary(tmp_path)["stuck"] == f"{len(by_item['stuck'])} of {by_item['count']}"
    pooled = result["accused_causes"]  # cause 1 accuses the injected cluster, which is what was dropped
    assert 1 in pooled["causes"] and set(pooled["items"]) <= set(items) and result["causes"][0]["in_drop"]
    lost = sum(items[i]["base"] - items[i]["full"] for i in pooled["items"])
    assert pooled["fraction"] == pytest.approx(sum(items[i]["dropped"] - items[i]["full"] for i in pooled["items"]) / lost)
    assert f"On the {len(pooled['items'])} items of cause 1, which the report attributes to what was dropped" in out
    assert "## Per cause" in (tmp_path / "verify" / "verify.md").read_text()
    assert goal_table.verify_summary(tmp_path)["causes"]["recovered"] == pytest.approx(pooled["fraction"])
    # bench/stuck_answers.py generates each retrain's answers again: the very answers verify scored
    regressed = [i for i in items if items[i]["base"] > items[i]["full"]]
    answers = bench_module("stuck_answers").retrain_answers(tmp_path / "verify", regressed)
    score = get_metric(ev["metric"]).score
    assert set(answers) == {"dropped", "control-1"}
    for name, by_id in answers.items():
        assert [score(by_id[i], items[i]["wanted"]) for i in regressed] == [items[i][name] for i in regressed]
    first = next(iter(items))
    stuck = verify_markdown({**result, "regressed_items": {**by_item, "stuck": [first]}})
    assert "## Regressed items no retrain gave back\n\nEach scores" in stuck and f"- {first}: wanted" in stuck
    assert out.startswith("Dropping `gradian-injected` (14 examples) recovered")
    assert (tmp_path / "verify" / "verify.md").read_text().startswith("# gradian verify")


def test_a_drop_file_of_the_same_ids_gives_the_same_plan(report_dir, tmp_path):
    from gradian.counterfactual.verify import plan_verify

    by_report = plan_verify(out=tmp_path / "v", report_dir=report_dir)
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("\n".join(reversed(by_report.drop.ids)) + "\n")
    by_file = plan_verify(out=tmp_path / "v", report_dir=report_dir, drop=ids_file)
    assert by_file.drop.ids == by_report.drop.ids and by_file.controls == by_report.controls
    assert by_file.config == by_report.config and by_file.adapter == by_report.adapter


def test_the_reports_top_k_can_be_dropped_instead_of_its_clusters(report_dir, tmp_path, capsys, monkeypatch):
    from gradian.report.scores import read_scores

    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))
    with single_thread():
        code = main(["verify", "--report", str(report_dir), "--drop", "top:14", "--controls", "0",
                     "--out", str(tmp_path / "verify")])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads((tmp_path / "verify" / "verify.json").read_text())
    recorded = read_scores(report_dir)
    assert set(result["drop"]["ids"]) == {i for i, rank in zip(recorded.ids, recorded.ranks, strict=True) if rank <= 14}
    assert result["drop"]["label"] == "the 14 most blamed examples" and result["drop"]["clusters"] == []
    dropped = next(row for row in result["models"] if row["role"] == "dropped")
    assert dropped["training"]["dropped"] == 14 and [row["role"] for row in result["models"]] == ["full", "dropped"]
    assert out.startswith("Dropping the 14 most blamed examples recovered")
    assert "the 14 most blamed examples in" in (tmp_path / "verify" / "verify.md").read_text()
    goal_table = bench_module("goal_table")  # the benchmark's row says what was dropped when it was no cluster
    assert goal_table._verify({"verify": goal_table.verify_summary(tmp_path)}).startswith(
        "dropping the 14 most blamed examples: ")
