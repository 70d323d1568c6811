"""`gradian demo` end to end on a tiny model: every stage runs, the second run reuses the work, the verdict prints."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gradian.cli.app import main
from gradian.config import EvaluationConfig, load_config
from gradian.demo.run import check_ground_truth, demo_config, run_demo
from gradian.demo.scenarios import SCENARIOS, make_scenario
from gradian.errors import ModelError
from gradian.report.json_report import next_step


@pytest.mark.slow
def test_demo_cli_runs_every_stage_then_reuses_them(tiny_base_dir, tmp_path, capsys):
    workdir = tmp_path / "demo"
    argv = ["demo", "--base-model", str(tiny_base_dir), "--workdir", str(workdir)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "scenario fact (seed 0): 400 training rows, 20 planted (5.0%), 40 eval items" in out
    assert "diagnose:" in out and "checks ran" in out
    assert f"report: {workdir / 'report' / 'report.md'}" in out
    assert (workdir / "train" / "adapter" / "adapter_model.safetensors").is_file()
    report = json.loads((workdir / "report" / "report.json").read_text())
    assert report["capability"]["n_items"] == 40
    assert report["verdict"]["headline"] in out
    # what to run next is the same paragraph `gradian attribute` prints, naming the demo's report dir
    step = next_step(report, workdir / "report").replace("`", "")
    assert (step in out) if step else ("Next:" not in out)

    assert main(argv) == 0  # the same inputs: nothing is trained or attributed again
    again = capsys.readouterr().out
    assert "train: reusing the adapter" in again
    assert "(reused: train, attribute)" in again
    assert report["verdict"]["headline"] in again


@pytest.mark.slow
def test_demo_api_indexes_scores_and_checks_the_ground_truth(tiny_base_dir, tmp_path):
    # A random tiny model has no capability to lose, so the significance gate is lifted to reach the index,
    # the scoring, the clusters and the ground-truth check; its fine-tuned answers can be empty, so the query is
    # the classic signal (contrastive needs a generation to contrast with).
    scenario = make_scenario("fact", 0)
    base = demo_config(scenario)
    config = base.replace(evaluation=dataclasses.replace(base.evaluation, require_significant=False,
                                                         query_signal="classic"),
                          train=dataclasses.replace(base.train, num_epochs=1.0))
    bars: list[str] = []

    def progress(stage):
        bars.append(stage)
        return lambda done, total: None

    result = run_demo(base_model=str(tiny_base_dir), workdir=tmp_path / "w", config=config, progress=progress,
                      echo=lambda line: None)
    assert {"train", "index"} <= set(bars)
    assert result.report.clusters
    assert result.check.clusters == len(scenario.sources)
    assert result.check.cluster_rank is not None and 1 <= result.check.cluster_rank <= result.check.clusters
    assert result.check.top == len(scenario.planted_rows)
    assert check_ground_truth(scenario, result.report) == result.check
    assert set(result.timings) == {"scenario", "base model", "train", "diagnose", "attribute", "total"}
    assert (tmp_path / "w" / "index").is_dir()
    # The report records the equivalent `gradian attribute` command, with the demo's config as a file, so
    # `gradian verify --report` finds every input and the command reproduces the report.
    command = result.report.provenance.command
    assert command.startswith("gradian attribute ") and "--eval-dataset" in command
    assert load_config(tmp_path / "w" / "config.yaml") == config
    from gradian.counterfactual.verify import plan_verify

    plan = plan_verify(out=tmp_path / "verify", report_dir=tmp_path / "w" / "report", controls=1)
    # The report records the config it ran with: grads.loss_mask and string_pairs auto as they resolved for this run
    # (gradian train supervises assistant turns and renders string pairs through the template).
    resolved = config.replace(grads=dataclasses.replace(config.grads, loss_mask="assistant", string_pairs="template"))
    assert plan.eval_dataset == tmp_path / "w" / "scenario" / "eval.jsonl" and plan.config == resolved


def test_fresh_refuses_a_directory_the_demo_did_not_make(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep me")
    assert main(["demo", "--workdir", str(tmp_path), "--fresh"]) == 2
    assert "not a demo work dir" in capsys.readouterr().err
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_unknown_scenario_is_a_user_error(capsys):
    assert main(["demo", "--scenario", "nonsense"]) == 2
    assert "--scenario 'nonsense' is unknown" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["behaviour", "two_causes", "rare"])
def test_demo_accepts_the_new_scenarios(kind, tmp_path, capsys):
    assert main(["demo", "--scenario", kind, "--help"]) == 0
    assert kind in capsys.readouterr().out
    # Past the scenario check and the demo config of this kind's scenario (built and validated), a bad override
    # stops it before anything is written: the kind is accepted without training anything.
    workdir = tmp_path / "w"
    assert main(["demo", "--scenario", kind, "--set", "train.nonsense=1", "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "train.nonsense" in err and "--scenario" not in err and not workdir.exists()


def test_a_bad_set_override_is_a_user_error_before_anything_is_written(tmp_path, capsys):
    workdir = tmp_path / "w"
    assert main(["demo", "--set", "train.nonsense=1", "--workdir", str(workdir)]) == 2
    assert "train.nonsense" in capsys.readouterr().err and not workdir.exists()


def test_set_overrides_apply_on_top_of_the_demo_config():
    from gradian.config import with_overrides

    config = with_overrides(demo_config(make_scenario("clean", 0)), ["train.learning_rate=5e-4", "train.num_epochs=3"])
    assert config.train.learning_rate == 5e-4 and config.train.num_epochs == 3.0
    assert config.attribution.cluster_field == "source"  # the rest of the demo's config stays


def test_evaluation_config_of_the_demo_fits_each_scenario():
    for kind in SCENARIOS:
        scenario = make_scenario(kind, 0)
        config = demo_config(scenario)
        assert config.evaluation.metric == scenario.metric
        assert config.attribution.cluster_field == "source"
        assert config.train.max_seq_length == config.grads.max_seq_length == scenario.max_seq_length
        assert config.evaluation.max_new_tokens < EvaluationConfig().max_new_tokens


def test_demo_shared_source_writes_the_planted_rows_under_their_host(tmp_path, capsys):
    assert main(["demo", "--help"]) == 0
    assert "--shared-source" in capsys.readouterr().out
    lines: list[str] = []
    # A base model that is not there stops it just after the scenario is written: nothing is trained.
    with pytest.raises(ModelError, match="nope"):
        run_demo(scenario="format", seed=1, shared_source=True, base_model=str(tmp_path / "nope"),
                 workdir=tmp_path / "w", echo=lines.append)
    manifest = json.loads((tmp_path / "w" / "scenario" / "scenario.json").read_text())
    assert manifest["shared_source"] is True and manifest["planted_clusters"] == []
    rows = [json.loads(line) for line in (tmp_path / "w" / "scenario" / "train.jsonl").read_text().splitlines()]
    assert {rows[row]["source"] for row in manifest["planted_rows"]} == {"explanations"}
    assert lines[0].startswith("scenario format (seed 1): 400 training rows, 20 planted (5.0%, filed under "
                               "explanations), 40 eval items")
    assert main(["demo", "--shared-source", "--set", "train.nonsense=1", "--workdir", str(tmp_path / "x")]) == 2
