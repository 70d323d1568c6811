"""`gradian verify` inputs: drop sets from a report or an ids file, defaults from the report, bad input as one line."""

from __future__ import annotations

import pytest

from gradian.cli.app import main
from gradian.counterfactual.verify import FULL_FROM_ADAPTER, FULL_RETRAINED, plan_verify
from gradian.data import load_dataset
from gradian.report.drop_set import cluster_drop_set, command_flags, file_drop_set, report_inputs, top_drop_set
from gradian.report.scores import read_scores
from tests.core.counterfactual_reports import N_CLEAN, N_PLANTED, write_dataset, write_eval, write_report_dir


@pytest.fixture
def files(tmp_path):
    dataset = write_dataset(tmp_path / "train.jsonl")
    eval_set = write_eval(tmp_path / "eval.jsonl")
    return dataset, eval_set


@pytest.fixture
def report_dir(files, tmp_path):
    return write_report_dir(tmp_path / "report", *files)


def _one_line_error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("gradian: error: "), err
    return err


# --- drop sets ------------------------------------------------------------------------------------


def test_the_accused_cluster_is_dropped_with_its_members_from_the_field(report_dir, files):
    examples = load_dataset(files[0])
    drop = cluster_drop_set(report_inputs(report_dir), examples)
    assert drop.cluster == "planted" and len(drop) == N_PLANTED
    assert drop.ids == examples.ids[N_CLEAN:]
    assert "accused cluster `planted`" in drop.origin and "dataset field `source`" in drop.origin


def test_every_accused_cluster_is_dropped_when_the_report_accuses_several(files, tmp_path):
    examples = load_dataset(files[0])
    report = report_inputs(write_report_dir(tmp_path / "two", *files, also_blamed="greetings"))
    assert set(report.report.accused_names) == {"planted", "greetings"}
    drop = cluster_drop_set(report, examples)
    greetings = [p for p in range(N_CLEAN) if examples[p].fields["source"] == "greetings"]
    assert drop.positions == tuple(sorted(greetings + list(range(N_CLEAN, N_CLEAN + N_PLANTED))))
    assert drop.clusters == report.report.accused_names and drop.cluster == ", ".join(drop.clusters)
    assert "accused clusters " + ", ".join(f"`{name}`" for name in drop.clusters) in drop.origin


def test_a_named_cluster_can_be_dropped_instead(report_dir, files):
    examples = load_dataset(files[0])
    drop = cluster_drop_set(report_inputs(report_dir), examples, cluster="greetings")
    assert len(drop) == N_CLEAN // 3
    assert all(examples[p].fields["source"] == "greetings" for p in drop.positions)


def test_a_drop_file_keeps_dataset_order_and_skips_comments(files, tmp_path):
    examples = load_dataset(files[0])
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(f"# the suspects\n{examples.ids[7]}\n\n{examples.ids[2]}  # this one too\n{examples.ids[7]}\n")
    drop = file_drop_set(ids_file, examples)
    assert drop.ids == (examples.ids[2], examples.ids[7]) and drop.cluster is None
    assert drop.label == "the 2 examples listed in ids.txt"  # the verify headline's words for what it dropped


def test_top_k_drops_the_reports_k_most_blamed_examples_in_dataset_order(report_dir, files, tmp_path):
    examples = load_dataset(files[0])
    recorded = read_scores(report_dir)
    wanted = {i for i, rank in zip(recorded.ids, recorded.ranks, strict=True) if rank <= 4}
    drop = top_drop_set(report_inputs(report_dir), examples, 4)
    assert set(drop.ids) == wanted and len(drop) == 4 and drop.cluster is None
    assert list(drop.positions) == sorted(drop.positions) and drop.label == "the 4 most blamed examples"
    plan = plan_verify(out=tmp_path / "v", report_dir=report_dir, drop="top:4", controls=2)
    assert plan.drop.ids == drop.ids and "the 4 most blamed examples in" in plan.drop.origin
    assert all(len(control) == 4 and not set(control) & wanted for control in plan.controls)
    from gradian.report.export import export_without  # export's top:K is the very same rows

    assert set(export_without(report_dir, "top:4", tmp_path / "kept.jsonl").dropped) == wanted


def test_the_report_command_gives_the_input_defaults(report_dir, files):
    report = report_inputs(report_dir)
    assert report.named("dataset") == str(files[0]) and report.named("eval_dataset") == str(files[1])
    assert report.named("base_model") == "tiny-base" and report.named("adapter") is None
    assert command_flags("gradian attribute --dataset=a.jsonl --eval-dataset 'b c.jsonl'") == {
        "--dataset": "a.jsonl", "--eval-dataset": "b c.jsonl"}


def test_the_plan_takes_its_inputs_from_the_report_and_draws_disjoint_controls(report_dir, files, tmp_path):
    plan = plan_verify(out=tmp_path / "verify", report_dir=report_dir, controls=3,
                       overrides=["train.max_steps=3", "attribution.seed=5"])
    assert plan.dataset == files[0] and plan.eval_dataset == files[1] and plan.base_model == "tiny-base"
    assert plan.full_model == FULL_RETRAINED and plan.adapter is None  # the report names no adapter
    assert plan.config.train.max_steps == 3 and plan.config.attribution.cluster_field == "source"
    assert plan.control_seed == 5 and len(plan.controls) == 3
    for control in plan.controls:
        assert len(control) == N_PLANTED and not set(control) & set(plan.drop.ids)
    again = plan_verify(out=tmp_path / "verify", report_dir=report_dir, controls=3,
                        overrides=["train.max_steps=3", "attribution.seed=5"])
    assert again.controls == plan.controls


def test_an_existing_adapter_is_the_full_model(report_dir, tiny_adapter_dir, tmp_path):
    plan = plan_verify(out=tmp_path / "v", report_dir=report_dir, adapter=tiny_adapter_dir)
    assert plan.full_model == FULL_FROM_ADAPTER and plan.adapter == tiny_adapter_dir
    retrained = plan_verify(out=tmp_path / "v", report_dir=report_dir, adapter=tiny_adapter_dir, retrain_full=True)
    assert retrained.full_model == FULL_RETRAINED


# --- bad input: one line, exit 2 ---------------------------------------------------------------------


def test_a_report_without_an_accused_cluster_says_what_to_pass_instead(files, tmp_path, capsys):
    refused = write_report_dir(tmp_path / "refused", *files, regressed=False)
    err = _one_line_error(capsys, ["verify", "--report", str(refused), "--out", str(tmp_path / "v")])
    assert "accuses no cluster" in err and "--cluster NAME" in err and "--drop ids.txt" in err
    assert not (tmp_path / "v").exists()


def test_an_attributed_report_that_accuses_nothing_offers_its_top_k(files, tmp_path, capsys):
    quiet = write_report_dir(tmp_path / "quiet", *files, planted_shift=0.5)  # attributed, nothing accused
    err = _one_line_error(capsys, ["verify", "--report", str(quiet), "--out", str(tmp_path / "v")])
    assert "accuses no cluster" in err and "pass --drop top:10 for its most blamed examples, --cluster NAME" in err
    assert not (tmp_path / "v").exists()


def test_drop_ids_not_in_the_dataset_name_the_first_unknown_one(files, tmp_path, capsys):
    examples = load_dataset(files[0])
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(f"{examples.ids[0]}\nex-000999-deadbeef\nex-000998-deadbeef\n")
    err = _one_line_error(capsys, ["verify", "--drop", str(ids_file), "--base-model", "tiny",
                                   "--dataset", str(files[0]), "--eval-dataset", str(files[1]),
                                   "--out", str(tmp_path / "v")])
    assert f"{ids_file}:2: id 'ex-000999-deadbeef' is not in {files[0]}" in err and "998" not in err


@pytest.mark.parametrize("argv, expected", [
    ([], "needs --report DIR (an attribution report) or --drop ids.txt"),
    (["--drop", "{ids}", "--dataset", "{train}", "--eval-dataset", "{eval}"], "needs --base-model"),
    (["--drop", "{ids}", "--base-model", "tiny", "--eval-dataset", "{eval}"], "needs --dataset"),
    (["--drop", "{ids}", "--base-model", "tiny", "--dataset", "{train}"], "needs --eval-dataset"),
    (["--report", "{report}", "--cluster", "travel"], "has no cluster named 'travel'"),
    (["--report", "{report}", "--cluster", "greetings", "--drop", "{ids}"], "either --drop or --cluster"),
    (["--report", "{report}", "--drop", "top:0"], "K must be a whole number of examples, at least 1"),
    (["--report", "{report}", "--drop", "top:31"], "more examples than the dataset's 30"),
    (["--report", "{report}", "--drop", "{tmp}/missing.txt"], "neither accused, top:K nor an existing ids file"),
    (["--drop", "top:4", "--base-model", "tiny", "--dataset", "{train}", "--eval-dataset", "{eval}"],
     "--drop top:4 needs --report"),
    (["--report", "{tmp}"], "is not an attribution report (no report.json)"),
    (["--report", "{report}", "--controls", "-1"], "--controls is -1"),
    (["--report", "{report}", "--backend", "axolotl"], "training backend 'axolotl' is not installed"),
    (["--report", "{report}", "--set", "train.lora_r=0"], "config key train.lora_r has the value 0"),
])
def test_missing_and_wrong_flags_are_one_line_errors(report_dir, files, tmp_path, capsys, argv, expected):
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(load_dataset(files[0]).ids[0] + "\n")
    values = {"ids": ids_file, "train": files[0], "eval": files[1], "report": report_dir, "tmp": tmp_path}
    argv = [arg.format(**values) for arg in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "v")]
    err = _one_line_error(capsys, ["verify", *argv, *out])
    assert expected in err


def test_top_k_of_a_report_that_attributed_nothing_is_refused(files, tmp_path, capsys):
    refused = write_report_dir(tmp_path / "refused", *files, regressed=False)
    err = _one_line_error(capsys, ["verify", "--report", str(refused), "--drop", "top:3", "--out", str(tmp_path / "v")])
    assert "attributed nothing" in err and "--drop ids.txt" in err
    assert not (tmp_path / "v").exists()


def test_no_out_is_an_error(report_dir, capsys):
    assert "needs --out" in _one_line_error(capsys, ["verify", "--report", str(report_dir)])


def test_another_dataset_than_the_reports_is_refused(report_dir, tmp_path, capsys):
    other = write_dataset(tmp_path / "other.jsonl", planted=N_PLANTED + 1)
    err = _one_line_error(capsys, ["verify", "--report", str(report_dir), "--dataset", str(other),
                                   "--out", str(tmp_path / "v")])
    assert "is not the file the report was made from" in err


def test_a_missing_dataset_named_by_the_report_asks_for_the_flag(report_dir, files, tmp_path, capsys):
    files[0].unlink()
    err = _one_line_error(capsys, ["verify", "--report", str(report_dir), "--out", str(tmp_path / "v")])
    assert f"the report names --dataset {files[0]}, which does not exist here" in err and "pass --dataset" in err


@pytest.mark.slow
def test_automatic_clusters_are_recomputed_on_the_reports_index(tiny_base_dir, tiny_adapter_dir, files, tmp_path,
                                                               capsys):
    from gradian.attribution.clusters import auto_clusters
    from gradian.index import build_index
    from gradian.model.loaded import LoadedModel
    from tests.core.counterfactual_reports import write_auto_report_dir

    examples = load_dataset(files[0])
    index = build_index(LoadedModel.load(tiny_base_dir, tiny_adapter_dir), examples, None, tmp_path / "index")
    report = report_inputs(write_auto_report_dir(tmp_path / "report", *files, tmp_path / "index"))
    assert report.report.cluster_method.method == "auto"
    expected = auto_clusters(index, num_clusters=3, seed=3)
    for name in expected.names:
        drop = cluster_drop_set(report, examples, cluster=name)
        assert drop.positions == tuple(int(p) for p in expected.members(name))
        assert "recomputed on the report's gradient index" in drop.origin
    (tmp_path / "index" / "manifest.json").unlink()
    capsys.readouterr()  # model loading above wrote progress to stderr
    err = _one_line_error(capsys, ["verify", "--report", str(tmp_path / "report"), "--cluster", "auto-00",
                                   "--out", str(tmp_path / "v")])
    assert "clusters are automatic and its gradient index" in err and "--drop ids.txt" in err
