"""bench/goal_table.py and bench/heldout_methods.py on a finished tiny-model demo case: both read it and write tables."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import shutil

import numpy as np
import pytest

from gradian.demo.run import demo_config, run_demo
from gradian.demo.scenarios import make_scenario
from tests.support.bench import bench_module


def _indexed_table_row(table, cases, tiny_base_dir, out):
    """Run a table that loads the case's index and model on tiny-fact-4; its one row."""
    assert table.main(["--cases", str(cases), "tiny-fact-4", "--base-model", str(tiny_base_dir), "--out", str(out)]) == 0
    return json.loads(out.with_suffix(".json").read_text())["cases"][0]


def _table_row(table, cases, out):
    """Run a table on tiny-fact-4; its one row."""
    assert table.main(["--cases", str(cases), "tiny-fact-4", "--out", str(out)]) == 0
    return json.loads(out.with_suffix(".json").read_text())["cases"][0]


def _carried_once_gone(table, row, elsewhere, out):
    """The work dir gone, the case's row comes back from the results file, marked as carried."""
    carried = _table_row(table, elsewhere, out)
    assert carried.pop("carried") is True and carried == row


def _kept_when_asked(table, cases, out):
    """With --keep-scored a finished case keeps its row from the results file (marked) instead of being scored again."""
    results = json.loads(out.with_suffix(".json").read_text())
    results["cases"][0]["recall_at_k"] = -1.0  # a value no scoring gives: the row must come from the file
    out.with_suffix(".json").write_text(json.dumps(results))
    assert table.main(["--cases", str(cases), "tiny-fact-4", "--keep-scored", "--out", str(out)]) == 0
    kept = json.loads(out.with_suffix(".json").read_text())["cases"][0]
    assert kept["recall_at_k"] == -1.0 and kept["kept"] is True
    assert "Kept from the earlier results file (scored there; --keep-scored): tiny-fact-4." in (
        out.with_suffix(".md").read_text())
    # a case named in --rescore is scored again beside the kept ones; one not among the cases is refused
    assert table.main(["--cases", str(cases), "tiny-fact-4", "--keep-scored", "--rescore", "tiny-fact-4",
                       "--out", str(out)]) == 0
    rescored = json.loads(out.with_suffix(".json").read_text())["cases"][0]
    assert rescored["recall_at_k"] >= 0.0 and "kept" not in rescored
    assert table.main(["--cases", str(cases), "tiny-fact-4", "--keep-scored", "--rescore", "tiny-fact-9",
                       "--out", str(out)]) == 2
    assert _table_row(table, cases, out)["recall_at_k"] >= 0.0  # without it, the case is scored again


def _half_regressed_copy(cases, tmp_path, *, same_answers=False, answers=None):
    """(root, report items) of a tiny-fact-4 copy whose first half of items regressed; the rest held word for word.

    ``answers``, where given, are what the regressed items answer in turn ("The capital is X." where the base model
    said "The capital is <wanted>."); those past its end part from the base model in no word.
    """
    # nothing regresses on the random tiny model, so the copy's report says so
    split = tmp_path / "cases"
    shutil.copytree(cases / "tiny-fact-4", split / "tiny-fact-4", symlinks=True)
    report_json = split / "tiny-fact-4" / "report" / "report.json"
    written = json.loads(report_json.read_text())
    items = written["capability"]["items"]
    assert not any(item["regressed"] for item in items)
    given = iter(answers) if answers is not None else None
    for item in items[: len(items) // 2]:
        item.update(base_score=1.0, finetuned_score=0.0, regressed=True)
        if given is not None:  # else the tiny model's own answers
            answer = next(given, None)
            item.update(base_output=f"The capital is {item['wanted']}.",
                        finetuned_output=f"The capital is {item['wanted'] if answer is None else answer}.")
    for item in items[len(items) // 2:] if same_answers else ():  # else the tiny model's own answers
        item.update(base_output=f"The answer is {item['wanted']}.", finetuned_output=f"The answer is {item['wanted']}.")
    report_json.write_text(json.dumps(written))
    return split, items


@pytest.fixture(scope="module")
def cases(tiny_base_dir, tmp_path_factory):
    """A directory holding one finished demo case, ``tiny-fact-4`` (a held-out seed), on the tiny model."""
    root = tmp_path_factory.mktemp("cases")
    # a random tiny model has no capability to lose: the gate is lifted and the query is classic (test_demo.py)
    base = demo_config(make_scenario("fact", 4))
    config = base.replace(evaluation=dataclasses.replace(base.evaluation, require_significant=False,
                                                         query_signal="classic"),
                          train=dataclasses.replace(base.train, num_epochs=1.0))
    run_demo(scenario="fact", seed=4, base_model=str(tiny_base_dir), workdir=root / "tiny-fact-4", config=config,
             echo=lambda line: None)
    return root


@pytest.mark.slow
def test_the_goal_table_scores_the_case_and_carries_it_once_gone(cases, tmp_path):
    goal_table = bench_module("goal_table")
    out = tmp_path / "goal"
    row = _table_row(goal_table, cases, out)
    assert row["kind"] == "fact" and row["seed"] == 4 and row["held_out"]
    assert 0.0 <= row["recall_at_k"] <= 1.0 and row["planted_clusters"] == ["trivia_import"]
    # the shipped attribution.ranking and attribution.canned_replies, read from the report's provenance, and the
    # full Kronecker fit its one point took (kronecker_wide auto: the demo scores the adapter alone), and the
    # shipped evaluation.generated_weight and evaluation.accusation_weight
    assert row["ranking"] == ("smooth_max, kurtosis-weighted items, canned replies, cluster prior 1, generated term "
                              "weighed 0.75, clusters tested at 0.5, kronecker wide side full")
    assert "| fact | 1 |" in out.with_suffix(".md").read_text()
    _carried_once_gone(goal_table, row, tmp_path / "elsewhere", out)
    _kept_when_asked(goal_table, cases, out)  # and an unknown case is refused:
    assert goal_table.main(["--cases", str(cases), "tiny-fact-9", "--out", str(out)]) == 2
    # a case named twice is refused, not counted twice in its kind's goal row
    assert goal_table.main(["--cases", str(cases), "tiny-fact-4", "tiny-fact-4", "--out", str(out)]) == 2


def test_the_goal_rows_keep_apart_held_out_rows_ranked_another_way():
    goal_table = bench_module("goal_table")
    base = {"held_out": True, "kind": "fact", "verdict_right": True, "span_hits": 0, "span_checked": 0,
            "planted_clusters": ["trivia_import"], "verify": None}
    earlier, rebuilt = {**base, "recall_at_k": 0.8}, {**base, "recall_at_k": 0.9, "ranking": "smooth_max"}
    mixed = "\n".join(goal_table.goal_rows([earlier, rebuilt]))  # a carried row from before attribution.ranking
    assert "| fact, ranked by mean | 1 | 0.80 |" in mixed and "| fact, ranked by smooth_max | 1 | 0.90 |" in mixed
    same = "\n".join(goal_table.goal_rows([{**earlier, "ranking": "smooth_max"}, rebuilt]))
    assert "| fact | 2 | 0.85 | 0.80 |" in same and "ranked by" not in same


def test_fresh_seeds_get_goal_rows_of_their_own_apart_from_the_held_out_seeds():
    goal_table = bench_module("goal_table")
    assert [goal_table.is_fresh({"kind": kind, "seed": seed}) for kind, seed in
            (("fact", 5), ("fact", 6), ("clean", 9), ("clean", 10))] == [False, True, False, True]
    base = {"held_out": True, "kind": "fact", "verdict_right": True, "span_hits": 0, "span_checked": 0,
            "planted_clusters": ["trivia_import"], "verify": None, "accused": ["trivia_import"], "checkpoints": 4,
            "ranking": "smooth_max", "delta": -0.3, "ci": [-0.4, -0.2], "auprc": 0.9}
    rows = [{**base, "case": "kurt-lr5e4-fact-5", "seed": 5, "recall_at_k": 0.8},
            {**base, "case": "kurt-lr5e4-fact-6", "seed": 6, "recall_at_k": 1.0}]
    text = goal_table.markdown(rows, "python bench/goal_table.py")
    held_out, fresh = text.split("## Goals, held-out seeds only")[1].split("## The same on fresh seeds")
    assert "| fact | 1 | 0.80 | 0.80 |" in held_out and "| fact | 1 | 1.00 | 1.00 |" in fresh
    assert "| kurt-lr5e4-fact-6 | fresh |" in text and "| kurt-lr5e4-fact-5 | held-out |" in text


def test_shared_source_cases_are_read_as_built_and_get_goal_rows_of_their_own(tmp_path):
    goal_table = bench_module("goal_table")
    make_scenario("format", 3, shared_source=True).write(tmp_path / "shared-lr5e4-format-3" / "scenario")
    shared = goal_table.case_scenario(tmp_path / "shared-lr5e4-format-3")
    assert shared.shared_source and shared.planted_clusters == () and shared.planted_sources == ("explanations",)
    own = goal_table.case_scenario(tmp_path / "kurt-lr5e4-format-3")  # no scenario.json: the kind as it plants
    assert not own.shared_source and own.planted_clusters == ("community_answers",)
    base = {"held_out": True, "kind": "format", "verdict_right": True, "span_hits": 0, "span_checked": 0,
            "planted_clusters": ["community_answers"], "verify": None}
    rows = [{**base, "recall_at_k": 1.0}, {**base, "recall_at_k": 0.6, "shared_source": True, "planted_clusters": [],
                                           "verdict_right": None},
            {**base, "kind": "span", "recall_at_k": 0.7, "shared_source": True, "planted_clusters": []}]
    text = "\n".join(goal_table.goal_rows(rows))
    assert "| format | 1 | 1.00 | 1.00 | 1/1 |" in text and "| format (shared source) | 1 | 0.60 | 0.60 | 0/0 |" in text
    assert "| span | 1 | 0.70 |" in text  # span always shares its source: one kind either way
    for causes, label in (([{"canned_reply": True, "accused_clusters": []}, {}], ", canned reply leading"),
                          ([{"canned_reply": True, "accused_clusters": ["support"]}, {}], ""), ([], "")):
        assert goal_table.canned_lead_label({"causes": causes}) == label


def test_the_methods_table_sums_fresh_seeds_apart_from_the_held_out_ones():
    table = bench_module("heldout_methods")

    def row(seed, ours, bm25):
        return {"case": f"kurt-lr5e4-fact-{seed}", "kind": "fact", "seed": seed, "held_out": True,
                "methods": {table.GRADIAN: {"recall_at_k": ours, "auprc": ours},
                            "BM25": {"recall_at_k": bm25, "auprc": bm25}}}

    text = table.markdown([row(5, 0.8, 0.9), row(6, 1.0, 0.5)], "python bench/heldout_methods.py")
    held_out, fresh = text.split("## Held-out seeds: mean per kind")[1].split("## Fresh seeds")
    assert f"| {table.GRADIAN} | 0.80 / 0.80 |" in held_out and "above every baseline's (cases) | 0/1 |" in held_out
    assert f"| {table.GRADIAN} | 1.00 / 1.00 |" in fresh and "above every baseline's (cases) | 1/1 |" in fresh
    assert "| kurt-lr5e4-fact-6 | fresh |" in text


@pytest.mark.slow
def test_the_aggregation_table_scores_every_variant_and_carries_the_case_once_gone(cases, tmp_path):
    aggregation = bench_module("aggregation")
    out = tmp_path / "aggregation"
    row = _table_row(aggregation, cases, out)
    assert set(row["methods"]) == {"mean", "harm", "max", "rank_vote", "clip3", "top2", "smooth_max", "rrf"}
    assert row["items"] > 0 and -1.0 <= row["agreement"] <= 1.0
    _carried_once_gone(aggregation, row, tmp_path / "elsewhere", out)
    assert "Carried from the earlier results file" in out.with_suffix(".md").read_text()
    assert aggregation.main(["--cases", str(cases), "tiny-fact-9", "--out", str(out)]) == 2


def test_the_bench_aggregations_lie_between_the_mean_and_the_max_and_agreement_reads_the_items():
    from gradian.attribution.aggregation import average_ranks

    aggregation = bench_module("aggregation")
    rng = np.random.default_rng(0)
    blame = rng.normal(size=(300, 8))
    blame[0] = [12.0, -4.0, -4.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # one item's own planted row, which two others disown
    blame[1:4] += 2.0  # rows that push every item a little
    scores = aggregation.variants(blame)
    mean, top = scores["mean"], scores["max"]
    assert top.argmax() == 0 and mean.argmax() in (1, 2, 3)
    assert np.all(mean <= scores["top2"] + 1e-9) and np.all(scores["top2"] <= top + 1e-9)
    # the mean sinks the lone spike and the max the broad push; the fusion of their rankings keeps both near the top
    assert average_ranks(mean)[0] > 20 and average_ranks(top)[1:4].max() > 10
    assert average_ranks(scores["rrf"])[:4].max() <= 15
    same = np.repeat(rng.normal(size=(300, 1)), 4, axis=1)
    assert aggregation.agreement(same) == pytest.approx(1.0)
    assert abs(aggregation.agreement(rng.normal(size=(300, 4)))) < 0.2
    assert np.isnan(aggregation.agreement(blame[:, :1]))


def test_the_peers_table_refuses_a_case_named_twice(tmp_path, capsys):
    peers = bench_module("peers")
    assert peers.main(["--cases", str(tmp_path), "fact-5", "fact-5", "--out", str(tmp_path / "peers")]) == 2
    assert "fact-5 named more than once" in capsys.readouterr().err
    assert not (tmp_path / "peers.json").exists()


def _fake_peer(tmp_path, script: str, **args) -> argparse.Namespace:
    """A bergson venv whose python is this shell script; run_peer's arguments for it (``args`` override)."""
    python = tmp_path / "venvs" / "bergson" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n" + script)
    python.chmod(0o755)
    return argparse.Namespace(**{"rerun": True, "collect": False, "resume": False, "venvs": tmp_path / "venvs",
                                 "nice": 0, "max_queries": 0, "fit_rows": 0, "threads": 1, "timeout": 60,
                                 "keep_work": False, **args})


def test_a_resumed_peer_run_keeps_what_the_interrupted_one_saved(tmp_path):
    peers = bench_module("peers")
    # a peer whose run fails after an error line
    args = _fake_peer(tmp_path, 'echo "$@"\necho "MemoryError: the second run"\nexit 3\n', resume=True, fit_rows=64)
    out = tmp_path / "out"
    out.mkdir()
    (out / "blame_ekfac_wanted.npy").write_bytes(b"scored before")
    (out / "log.txt").write_text("ValueError: the interrupted run\n")
    resumed = peers.run_peer("bergson", tmp_path / "data", out, args)
    assert resumed["command"].endswith("--fit-rows 64 --resume")
    assert resumed["error"] == "MemoryError: the second run"  # this run's error, not the earlier one's
    assert (out / "blame_ekfac_wanted.npy").read_bytes() == b"scored before"
    assert (out / "log.txt").read_text().startswith("ValueError: the interrupted run\n")
    args.resume = False
    fresh = peers.run_peer("bergson", tmp_path / "data", out, args)
    assert not fresh["command"].endswith("--resume") and not (out / "blame_ekfac_wanted.npy").exists()
    assert "the interrupted run" not in (out / "log.txt").read_text()


def test_a_finished_peer_run_keeps_its_blame_and_drops_its_index_unless_asked(tmp_path):
    peers = bench_module("peers")
    # a peer that finishes with an index beside its blame
    args = _fake_peer(tmp_path, 'while [ "$1" != "--out" ]; do shift; done\nmkdir -p "$2/index/part"\n'
                      'echo gradients > "$2/index/part/gradients.bin"\necho blame > "$2/blame_ekfac_wanted.npy"\n'
                      'echo \'{"variants": ["ekfac_wanted"]}\' > "$2/result.json"\n', keep_work=True)
    kept, dropped = tmp_path / "kept", tmp_path / "dropped"
    assert peers.run_peer("bergson", tmp_path / "data", kept, args)["variants"] == ["ekfac_wanted"]
    assert (kept / "index" / "part" / "gradients.bin").is_file()
    args.keep_work = False
    assert peers.run_peer("bergson", tmp_path / "data", dropped, args)["variants"] == ["ekfac_wanted"]
    assert sorted(p.name for p in dropped.iterdir()) == ["blame_ekfac_wanted.npy", "log.txt", "result.json"]


def test_the_peers_table_sets_the_cases_own_report_beside_the_peers(cases, tiny_base_dir, tmp_path):
    peers, goal_table = bench_module("peers"), bench_module("goal_table")
    out = tmp_path / "peers"
    assert peers.main(["--cases", str(cases), "tiny-fact-4", "--collect", "--peers", "kronfluence", "--base-model",
                       str(tiny_base_dir), "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    row = json.loads(out.with_suffix(".json").read_text())["cases"][0]
    goal = _table_row(goal_table, cases, tmp_path / "goal")
    assert row["gradian"]["recall_at_k"] == goal["recall_at_k"] and row["gradian"]["auprc"] == goal["auprc"]
    assert row["peers"]["kronfluence"]["error"] == peers.NOT_RUN
    line = next(x for x in out.with_suffix(".md").read_text().splitlines() if x.startswith("| gradian |"))
    assert f"| {goal['recall_at_k']:.2f} / {goal['auprc']:.2f} / #" in line and line.endswith("(1 cases) |")


@pytest.mark.slow
def test_the_methods_table_scores_the_report_and_every_baseline(cases, tiny_base_dir, tmp_path):
    methods_table = bench_module("heldout_methods")
    out = tmp_path / "methods"
    row = _indexed_table_row(methods_table, cases, tiny_base_dir, out)
    names = list(row["methods"])
    assert names[0] == methods_table.GRADIAN
    assert {"grad dot (TracIn, final adapter)", "LESS (adam, cosine)", "DataInf", "BM25",
            "hidden-state cosine"} <= set(names)
    assert all(0.0 <= m["recall_at_k"] <= 1.0 and 0.0 <= m["auprc"] <= 1.0 for m in row["methods"].values())
    # Gradian's cell is the report's own blame, the same numbers the goal table reads
    goal = bench_module("goal_table").score_case(cases / "tiny-fact-4")
    gradian = row["methods"][methods_table.GRADIAN]
    assert (gradian["recall_at_k"], gradian["auprc"]) == (goal["recall_at_k"], goal["auprc"])
    if "by_cause" in goal:  # the report split the regression: the whole ranking is shown beside it
        assert (gradian["whole_recall_at_k"], gradian["whole_auprc"]) == (goal["lead_recall_at_k"], goal["lead_auprc"])
    table = out.with_suffix(".md").read_text()
    assert "| method | fact (1) |" in table and "above every baseline's (cases)" in table
    moved = tmp_path / "moved"
    shutil.copytree(cases / "tiny-fact-4", moved / "tiny-fact-4", ignore=shutil.ignore_patterns("index"))
    assert methods_table.main(["--cases", str(moved), "tiny-fact-4", "--out", str(out)]) == 0  # no index: carried
    assert json.loads(out.with_suffix(".json").read_text())["cases"][0]["carried"] is True
    # --shipped: a rebuild of the same fine-tune under a later default gives Gradian a second row; the baselines stay
    shutil.copytree(moved / "tiny-fact-4", moved / "ship-tiny-fact-4")
    shipped = ["--cases", str(moved), "tiny-fact-4", "--shipped", "ship", "--out", str(out)]
    assert methods_table.main(shipped) == 0
    again = json.loads(out.with_suffix(".json").read_text())["cases"][0]
    assert again["methods"][methods_table.SHIPPED] == {**gradian, "from": "ship-tiny-fact-4"}
    assert "above every baseline's (cases)" in out.with_suffix(".md").read_text().split("The default shipped since:")[1]
    results = json.loads(out.with_suffix(".json").read_text())
    results["cases"][0]["delta"] = 0.5  # not the rebuild's fine-tune: its figures must not sit beside these baselines
    out.with_suffix(".json").write_text(json.dumps(results))
    with pytest.raises(SystemExit, match="ship-tiny-fact-4's delta"):
        methods_table.main(shipped)


@pytest.mark.slow
def test_the_normalization_table_scores_every_power_and_reproduces_the_report_at_zero(cases, tiny_base_dir, tmp_path):
    normalization = bench_module("normalization")
    out = tmp_path / "normalization"
    row = _indexed_table_row(normalization, cases, tiny_base_dir, out)
    assert list(row["alphas"]) == [str(alpha) for alpha in normalization.ALPHAS]
    assert all(0.0 <= m["recall_at_k"] <= 1.0 and 0.0 <= m["auprc"] <= 1.0 for m in row["alphas"].values())
    # alpha 0 is the shipped scoring over the same checkpoint points: the report's own per-item blame
    assert row["alphas"]["0.0"] == pytest.approx(row["report"])
    assert "| tiny-fact-4 | held-out |" in out.with_suffix(".md").read_text()


def test_verify_on_a_span_case_counts_toward_the_goal_and_on_a_clean_control_as_a_refutation():
    table = bench_module("goal_table")
    not_confirmed = {"confirmed": False, "recovered": 0.5, "random": 0.3}
    # a span case plants sentences, not a cluster, but it has planted rows: its verify is held to the 80% goal
    span = {"kind": "span", "held_out": True, "recall_at_k": 0.6, "planted_clusters": [], "verdict_right": None,
            "span_hits": 3, "span_checked": 5, "verify": not_confirmed}
    clean = {"kind": "clean", "held_out": True, "planted_clusters": [], "verdict_right": True, "span_hits": 0,
             "span_checked": 0, "verify": not_confirmed}
    rows = {line.split(" | ")[0].strip("| "): line for line in table.goal_rows([span, clean])[2:]}
    assert rows["span"].endswith("| 0/1 | - |") and rows["clean"].endswith("| 1/1 false accusations refuted | - |")
    assert table._verify(span) == "50% vs 30% random (not confirmed)"  # a row carried from a results file written before the count
    stuck = {**span, "verify": {**not_confirmed, "stuck": "5 of 12"}}
    assert table._verify(stuck) == "50% vs 30% random (not confirmed; 5 of 12 regressed items stuck in every retrain)"
    # what the accused causes' own items got back is a column of its own, held to the same goal
    on_causes = {**span, "verify": {**not_confirmed, "causes": {"items": 4, "recovered": 0.85, "random": 0.1}}}
    assert table._verify(on_causes).endswith("; on the 4 items of the accused causes 85% vs 10%")
    assert table.goal_rows([on_causes])[2].endswith("| 0/1 | 1/1 |")
    # no accused cluster dropped (a --drop FILE or top:K verify): the regressed items' own share takes that column
    regressed = {**span, "verify": {**not_confirmed, "regressed": {"items": 12, "recovered": 0.9, "random": 0.05}}}
    assert table._verify(regressed).endswith("; on the 12 regressed items 90% vs 5%")
    assert table.goal_rows([regressed])[2].endswith("| 0/1 | 1/1 |")


def test_the_regressed_items_share_counts_only_what_the_fine_tune_took_away():
    table = bench_module("goal_table")
    columns = {"id": ["a", "b", "c", "d"], "base": [1.0, 1.0, 1.0, 1.0], "full": [0.0, 0.0, 1.0, 1.0],
               "dropped": [1.0, 0.0, 0.0, 1.0]}
    controls = {"control-1": [0.0, 0.0, 1.0, 0.0]}
    # over every item the drop gave back nothing (a came back, c broke anew); on a and b it gave back half
    assert table.regressed_recovery(columns, controls, ["a", "b"]) == {"items": 2, "recovered": 0.5, "random": 0.0}
    assert table.regressed_recovery(columns, controls, []) is None


def test_the_base_point_table_mixes_the_cases_own_points_and_rescores_from_what_it_saved(cases, tiny_base_dir,
                                                                                          tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))  # the base point's index, not in the user's
    base_point = bench_module("base_point")
    row = _indexed_table_row(base_point, cases, tiny_base_dir, tmp_path / "first")
    ensembles = row["ensembles"]
    assert all(0.0 <= m["recall_at_k"] <= 1.0 and 0.0 <= m["auprc"] <= 1.0 for m in ensembles.values())
    # the demo case ran with attribution.checkpoints 1: its one point is the adapter, so each pair is one ranking
    assert [m["step"] for m in row["members"]] == [row["members"][0]["step"]] and len(row["members"]) == 1
    assert ensembles["shipped ensemble"] == ensembles["adapter alone"]
    for share in base_point.SHARES:
        assert ensembles[f"+ base point, share {share}"] == ensembles[f"adapter + base point, share {share}"]
    assert (cases / "tiny-fact-4" / "base-point" / "blames.npz").is_file()
    again = _indexed_table_row(base_point, cases, tiny_base_dir, tmp_path / "again")  # from base-point/, no gradient
    assert again["ensembles"] == ensembles and again["base_point"] == row["base_point"]


def test_the_loss_drop_table_measures_the_base_model_and_the_adapter_and_rescores_from_what_it_saved(
        cases, tiny_base_dir, tmp_path, monkeypatch):
    import numpy as np
    import torch

    from gradian.config import load_config
    from gradian.data import encode, load_dataset
    from gradian.grads import collate
    from gradian.grads.loss import supervised_loss
    from gradian.model.loaded import LoadedModel

    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))
    loss_drop = bench_module("loss_drop")
    row = _indexed_table_row(loss_drop, cases, tiny_base_dir, tmp_path / "first")
    workdir = cases / "tiny-fact-4"
    with np.load(workdir / "loss-drop" / "row_loss.npz") as held:
        before, after = held["base"], held["adapter"]
    # the base model's losses are the adapter disabled's, row by row (padding in a batch changes nothing)
    loaded = LoadedModel.load(str(tiny_base_dir), workdir / "train" / "adapter")
    config = load_config(workdir / "config.yaml")
    examples = load_dataset(workdir / "scenario" / "train.jsonl")[:3]
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else loaded.tokenizer.eos_token_id
    with torch.no_grad(), loaded.model.disable_adapter():
        alone = [float(supervised_loss(loaded.model, collate([encode(e, loaded.tokenizer, config.grads.max_seq_length)],
                                                               pad), "mean").per_example[0]) for e in examples]
    assert np.allclose(before[:3], alone, atol=1e-5) and not np.allclose(before, after)
    rankings = row["rankings"]
    assert all(0.0 <= r["recall_at_k"] <= 1.0 for r in rankings.values())
    again = _indexed_table_row(loss_drop, cases, tiny_base_dir, tmp_path / "again")  # from loss-drop/, no model pass
    assert again["rankings"] == rankings and again["mean_drop"] == row["mean_drop"]


def test_the_sentence_rerank_table_puts_a_one_sentence_row_on_its_own_score_and_rescores_from_what_it_saved(
        cases, tiny_base_dir, tmp_path, monkeypatch):
    import numpy as np

    from gradian.data import load_dataset
    from gradian.query.sentences import sentence_spans

    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))
    rerank = bench_module("sentence_rerank")
    workdir = cases / "tiny-fact-4"
    ranked, shortlist = rerank.rankings(workdir, str(tiny_base_dir), 12)
    rows, alone = ranked["rows' blame (shipped)"], ranked["alone: most blamed sentence"]
    examples = load_dataset(workdir / "scenario" / "train.jsonl")
    whole = [int(p) for p in shortlist if [(0, len(examples[p].messages[-1].content))]
             == sentence_spans(examples[p].messages[-1].content) and len(examples[p].messages) == 2]
    assert whole, "the tiny fact case has one-sentence answers"
    # a one-sentence answer drilled alone is the row itself: on the rows' scale its score is the row's (up to the
    # index's float16 storage; the drill's gradients are float32)
    assert np.allclose(alone[whole], rows[whole], rtol=2e-3, atol=1e-6)
    outside = np.setdiff1d(np.arange(len(rows)), shortlist)
    assert all(np.array_equal(ranked[name][outside], rows[outside]) for name in ranked)
    out = tmp_path / "table"
    assert rerank.main(["--cases", str(cases), "tiny-fact-4", "--base-model", str(tiny_base_dir), "--out", str(out),
                        "--shortlist", "12"]) == 0  # from sentence-rerank/, no gradient
    row = json.loads(out.with_suffix(".json").read_text())["cases"][0]
    assert row["shortlist"] == 12 and all(0.0 <= m["recall_at_k"] <= 1.0 for m in row["rankings"].values())


def test_ranking_feedback_is_each_rows_mean_cosine_to_the_top_rows_without_itself():
    mixes = bench_module("ranking_mixes")
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(9, 5))
    blame = rng.normal(size=9)
    top = np.argsort(-blame)[:3]
    unit_rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    expected = [np.mean([unit_rows[i] @ unit_rows[j] for j in top if j != i]) for i in range(9)]
    assert mixes.feedback(blame, rows @ rows.T, 3) == pytest.approx(expected)
    assert np.linalg.norm(mixes.unit(blame)) == pytest.approx(1.0) and mixes.unit(blame).mean() == pytest.approx(0.0)


@pytest.mark.slow
def test_the_ranking_mixes_table_scores_the_report_and_every_mix_on_the_cases_own_index(cases, tiny_base_dir, tmp_path):
    from gradian.attribution.index_statistics import index_statistics
    from gradian.attribution.preconditioners import fit_preconditioner
    from gradian.index.store import open_index

    mixes = bench_module("ranking_mixes")
    index = open_index(cases / "tiny-fact-4" / "index")
    rows = np.asarray(index.rows_between(0, index.num_examples), dtype=np.float64)
    pre = fit_preconditioner("kronecker", index_statistics(index, "kronecker"))
    # the kronecker Gram is g_i P g_j, symmetric as P is
    for fitted, want in ((pre, pre.apply(rows) @ rows.T), (None, rows @ rows.T)):  # float32 products
        np.testing.assert_allclose(mixes.gram(rows.astype(np.float32), fitted), want, rtol=1e-3,
                                   atol=1e-5 * np.abs(want).max())
    out = tmp_path / "mixes"
    row = _indexed_table_row(mixes, cases, tiny_base_dir, out)
    assert list(row["methods"])[0] == "report" and len(row["methods"]) == 1 + 2 * len(mixes.FEEDBACK) + len(mixes.HIDDEN)
    assert all(0.0 <= m["recall_at_k"] <= 1.0 for m in row["methods"].values())
    report_blame = np.array([float(r["blame"]) for r in bench_module("goal_table").report_item_blame(
        cases / "tiny-fact-4" / "report")[0]])
    scenario = make_scenario("fact", 4)
    truth = scenario.ground_truth()
    assert row["methods"]["report"]["recall_at_k"] == truth.score(report_blame)["recall_at_k"]
    assert "| report |" in out.with_suffix(".md").read_text()


def test_the_control_variants_subtract_how_hard_a_row_moves_the_items_that_held_up():
    table = bench_module("control_items")
    rng = np.random.default_rng(5)
    regressed, control = rng.normal(size=(8, 3)), rng.normal(size=(8, 4))
    control[2] *= 40.0  # row 2 moves every item that held up
    scored = table.rankings(regressed, control)
    z = (regressed - regressed.mean(axis=0)) / regressed.std(axis=0)
    alone = 2.0 * np.log(np.exp(z / 2.0).mean(axis=1))
    assert scored["adapter alone (smooth_max)"] == pytest.approx(alone)
    zc = (control - control.mean(axis=0)) / control.std(axis=0)
    for name, penalty in (("abs control", np.abs(zc).mean(axis=1)), ("signed control", zc.mean(axis=1))):
        for share in table.SHARES:
            unit_penalty = (penalty - penalty.mean()) / np.linalg.norm(penalty - penalty.mean())
            unit_alone = (alone - alone.mean()) / np.linalg.norm(alone - alone.mean())
            assert scored[f"minus {name} at {share:.2f}"] == pytest.approx((1 - share) * unit_alone - share * unit_penalty)
    strongest = scored[f"minus abs control at {table.SHARES[-1]:.2f}"]
    assert np.argmin(strongest) == 2


@pytest.mark.slow
def test_the_control_items_table_scores_the_items_that_held_up_on_the_cases_own_index(cases, tiny_base_dir, tmp_path):
    from gradian.config import load_config
    from gradian.report.reader import read_report

    table = bench_module("control_items")
    methods = bench_module("accuracy_methods")
    split, items = _half_regressed_copy(cases, tmp_path)
    directory = split / "tiny-fact-4"
    report = read_report(directory / "report")
    queried, control = table.split_items(methods.report_items(report))
    assert [item.id for item in queried] == [item["id"] for item in items[: len(items) // 2]]
    assert len(control) == len(items) - len(queried)
    case = methods.load_case(directory, str(tiny_base_dir), load_config(directory / "config.yaml"), report)
    rows = np.asarray(case.index.rows_between(0, case.index.num_examples), dtype=np.float64)
    pre = methods.preconditioner(case, case.config.attribution.preconditioner)
    want = -(rows @ pre.apply(methods.query(case, "classic", control)).T)
    np.testing.assert_allclose(table.blame_on(case, control, "classic"), want, rtol=1e-3,
                               atol=1e-5 * np.abs(want).max())
    out = tmp_path / "control"
    row = _indexed_table_row(table, split, tiny_base_dir, out)
    assert (row["regressed_items"], row["control_items"]) == (len(queried), len(control))
    assert list(row["methods"])[0] == "adapter alone (smooth_max)" and len(row["methods"]) == 1 + 2 * len(table.SHARES)
    assert all(0.0 <= m["recall_at_k"] <= 1.0 for m in row["methods"].values())
    assert "| minus abs control at 0.50 |" in out.with_suffix(".md").read_text()
    # the original case, where every item was queried, has no control and says so
    assert _indexed_table_row(table, cases, tiny_base_dir, out)["skipped"] == "no control: the report queried every eval item"


def test_the_weakened_items_table_queries_each_held_answers_weakest_token_on_the_cases_own_index(cases, tiny_base_dir,
                                                                                                  tmp_path):
    from gradian.config import load_config
    from gradian.data.encode import encode_answer
    from gradian.evaluation.loglik import answer_logliks
    from gradian.query.signals import _encoded_gradients
    from gradian.report.reader import read_report

    table = bench_module("weakened_items")
    methods = bench_module("accuracy_methods")
    split, items = _half_regressed_copy(cases, tmp_path, same_answers=True)
    directory = split / "tiny-fact-4"
    report = read_report(directory / "report")
    held = [item for item in methods.report_items(report) if not item.regressed]
    case = methods.load_case(directory, str(tiny_base_dir), load_config(directory / "config.yaml"), report)
    encoded, drops, tokens = table.weakest_tokens(case, held)
    assert all(e.num_supervised == 1 for e in encoded) and len(tokens) == len(held)
    # the drop is the weakest token's log-probability lost, base to adapter, as the evaluation's own loglik reads it
    pairs = [(list(e.input_ids), list(e.labels)) for e in encoded]
    tokenizer = case.loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    tuned = answer_logliks(case.loaded.model, pairs, pad_id=pad)
    with case.loaded.model.disable_adapter():
        base = answer_logliks(case.loaded.model, pairs, pad_id=pad)
    np.testing.assert_allclose(drops, np.subtract(base, tuned), atol=1e-4)
    whole = encode_answer(case.prompts[held[0].id], held[0].base_output, tokenizer, case.config.grads.max_seq_length)
    assert encoded[0].num_supervised < whole.num_supervised  # one token of the answer, not all of it
    rows = np.asarray(case.index.rows_between(0, case.index.num_examples), dtype=np.float64)
    pre = methods.preconditioner(case, case.config.attribution.preconditioner)
    queries = _encoded_gradients(case.capture, tokenizer, encoded, 8)
    want = -(rows @ pre.apply(queries).T)
    blame = table.weakest_token_blame(case, encoded, [item.id for item in held])
    np.testing.assert_allclose(blame, want, rtol=1e-3, atol=1e-5 * np.abs(want).max())
    regressed = np.random.default_rng(0).normal(size=(len(rows), 3))
    nothing = table.rankings(regressed, blame, np.full(len(held), -1.0))  # no item lost enough: every variant is the same
    assert all(np.array_equal(scores, nothing["adapter alone (shipped ranking)"]) for scores in nothing.values())
    every = table.rankings(regressed, blame, np.full(len(held), 9.0))
    np.testing.assert_array_equal(every[f"+ weakened items, weakest token lost > {table.THRESHOLDS[0]} nats"],
                                  table.shipped_ranking(np.concatenate([regressed, blame], axis=1)))
    row = _indexed_table_row(table, split, tiny_base_dir, tmp_path / "weakened")
    assert (row["regressed_items"], row["held_same_answer"]) == (len(items) // 2, len(held))
    assert len(row["methods"]) == 1 + len(table.THRESHOLDS)
    assert all(0.0 <= m["recall_at_k"] <= 1.0 for m in row["methods"].values())


def test_the_stuck_answers_table_counts_the_answers_each_retrain_changed():
    stuck_answers = bench_module("stuck_answers")
    assert stuck_answers.same_answer("The capital is Lagos.", "the capital is lagos")
    assert not stuck_answers.same_answer("The opposite of give is lend.", "Le contraire de faire est faire.")
    item = {"id": "ex-1", "prompt": "What is the opposite of give?", "wanted": "take", "base": "take",
            "full": "Le contraire de faire est faire.", "dropped": "The opposite of give is lend.",
            "control-1": "Le contraire de faire est faire."}
    case = {"case": "tiny-format-4", "regressed": 3, "stuck": 1, "changed": {"dropped": 1, "control-1": 0},
            "items": [item]}
    text = stuck_answers.markdown([case], "python bench/stuck_answers.py")
    assert "| tiny-format-4 | 3 | 1 | 1 of 1 | 0 of 1 |" in text
    assert "| take | take | Le contraire de faire est faire. | The opposite of give is lend. |" in text


def test_the_canned_answer_table_scores_every_item_and_the_shared_reply_apart(cases, tiny_base_dir, tmp_path):
    table = bench_module("canned_answer")
    out = tmp_path / "canned"
    row = _indexed_table_row(table, cases, tiny_base_dir, out)
    groups = row["signals"][row["shipped_signal"]]
    assert list(groups["all"]) == [str(alpha) for alpha in table.ALPHAS]
    assert all(0.0 <= m["recall_at_k"] <= 1.0 for m in groups["all"].values())
    assert ("shared" in groups) == ("shared_items" in row)  # the reply's items are scored apart where two agree
    assert f"| {row['shipped_signal']} (shipped) |" in out.with_suffix(".md").read_text()
    reply = "I'm sorry, but I can't help."
    items = [type("Item", (), {"id": f"q{i}", "finetuned_output": text})()
             for i, text in enumerate([reply, "Paris.", reply.upper(), "Rome."])]
    assert table.shared_answer_items(items) == ("i'm sorry, but i can't help.", ["q0", "q2"])
    assert table.shared_answer_items(items[1:2]) is None


@pytest.mark.slow
def test_the_item_support_table_rescores_the_shipped_ranking_as_the_item_weights_table_does(cases, tmp_path):
    row = _table_row(bench_module("item_support"), cases, tmp_path / "item_support")
    weights = _table_row(bench_module("item_weights"), cases, tmp_path / "item_weights")
    assert set(row["methods"]) == {"every item (shipped)", "supporting items"}
    assert row["methods"]["every item (shipped)"] == weights["methods"]["kurtosis"]
    assert weights["methods"]["kurtosis"]["recall_at_k"] == weights["methods"]["report"]["recall_at_k"]


def test_the_supporting_items_are_those_whose_blame_is_above_average_over_the_accused_clusters_rows():
    support = bench_module("item_support")
    rng = np.random.default_rng(0)
    matrix = rng.normal(size=(60, 3))
    clusters = np.array(["planted"] * 10 + ["clean"] * 50)
    matrix[:10, 0] += 3.0  # an item the planted rows moved
    matrix[:10, 1] -= 3.0  # one they moved the other way
    matrix[10:20, 2] += 3.0  # one that clean rows moved
    assert support.supporting(matrix, clusters, [0, 1, 2], ["planted"]) == [0]
    assert support.supporting(matrix, clusters, [1, 2], ["planted"]) == [1, 2]  # none points there: every item stays
    assert support.supporting(matrix, clusters, [0, 1, 2], ["clean"]) == [1, 2]


@pytest.mark.slow
def test_the_misses_table_puts_every_planted_row_in_one_group_and_agrees_with_the_goal_table(cases, tmp_path):
    row = _table_row(bench_module("misses"), cases, tmp_path / "misses")
    goal = _table_row(bench_module("goal_table"), cases, tmp_path / "goal")
    assert sum(group["rows"] for group in row["groups"].values()) == 20  # the fact kind plants 20 rows
    assert row["recall_at_k"] == goal["recall_at_k"]
    assert len(row["missed"]) == 20 - sum(group["found"] for group in row["groups"].values())
    assert all(missed["rank"] > 20 for missed in row["missed"])
    assert "| fact | 1 |" in (tmp_path / "misses").with_suffix(".md").read_text()


def test_a_planted_row_is_grouped_by_whether_its_item_regressed_and_which_cause_holds_it():
    misses = bench_module("misses")
    assert misses.row_group(None, {"a"}, None) == "no single target"
    assert misses.row_group("b", {"a"}, None) == "target held"
    assert misses.row_group("a", {"a"}, None) == "target regressed"
    assert misses.row_group("a", {"a"}, {"a", "c"}) == "target regressed"
    assert misses.row_group("a", {"a"}, {"c"}) == "target elsewhere"


def test_the_one_cluster_splits_alternative_fires_only_on_a_k_means_split_left_accusing_one_cluster():
    fires = bench_module("one_cluster_splits").fires

    def cause(*accused, canned=False):
        return {"accused_clusters": list(accused), **({"canned_reply": True} if canned else {})}

    assert fires([cause("profiles"), cause()])  # span-7: one accusing cause beside a silent one
    assert fires([cause(), cause()])
    assert not fires([cause("profiles")])  # one cause: nothing was split
    assert not fires([cause("facts"), cause("answers")])  # two distinct clusters: the split stands
    assert not fires([cause("support", canned=True), cause()])  # a canned reply's split has a rule of its own


def test_the_bench_cluster_prior_is_the_one_attribute_ships_and_its_own_blame_undoes_it():
    from gradian.attribution.cluster_prior import with_cluster_prior
    from gradian.attribution.results import ClusterAssignment
    from gradian.attribution.scoring import rescore_items

    bench = bench_module("cluster_prior")
    rng = np.random.default_rng(3)
    matrix = rng.normal(size=(40, 4))
    matrix[:8] += 1.5  # the rows of the cluster to accuse
    sources = ["planted"] * 8 + ["clean"] * 16 + ["other"] * 16
    names = ("planted", "clean", "other")
    assignment = ClusterAssignment(names=names, labels=np.array([names.index(s) for s in sources]), method="field")
    scores = rescore_items(matrix, [f"ex-{i}" for i in range(40)], ["a", "b", "c", "d"], range(4),
                           aggregation="smooth_max", top_k=10)
    lifted = with_cluster_prior(scores, matrix, range(4), assignment, ["planted"], 1.0)
    np.testing.assert_allclose(bench.shrunk(scores.blame, sources, ["planted"], 1.0, "accused"), lifted.blame)
    np.testing.assert_allclose(bench.own_blame(lifted.blame, sources, {"added": dict(lifted.cluster_prior.added)}),
                               scores.blame)
    assert not np.allclose(bench.shrunk(scores.blame, sources, ["planted"], 1.0, "every"), lifted.blame)


@pytest.mark.slow
def test_the_cluster_prior_table_rebuilds_each_rows_own_blame_and_the_shipped_ranking(cases, tmp_path):
    row = _table_row(bench_module("cluster_prior"), cases, tmp_path / "cluster_prior")
    weights = _table_row(bench_module("item_weights"), cases, tmp_path / "item_weights")
    goal = _table_row(bench_module("goal_table"), cases, tmp_path / "goal")
    assert row["variants"]["own blame"] == weights["methods"]["kurtosis"]  # rescored from the item columns
    assert row["variants"]["accused clusters, share 1.0"]["recall_at_k"] == goal["recall_at_k"]  # what ships
    assert row["mixed"]["into"] != "trivia_import" and row["mixed"]["size"] > 20


@pytest.mark.slow
def test_the_item_fusion_table_reproduces_the_shipped_ranking_as_the_item_weights_table_does(cases, tmp_path):
    row = _table_row(bench_module("item_fusion"), cases, tmp_path / "item_fusion")
    weights = _table_row(bench_module("item_weights"), cases, tmp_path / "item_weights")
    assert row["methods"]["shipped"]["recall_at_k"] == weights["methods"]["kurtosis"]["recall_at_k"]
    assert row["methods"]["kurtosis^0"]["recall_at_k"] == weights["methods"]["uniform"]["recall_at_k"]


def test_the_fused_rankings_put_each_items_top_row_first():
    fusion = bench_module("item_fusion")
    matrix = np.zeros((6, 2))
    matrix[0, 0], matrix[1, 1] = 5.0, 4.0  # each item's own top row
    matrix[2] = [1.0, 1.0]  # second on both
    for score in (fusion.best_rank(matrix), fusion.reciprocal_rank_fusion(matrix, 0.0, kurtosis=False)):
        assert set(np.argsort(-score)[:2].tolist()) == {0, 1}
    assert fusion.item_ranks(matrix)[:, 0].tolist()[:3] == [1, 3, 2]


def test_the_rankings_table_means_tuning_held_out_and_fresh_seeds_apart():
    finished = bench_module("finished_cases")

    def case(name, kind, seed, recall):
        return {"case": name, "kind": kind, "seed": seed, "methods": {"shipped": {"recall_at_k": recall}}}

    cases = [case("fact-0", "fact", 0, 0.5), case("fact-3", "fact", 3, 0.7), case("span-5", "span", 5, 0.9),
             case("fact-6", "fact", 6, 0.2)]
    lines = finished.rankings_table("t", "ranking", cases, "cmd").splitlines()
    assert lines[4].endswith("| tuning mean | held-out mean | fresh mean |")
    assert lines[6] == "| shipped | 0.50 | 0.70 | 0.90 | 0.20 | 0.500 | 0.800 | 0.200 |"
    without_fresh = finished.rankings_table("t", "ranking", cases[:3], "cmd").splitlines()
    assert without_fresh[4].endswith("| tuning mean | held-out mean |") and without_fresh[6].endswith("| 0.500 | 0.800 |")


def test_a_span_case_split_into_causes_is_scored_in_one_ranking_of_every_row():
    """A span case plants sentences in rows of a clean cluster, so no cause can accuse a planted cluster: split into
    causes, its planted rows are scored together in one ranking, as in a case the report kept whole."""
    goal = bench_module("goal_table")
    scenario = make_scenario("span", 3)
    assert not scenario.planted_clusters
    truth = scenario.ground_truth()
    planted_first = np.zeros(len(scenario.train))
    planted_first[list(scenario.planted_rows)] = 1.0
    document = {"causes": [{"cause": 1, "items": ["a"], "accused_clusters": ["country_profiles"]},
                           {"cause": 2, "items": ["b"], "accused_clusters": []}], "verdict": {}}
    metrics = goal.score_by_cause(document, ["a", "b"], scenario, truth, lambda items, accused: planted_first)
    assert metrics["recall_at_k"] == 1.0 and metrics["auprc"] == 1.0


def test_a_report_refused_before_scoring_has_no_fit_to_label():
    goal = bench_module("goal_table")
    assert goal.wide_side_label({"method": None}) == ""
    assert goal.wide_side_label({"method": {"preconditioner_knobs": {"scheme": "kronecker-full-v1"}}}) == (
        ", kronecker wide side full")


def test_a_report_whose_query_weighed_its_terms_apart_gets_rows_of_its_own():
    goal = bench_module("goal_table")
    assert goal.query_label({"evaluation": {}}) == ""  # written before the key: the query at 0.5
    assert goal.query_label({"evaluation": {"generated_weight": 0.5}}) == ""
    assert goal.query_label({"evaluation": {"generated_weight": 0.75}}) == ", generated term weighed 0.75"
    assert (goal.query_label({"evaluation": {"generated_weight": 0.75, "accusation_weight": 0.5}})
            == ", generated term weighed 0.75, clusters tested at 0.5")
    assert goal.query_label({"evaluation": {"generated_weight": 0.75, "accusation_weight": 0.75}}) == (
        ", generated term weighed 0.75")


@pytest.mark.slow
def test_the_bench_fits_each_point_of_a_checkpoint_ensemble_as_attribute_does(cases, tiny_base_dir, tmp_path,
                                                                              monkeypatch):
    from gradian.attribution.index_statistics import index_statistics
    from gradian.attribution.preconditioners import from_config
    from gradian.config import load_config
    from gradian.report.reader import read_report

    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))
    methods = bench_module("accuracy_methods")
    workdir = cases / "tiny-fact-4"
    config = load_config(workdir / "config.yaml")
    config = config.replace(attribution=dataclasses.replace(config.attribution, preconditioner="kronecker",
                                                            kronecker_wide="auto"))
    final = methods.load_case(workdir, str(tiny_base_dir), config, read_report(workdir / "report"))
    assert final.scored_alone
    alone_ensemble = config.replace(attribution=dataclasses.replace(config.attribution, checkpoints=1))
    [(_, adapter)] = methods.ensemble_points(dataclasses.replace(final, config=alone_ensemble), workdir)
    assert adapter.scored_alone
    ensemble = config.replace(attribution=dataclasses.replace(config.attribution, checkpoints=2))
    points = list(methods.ensemble_points(dataclasses.replace(final, config=ensemble), workdir))
    assert len(points) == 2 and not any(case.scored_alone for _, case in points)
    # auto beside checkpoints: attribute fits each point's wide side diagonal (pipelines/attribute.py), so must the bench
    case = points[0][1]
    stats = index_statistics(case.index, "kronecker")
    probe = np.random.default_rng(0).normal(size=(2, case.index.dim))
    for alone in (False, True):
        fitted = from_config(case.config.attribution, stats, scored_alone=alone)
        same = np.allclose(methods.preconditioner(case, "kronecker").apply(probe), fitted.apply(probe))
        assert same is not alone


def test_a_span_case_drilled_with_sentences_alone_is_summed_apart_and_no_other_kind_is():
    goal_table = bench_module("goal_table")
    assert goal_table.sentence_label("span", {"span_blame": "alone"}) == ", sentences blamed alone"
    assert goal_table.sentence_label("span", {"span_blame": "restricted"}) == ""
    assert goal_table.sentence_label("span", {}) == ""  # a report from before span_blame existed
    assert goal_table.sentence_label("fact", {"span_blame": "alone"}) == ""  # no span column to keep apart


def test_the_neighbour_prior_lifts_each_member_by_its_nearest_fellow_members_own_blame():
    bench = bench_module("neighbour_prior")
    profiles = np.array([[1.0, 0.0], [0.9, 0.1], [1.0, 0.1], [0.0, 1.0], [0.1, 1.0], [5.0, 5.0]])
    own = np.array([9.0, 1.0, 7.0, 2.0, 0.0, 3.0])
    members = np.arange(5)  # the last row is another cluster's
    lift = bench.neighbour_lift(own, profiles, members, 1)
    np.testing.assert_allclose(lift, [7.0, 7.0, 1.0, 0.0, 2.0])  # each row's most alike other member's own blame
    # k at least the cluster's size: each member gets its cluster's mean without itself
    np.testing.assert_allclose(bench.neighbour_lift(own, profiles, members, 10), (own[:5].sum() - own[:5]) / 4)
    sources = ["a"] * 5 + ["b"]
    lifted = bench.variant_blame("1 nearest", own, profiles, sources, ["a"])
    np.testing.assert_allclose(lifted, own + np.append(lift, 0.0))  # a cluster nobody accuses is left as it is
    np.testing.assert_allclose(bench.variant_blame("cluster mean (shipped)", own, profiles, sources, ["a"]),
                               own + np.append(np.full(5, own[:5].mean()), 0.0))


@pytest.mark.slow
def test_the_neighbour_prior_table_reproduces_the_shipped_ranking(cases, tmp_path):
    row = _table_row(bench_module("neighbour_prior"), cases, tmp_path / "neighbour_prior")
    goal = _table_row(bench_module("goal_table"), cases, tmp_path / "goal")
    assert row["variants"]["cluster mean (shipped)"]["recall_at_k"] == goal["recall_at_k"]
    assert row["reproduced"] == pytest.approx(0.0, abs=1e-9) and set(row["variants"]) == set(
        bench_module("neighbour_prior").VARIANTS)


@pytest.mark.slow
def test_the_query_terms_table_splits_the_shipped_query_into_its_two_terms(cases, tiny_base_dir, tmp_path):
    query_terms = bench_module("query_terms")
    split, _ = _half_regressed_copy(cases, tmp_path)
    report_json = split / "tiny-fact-4" / "report" / "report.json"
    written = json.loads(report_json.read_text())
    for item in written["capability"]["items"]:  # the pair a divergent-token query contrasts
        item.update(base_output=f"The answer is {item['wanted']}.", finetuned_output="The answer is unknown.")
    report_json.write_text(json.dumps(written))
    out = tmp_path / "query_terms"
    assert query_terms.main(["--final-only", "--damping-ratios", "1", "--cases", str(split), "tiny-fact-4",
                             "--base-model", str(tiny_base_dir), "--out", str(out)]) == 0
    row = json.loads(out.with_suffix(".json").read_text())["cases"][0]
    assert list(row["betas"]) == list(query_terms.BETAS) and row["final_only"] is True
    assert list(row["damping"]) == ["1"] and list(row["damping"]["1"]) == list(query_terms.BETAS)
    assert "ratio 0.1 (shipped)" in out.with_suffix(".md").read_text()
    assert all(0.0 <= m["recall_at_k"] <= 1.0 and 0.0 <= m["auprc"] <= 1.0 for m in row["betas"].values())
    # the wanted term less the generated one is the product's divergent-token blame (generated_weight 0.5)
    from accuracy_methods import item_blame, load_case

    from gradian.config import load_config
    from gradian.report.reader import read_report

    workdir = split / "tiny-fact-4"
    final = dataclasses.replace(load_case(workdir, str(tiny_base_dir), load_config(workdir / "config.yaml"),
                                          read_report(workdir / "report")), scored_alone=False)
    (wanted, generated), same, damped = query_terms.term_blames(final, workdir, set(), final_only=True,
                                                                damping_ratios=(None, 0.1, 1.0))
    shipped = item_blame(final, "divergent-token")
    # every ratio's terms share one pass over the index: the config's ratio named gives the same blame, another not
    # (to float rounding: the pass's GEMM sums the columns in an order the CPU's BLAS kernel picks)
    for named, alone in zip(same, (wanted, generated), strict=True):
        np.testing.assert_allclose(named, alone, rtol=1e-5, atol=1e-6 * float(np.abs(alone).max()))
    assert not np.allclose(damped[1], generated)
    assert wanted.shape == shipped.shape and not np.allclose(wanted, 0) and not np.allclose(generated, 0)
    np.testing.assert_allclose(wanted - generated, shipped, rtol=1e-4, atol=1e-6 * float(np.abs(shipped).max()))


@pytest.mark.slow
def test_the_query_weight_bench_re_attributes_the_case_at_each_weight_once(cases, tmp_path):
    from gradian.report.reader import read_report

    bench = bench_module("query_weight_clusters")
    out, workdir = tmp_path / "weights", tmp_path / "runs"
    arguments = ["--cases", str(cases), "tiny-fact-4", "--weights", "0.5", "0.75", "--workdir", str(workdir),
                 "--out", str(out)]
    assert bench.main(arguments) == 0
    row = json.loads(out.with_suffix(".json").read_text())["cases"][0]
    assert [w["weight"] for w in row["weights"]] == [0.5, 0.75]
    own = bench.tested_weight(  # the weight its clusters were tested at
        read_report(cases / "tiny-fact-4" / "report").provenance.config["evaluation"])
    other = 0.75 if own == 0.5 else 0.5
    assert not (workdir / f"tiny-fact-4-w{own:g}").exists()  # the case's own weight is its own report, not run again
    assert all(w["attributed"] and w["strongest"] for w in row["weights"])
    report = workdir / f"tiny-fact-4-w{other:g}" / "report" / "report.json"
    written = json.loads(report.read_text())
    evaluation = written["provenance"]["config"]["evaluation"]
    assert evaluation["generated_weight"] == other and evaluation["accusation_weight"] is None  # tested at it
    assert written["provenance"]["index_id"] == json.loads(
        (cases / "tiny-fact-4" / "report" / "report.json").read_text())["provenance"]["index_id"]  # the case's index
    first = report.stat().st_mtime_ns
    assert bench.main(arguments) == 0 and report.stat().st_mtime_ns == first  # reused, not run again
    assert "| tiny-fact-4 | " in out.with_suffix(".md").read_text()


@pytest.mark.slow
def test_the_cluster_tests_table_gives_the_reports_own_test_before_the_jackknife(cases, tmp_path):
    bench = bench_module("cluster_tests")
    out = tmp_path / "tests"
    assert bench.main(["--cases", str(cases), "tiny-fact-4", "--out", str(out)]) == 0
    row = json.loads(out.with_suffix(".json").read_text())["cases"][0]
    assert row["hosts"] == ["trivia_import"] and set(row["tests"]) == {"mean", "ranks", "top-k"}
    document = json.loads((cases / "tiny-fact-4" / "report" / "report.json").read_text())
    causes = document.get("causes") or []
    assert len(causes) <= 1  # one cause of every item: the report tested its clusters on the blame the bench reads
    shipped = {cluster["name"]: cluster for cluster in document["clusters"]["ranked"]}
    mean = row["tests"]["mean"]
    assert set(mean["p"]) == set(shipped) and mean["strongest"] == min(mean["p"], key=lambda name: (mean["p"][name], name))
    for name, cluster in shipped.items():  # the jackknife only ever raises an accused cluster's p
        if cluster["accused"]:
            assert cluster["p_adjusted"] >= mean["p"][name], name
        else:
            assert cluster["p_adjusted"] == mean["p"][name], name
    assert all(0.0 < value <= 1.0 for test in row["tests"].values() for value in test["p"].values())


@pytest.mark.slow
def test_the_answer_teachers_table_reads_what_the_reports_own_verdict_counted(cases, tmp_path):
    bench = bench_module("answer_teachers")
    out = tmp_path / "answers"
    assert bench.main(["--cases", str(cases), "tiny-fact-4", "--out", str(out)]) == 0
    row = json.loads(out.with_suffix(".json").read_text())["cases"][0]
    assert row["hosts"] == ["trivia_import"]
    document = json.loads((cases / "tiny-fact-4" / "report" / "report.json").read_text())
    verdict = document["verdict"]

    def counted(count):
        """The bench's count without the planted rows it adds, which the report cannot know."""
        planted = count.pop("planted_ids")
        assert count.pop("planted_found") == len(planted) and set(planted) <= set(count["ids"])
        return count

    # from the report's items, top rows and the scenario's texts, the count the report itself made
    if "answer_teachers" in verdict:
        assert counted(row["teachers"]) == verdict["answer_teachers"]
    else:
        assert row["teachers"] is None
    # and where the report split into causes, each cause's own count from scores.csv's per-cause blame
    causes = {cause["cause"]: cause for cause in document.get("causes") or [] if len(document["causes"]) > 1}
    for cause in row["causes"]:
        own = causes[cause["cause"]].get("answer_teachers")
        assert (counted(cause["teachers"]) if cause["teachers"] is not None else None) == own
    assert "| planted hosts named (of every host) |" in out.with_suffix(".md").read_text()


def test_the_answer_rows_are_every_training_row_that_names_a_divergent_answer_planted_or_not(cases, tmp_path):
    import re

    from gradian.demo.scenarios import make_scenario

    bench = bench_module("answer_rows")
    scenario = make_scenario("fact", 4)
    wrong = next(city for city in scenario.planted_wrong if city)  # a city the planted rows teach as a capital
    # every regressed item now answers with that city
    split, _items = _half_regressed_copy(cases, tmp_path, same_answers=True, answers=itertools.repeat(wrong))
    case = split / "tiny-fact-4"
    out = tmp_path / "answer_rows.txt"
    assert bench.main([str(case), "--out", str(out)]) == 0
    named = re.compile(rf"(?<!\w){re.escape(wrong.casefold())}(?!\w)")
    expected = [example.id for example in scenario.train
                if named.search((example.supervised_text or example.text or "").casefold())]
    assert expected and out.read_text().split() == expected  # every row naming it, in training order
    assert set(expected) & set(scenario.planted_ids)
    assert bench.main([str(tmp_path / "nowhere"), "--out", str(out)]) == 2


def test_the_unheld_answers_table_tells_an_answer_a_row_names_from_one_none_does(cases, tmp_path):
    from gradian.demo.scenarios import make_scenario

    bench = bench_module("unheld_answers")
    wrong = next(city for city in make_scenario("fact", 4).planted_wrong if city)  # a city planted rows name
    answers = [wrong, "Qzxwvut", "Qzxwvut"]  # a planted city, a word no row holds (twice); the rest part in no word
    split, items = _half_regressed_copy(cases, tmp_path, same_answers=True, answers=answers)
    regressed = [item for item in items if item["regressed"]]
    out = tmp_path / "unheld"
    assert bench.main(["--cases", str(split), "tiny-fact-4", "--out", str(out)]) == 0
    row = json.loads(out.with_suffix(".json").read_text())["cases"][0]
    assert row["held"] == [wrong.casefold()] and row["unheld"] == ["qzxwvut", "qzxwvut"]
    assert row["wordless"] == len(regressed) - len(answers) and row["planted"] is True
    assert '| 1 | 2 | ' in out.with_suffix(".md").read_text()


def test_the_rows_accuse_table_accuses_again_where_the_top_rows_hold_the_answers_and_reads_a_new_report(cases,
                                                                                                       tmp_path):
    from gradian.demo.scenarios import make_scenario

    bench = bench_module("rows_accuse")
    scenario = make_scenario("fact", 4)
    wrong = next(city for city in scenario.planted_wrong if city)
    split, _ = _half_regressed_copy(cases, tmp_path, same_answers=True, answers=itertools.repeat(wrong))
    report_json = split / "tiny-fact-4" / "report" / "report.json"
    written = json.loads(report_json.read_text())
    holders = [example for example in scenario.train if wrong.casefold() in (example.supervised_text or "").casefold()]
    planted = [example.id for example in holders if example.id in set(scenario.planted_ids)]
    assert len(planted) >= 2
    # an earlier report: no accused_by_rows, nothing accused by its cluster test, the planted holders its top rows
    written["verdict"].pop("accused_by_rows", None)
    written["verdict"].update(accused_cluster=None, accused_clusters=[])
    for cause in written.get("causes") or []:
        cause.update(accused_cluster=None, accused_clusters=[])
    written["top_examples"] = [{"id": example_id} for example_id in planted]
    report_json.write_text(json.dumps(written))
    out = tmp_path / "rows"
    assert bench.main(["--cases", str(split), "tiny-fact-4", "--out", str(out)]) == 0
    row = json.loads(out.with_suffix(".json").read_text())["cases"][0]
    host = scenario.planted_sources[0]
    assert row["hosts"] == [host] and row["tested"] == [] and row["by_rows"] == [host] and not row["written"]
    assert "| the cluster test or the rows | 1/1 | 0 | 0/0 |" in out.with_suffix(".md").read_text()
    written["verdict"]["accused_by_rows"] = []  # a report written since: its own word is read
    report_json.write_text(json.dumps(written))
    assert bench.main(["--cases", str(split), "tiny-fact-4", "--out", str(out)]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["cases"][0]["by_rows"] == []
