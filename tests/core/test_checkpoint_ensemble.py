"""TracIn-CP in `gradian attribute`: the checkpoints chosen, their learning-rate weights, and the summed blame.

The sum is checked against each checkpoint attributed on its own (a fresh model load per checkpoint, not the
in-place weight swap the ensemble uses), on a run written by the real transformers.Trainer through `gradian train`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gradian.attribution.checkpoint_ensemble import _evenly_spaced, _weights, plan_ensemble, rate_at
from gradian.cli.app import main
from gradian.errors import ModelError
from gradian.index.sizing import DISK_MARGIN, IndexEstimate
from gradian.index.store import Index
from tests.core.counterfactual_reports import N_CLEAN, N_PLANTED, write_dataset, write_eval
from tests.core.test_report_files import _read_scores_csv
from tests.support.disks import tmpfs
from tests.trainer_hf.chat_data import QUICK


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """The checkpoints' indexes go to the index cache: a fresh one per test, never the user's."""
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def trained(tiny_base_dir, tmp_path_factory):
    """A 3-step `gradian train` run on the tiny Llama: out/adapter, out/run/checkpoint-1..3 with trainer_state.json."""
    root = tmp_path_factory.mktemp("ensemble")
    dataset = write_dataset(root / "train.jsonl")
    argv = ["train", "--base-model", str(tiny_base_dir), "--dataset", str(dataset), "--out", str(root / "out"),
            "--set", "train.learning_rate=1e-2", "--set", "train.scheduler=linear", "--set", "train.warmup_ratio=0"]
    for override in QUICK:
        argv += ["--set", override]
    assert main(argv) == 0
    return {"root": root, "dataset": dataset, "adapter": root / "out" / "adapter", "run": root / "out" / "run"}


def _attribute(trained, tiny_base_dir, out: Path, adapter: Path, *extra: str) -> dict:
    argv = ["attribute", "--base-model", str(tiny_base_dir), "--adapter", str(adapter), "--dataset",
            str(trained["dataset"]), "--out", str(out), "--set", "attribution.cluster_field=source",
            "--set", "evaluation.require_significant=false", *extra]
    assert main(argv) == 0
    return json.loads((out / "report.json").read_text())


def _item_blame(out: Path, items: list[str], prefix: str = "item:") -> np.ndarray:
    rows = sorted(_read_scores_csv(out / "scores.csv"), key=lambda row: int(row["position"]))
    return np.array([[float(row[f"{prefix}{item}"]) for item in items] for row in rows])


def test_summed_blame_equals_each_checkpoint_attributed_alone_weighted_by_learning_rate(trained, tiny_base_dir,
                                                                                        tmp_path):
    root = tmp_path
    report = _attribute(trained, tiny_base_dir, root / "ensemble", trained["adapter"],
                        "--run", str(trained["run"]), "--set", "attribution.checkpoints=3")
    members = report["method"]["checkpoints"]
    assert [m["is_adapter"] for m in members] == [False, False, True]
    assert [m["step"] for m in members] == [1, 2, 3]
    assert sum(m["weight"] for m in members) == pytest.approx(1.0)
    rates = [m["learning_rate"] for m in members]
    assert rates[0] > rates[1] > rates[2] >= 0  # linear decay, no warmup
    assert [m["weight"] for m in members] == pytest.approx([r / sum(rates) for r in rates], rel=1e-5)
    assert len({m["index_id"] for m in members}) == 3
    items = report["method"]["query_items"]  # no eval set: the first training rows stand in as the target
    # kronecker_wide auto fits the wide side in full only for a point scored alone: the ensemble's are diagonal
    assert report["method"]["preconditioner_knobs"]["scheme"] == "kronecker-rank-v1"
    expected = 0
    for member in members:
        alone = root / f"alone-{member['step']}"
        scored = _attribute(trained, tiny_base_dir, alone, Path(member["adapter"]), "--set", "attribution.checkpoints=1",
                            "--set", "attribution.kronecker_wide=diagonal")
        assert scored["method"]["preconditioner_knobs"]["scheme"] == "kronecker-rank-v1"
        expected = expected + member["weight"] * _item_blame(alone, items)
    alone_auto = _attribute(trained, tiny_base_dir, root / "alone-auto", trained["adapter"], "--set",
                            "attribution.checkpoints=1")
    assert alone_auto["method"]["preconditioner_knobs"]["scheme"] == "kronecker-full-v1"
    np.testing.assert_allclose(_item_blame(root / "ensemble", items), expected, rtol=1e-5, atol=1e-9)
    assert "TracIn-CP" in (root / "ensemble" / "report.md").read_text()


def test_span_blame_is_each_checkpoints_span_blame_weighted_by_learning_rate(trained, tiny_base_dir, tmp_path):
    # one query item and every row drilled, so each run drills every example against the same query
    every = str(N_CLEAN + N_PLANTED)
    drill_all = ("--set", "attribution.fallback_examples=1", "--set", f"attribution.span_examples={every}",
                 "--set", f"attribution.top_k={every}")
    report = _attribute(trained, tiny_base_dir, tmp_path / "ensemble", trained["adapter"],
                        "--set", "attribution.checkpoints=3", *drill_all)
    members = report["method"]["checkpoints"]
    assert len(members) == 3 and len(report["spans"]) == N_CLEAN + N_PLANTED
    expected: dict[tuple[str, int, int], float] = {}
    for member in members:
        alone = _attribute(trained, tiny_base_dir, tmp_path / f"alone-{member['step']}", Path(member["adapter"]),
                           "--set", "attribution.checkpoints=1", "--set", "attribution.kronecker_wide=diagonal",
                           *drill_all)  # as the ensemble fits each point (auto is full only for a point alone)
        for key, blame in _span_blames(alone).items():
            expected[key] = expected.get(key, 0.0) + member["weight"] * blame
    summed = _span_blames(report)
    assert summed.keys() == expected.keys()
    np.testing.assert_allclose([summed[key] for key in expected], list(expected.values()), rtol=1e-5, atol=1e-9)


def _span_blames(report: dict) -> dict[tuple[str, int, int], float]:
    """(example id, message, sentence start) -> blame, over every drilled example."""
    return {(drill["example_id"], span["message_index"], span["start"]): span["blame"]
            for drill in report["spans"] for span in drill["spans"]}


def test_an_eval_set_run_scores_every_member_on_the_adapters_regressed_items(trained, tiny_base_dir, tmp_path):
    evals = write_eval(tmp_path / "eval.jsonl")
    report = _attribute(trained, tiny_base_dir, tmp_path / "out", trained["adapter"], "--eval-dataset", str(evals),
                        "--set", "attribution.checkpoints=2")
    # the run is found next to the adapter (gradian train's out/adapter beside out/run) without --run
    assert [m["step"] for m in report["method"]["checkpoints"]] == [1, 3]  # step 1.5 is a tie: the earlier
    assert report["verdict"]["kind"] == "attributed" and len(report["top_examples"]) > 0
    assert report["spans"] and all(drill["spans"] for drill in report["spans"])  # drilled at every member too


def test_no_run_scores_the_adapter_alone_and_says_so(trained, tiny_base_dir, tiny_adapter_dir, tmp_path):
    report = _attribute(trained, tiny_base_dir, tmp_path / "out", tiny_adapter_dir,
                        "--set", "attribution.checkpoints=4")
    assert "checkpoints" not in report["method"]
    notes = [w["message"] for w in report["warnings"] if w["code"] == "attribution.checkpoints"]
    assert len(notes) == 1 and "pass --run" in notes[0]


def test_the_weight_swap_gives_the_checkpoints_weights_and_puts_the_adapters_back(trained, tiny_base_dir):
    from safetensors.torch import load_file

    from gradian.model.adapter_swap import checkpoint_weights
    from gradian.model.loaded import LoadedModel

    loaded = LoadedModel.load(tiny_base_dir, trained["adapter"])
    before = {n: p.detach().clone() for n, p in loaded.model.named_parameters() if p.requires_grad}
    checkpoint = trained["run"] / "checkpoint-1"
    saved = load_file(str(checkpoint / "adapter_model.safetensors"))
    with checkpoint_weights(loaded, checkpoint) as view:
        assert view.adapter_hash == LoadedModel.load(tiny_base_dir, checkpoint).adapter_hash != loaded.adapter_hash
        live = dict(view.model.named_parameters())
        for key, tensor in saved.items():
            name = key.replace(".weight", ".default.weight")
            assert torch.equal(live[name].detach(), tensor.to(torch.float32)), key
    after = {n: p.detach() for n, p in loaded.model.named_parameters() if p.requires_grad}
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_a_checkpoint_of_another_adapter_is_refused(trained, tiny_base_dir, tiny_adapter_dir):
    from gradian.model.adapter_swap import checkpoint_weights
    from gradian.model.loaded import LoadedModel

    loaded = LoadedModel.load(tiny_base_dir, trained["adapter"])
    with pytest.raises(ModelError, match="is not a checkpoint of the adapter"), \
            checkpoint_weights(loaded, tiny_adapter_dir):
        pass


def test_plan_picks_the_checkpoints_nearest_evenly_spaced_steps(trained):
    from gradian.model.adapter_swap import checkpoint_hash

    adapter_hash = checkpoint_hash(trained["adapter"])
    plan = plan_ensemble(2, trained["run"], trained["adapter"], adapter_hash)
    assert [(m.step, m.is_adapter) for m in plan.members] == [(1, False), (3, True)] and plan.note is None
    plan = plan_ensemble(9, trained["run"], trained["adapter"], adapter_hash)
    assert len(plan.members) == 3 and "kept 2 checkpoints before the adapter" in plan.note
    assert plan_ensemble(1, trained["run"], trained["adapter"], adapter_hash).members == ()


def test_evenly_spaced_rates_and_weights():
    found = [(step, Path(f"checkpoint-{step}")) for step in (100, 200, 300, 400, 500, 600, 700)]
    assert [s for s, _ in _evenly_spaced(found, 800, 3)] == [200, 400, 600]
    assert [s for s, _ in _evenly_spaced(found[:2], 800, 3)] == [100, 200]
    assert _evenly_spaced(found, 800, 0) == []
    rates = [(10, 3e-4), (20, 2e-4), (30, 1e-4)]
    assert rate_at(rates, 25) == 2e-4 and rate_at(rates, 5) == 3e-4 and rate_at(rates, None) == 1e-4
    assert rate_at([], 5) is None
    assert _weights([3.0, 1.0]) == [0.75, 0.25]
    assert _weights([None, 1.0]) == [0.5, 0.5] and _weights([0.0, 0.0]) == [0.5, 0.5]


def _pages(cache: Path) -> int:
    """Bytes the files under ``cache`` take on a tmpfs, which holds whole 4 KiB pages."""
    return sum(-(-path.stat().st_size // 4096) * 4096 for path in cache.rglob("*") if path.is_file())


def test_the_checkpoints_indexes_count_against_the_disk_before_the_first_gradient(trained, tiny_base_dir, tmp_path,
                                                                                  monkeypatch, capsys):
    evals = write_eval(tmp_path / "eval.jsonl")
    argv = ["attribute", "--base-model", str(tiny_base_dir), "--adapter", str(trained["adapter"]), "--dataset",
            str(trained["dataset"]), "--eval-dataset", str(evals), "--set", "attribution.cluster_field=source",
            "--set", "evaluation.require_significant=false"]
    # diagonal: so the cache holds the index alone (a point scored alone caches its full kronecker fit beside it)
    assert main([*argv, "--out", str(tmp_path / "one"), "--set", "attribution.checkpoints=1",
                 "--set", "attribution.kronecker_wide=diagonal"]) == 0
    index = Index.open(next((tmp_path / "cache" / "indexes").iterdir()))
    estimate = IndexEstimate(index.num_examples, index.dim, index.manifest.storage_dtype, projected=False,
                             peak_memory_bytes=0, num_shards=len(index.manifest.shards))
    size = 2 * _pages(tmp_path / "cache") + 8192  # room for two indexes
    assert size < 3 * estimate.disk_bytes * DISK_MARGIN  # and not, by the estimate, for three
    with tmpfs(tmp_path, size) as disk:
        monkeypatch.setenv("GRADIAN_CACHE_DIR", str(disk))
        capsys.readouterr()
        assert main([*argv, "--out", str(tmp_path / "three"), "--set", "attribution.checkpoints=3"]) == 2
        err = capsys.readouterr().err
        assert "not enough free disk for the 3 gradient indexes still to build" in err
        assert "attribution.checkpoints" in err and "Traceback" not in err and "index cache on" not in err
        assert _pages(disk) == 0 and not (tmp_path / "three").exists()  # refused before anything was written
        # two indexes fit, but not with the full kronecker fit each point would keep beside its index
        assert main([*argv, "--out", str(tmp_path / "two"), "--set", "attribution.checkpoints=2",
                     "--set", "attribution.kronecker_wide=full"]) == 2
        err = capsys.readouterr().err
        assert "; then 1 checkpoint index of the same size, each with its kronecker fit" in err
        assert "with the kronecker fit's" in err and "attribution.kronecker_wide=diagonal" in err
        assert _pages(disk) == 0 and not (tmp_path / "two").exists()
        assert main([*argv, "--out", str(tmp_path / "two"), "--set", "attribution.checkpoints=2"]) == 0
        assert "; then 1 checkpoint index of the same size" in capsys.readouterr().err
        # run again, it reuses both indexes, so neither counts against the now nearly full disk
        assert main([*argv, "--out", str(tmp_path / "two"), "--set", "attribution.checkpoints=2"]) == 0
        assert len(json.loads((tmp_path / "two" / "report.json").read_text())["method"]["checkpoints"]) == 2
        capsys.readouterr()
        assert main([*argv, "--out", str(tmp_path / "three"), "--set", "attribution.checkpoints=3"]) == 2
        err = capsys.readouterr().err
        assert "not enough free disk for the gradient index:" in err  # only the missing one
        assert "held by the index cache on that disk" in err  # the two it just built, which pruning would free


def test_gradian_index_counts_the_kronecker_fit_only_where_attribute_would_score_the_adapter_alone(
        trained, tiny_base_dir, tmp_path, capsys):
    argv = ["index", "--base-model", str(tiny_base_dir), "--adapter", str(trained["adapter"]), "--dataset",
            str(trained["dataset"])]

    def estimate(out: str, *extra: str) -> str:
        assert main([*argv, "--out", str(tmp_path / out), *extra]) == 0
        return next(line for line in capsys.readouterr().err.splitlines() if line.startswith("index estimate:"))

    assert "kronecker fit" not in estimate("beside-checkpoints")  # the run's checkpoints sit next to the adapter
    assert "the kronecker fit keeps" in estimate("alone", "--set", "attribution.checkpoints=1")
    assert "the kronecker fit keeps" in estimate("full", "--set", "attribution.kronecker_wide=full")


def test_a_canned_reply_that_is_no_cause_of_its_own_changes_no_number(trained, tiny_base_dir, tmp_path):
    """Two eval items that ask one question get one reply word for word from the tiny model; scored at every member
    with attribution.canned_replies (the default) and without, a reply that accuses no cluster of its own and whose
    blame is no more concentrated than the other items' (causes.CONCENTRATED_BY) changes no number."""
    from types import SimpleNamespace

    from gradian.query.signals import shared_answers

    evals = write_eval(tmp_path / "eval.jsonl", n=8)
    lines = evals.read_text().splitlines()
    evals.write_text("\n".join([*lines, lines[3]]) + "\n")  # asked twice: one generation, word for word
    run = ("--eval-dataset", str(evals), "--set", "attribution.checkpoints=2")
    plain = _attribute(trained, tiny_base_dir, tmp_path / "plain", trained["adapter"], *run,
                       "--set", "attribution.canned_replies=false")
    canned = _attribute(trained, tiny_base_dir, tmp_path / "canned", trained["adapter"], *run)  # on by default
    items = [SimpleNamespace(**item) for item in canned["capability"]["items"]]
    assert shared_answers([item for item in items if item.regressed] or items)  # the reply is there to be tried
    assert not any(cause.get("canned_reply") for cause in canned["causes"])
    assert "whole_answer_items" not in canned["query_signal"]
    ids = plain["method"]["query_items"]
    assert canned["method"]["query_items"] == ids
    # equal to float rounding: the reply's trial scores more query columns, and a GEMM over them sums in another order
    _assert_blame_close(_item_blame(tmp_path / "canned", ids), _item_blame(tmp_path / "plain", ids))
    assert [row["id"] for row in canned["top_examples"]] == [row["id"] for row in plain["top_examples"]]
    np.testing.assert_allclose([row["blame"] for row in canned["top_examples"]],
                               [row["blame"] for row in plain["top_examples"]], rtol=1e-5)


def test_the_accusation_weight_tests_as_a_run_at_it_and_ranks_as_a_run_at_the_generated_weight(trained,
                                                                                                 tiny_base_dir,
                                                                                                 tmp_path):
    """evaluation.accusation_weight: one scoring pass takes every query at both generated weights; the clusters and
    causes are those of a run at the accusation weight, every example's per-item blame that of a run at the
    ranking weight, at every member of the ensemble, with the base point, and with a canned reply tried."""
    from types import SimpleNamespace

    from gradian.query.signals import shared_answers

    evals = write_eval(tmp_path / "eval.jsonl", n=8)
    lines = evals.read_text().splitlines()
    evals.write_text("\n".join([*lines, lines[3]]) + "\n")  # asked twice: a reply given word for word
    run = ("--eval-dataset", str(evals), "--set", "attribution.checkpoints=2", "--set", "attribution.base_point=0.5")
    tested = _attribute(trained, tiny_base_dir, tmp_path / "half", trained["adapter"], *run,
                        "--set", "evaluation.generated_weight=0.5")
    ranked = _attribute(trained, tiny_base_dir, tmp_path / "ranked", trained["adapter"], *run,
                        "--set", "evaluation.generated_weight=0.75", "--set", "evaluation.accusation_weight=null")
    both = _attribute(trained, tiny_base_dir, tmp_path / "both", trained["adapter"], *run,
                      "--set", "evaluation.generated_weight=0.75", "--set", "evaluation.accusation_weight=0.5")
    def tests(report: dict) -> list[dict]:  # each cause as its cluster tests left it, not its ranking
        return [{key: value for key, value in cause.items() if key not in ("top_examples", "cluster_prior")}
                for cause in report["causes"]]

    # equal up to float rounding: a GEMM over twice the query columns sums in another order
    assert _rounded(both["clusters"]) == _rounded(tested["clusters"])
    assert _rounded(tests(both)) == _rounded(tests(tested))
    assert both["verdict"]["accused_cluster"] == tested["verdict"]["accused_cluster"]
    items = [SimpleNamespace(**item) for item in both["capability"]["items"]]
    assert shared_answers([item for item in items if item.regressed] or items)  # the reply was tried at both weights
    ids = ranked["method"]["query_items"]
    assert both["method"]["query_items"] == ids
    _assert_blame_close(_item_blame(tmp_path / "both", ids), _item_blame(tmp_path / "ranked", ids))
    assert not np.allclose(_item_blame(tmp_path / "both", ids), _item_blame(tmp_path / "half", ids), rtol=1e-3)
    tested_ids = _tested_columns(tmp_path / "both")  # the blame the clusters were tested on, saved beside it
    assert tested_ids and set(tested_ids) <= set(ids)
    _assert_blame_close(_item_blame(tmp_path / "both", tested_ids, "tested:"),
                        _item_blame(tmp_path / "half", tested_ids))
    assert not _tested_columns(tmp_path / "ranked")
    if not any(cause["accused_clusters"] for report in (tested, ranked) for cause in report["causes"]):  # no prior
        assert [row["id"] for row in both["top_examples"]] == [row["id"] for row in ranked["top_examples"]]
    assert both["method"]["clusters"]["generated_weight"] == 0.5
    assert "generated_weight" not in ranked["method"]["clusters"]
    assert "queries weighing the generated answer 0.5" in (tmp_path / "both" / "report.md").read_text()


def _tested_columns(out: Path) -> list[str]:
    """The eval items of scores.csv's ``tested:`` columns."""
    header = _read_scores_csv(out / "scores.csv")[0].keys()
    return [name.removeprefix("tested:") for name in header if name.startswith("tested:")]


def _assert_blame_close(actual: np.ndarray, desired: np.ndarray) -> None:
    """Equal to float rounding: relative 1e-6, and 1e-6 of the blame's scale for values near zero."""
    np.testing.assert_allclose(actual, desired, rtol=1e-6, atol=1e-6 * float(np.abs(desired).max()))


def _rounded(value):
    """A report section with every float to 6 significant digits."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    return value
