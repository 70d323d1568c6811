"""`gradian attribute` end to end on tiny models trained inside the test, with a planted cluster that causes the
regression (tests/support/scenario.py): the significance gate, the query signals, cluster blame, span
drill-down, the no-eval-set fallback, deterministic reports and the CLI path.

Measured on this fixture (seed 0; 144 training rows, 14 planted; 18 eval items, 14 regressed), printed by the tests:

| scenario | query signal | preconditioner | planted cluster rank (z) | accused | recall@14 | first planted row |
|---|---|---|---|---|---|---|
| substitution | contrastive | kronecker | 1 (10.6) | planted | 0.93 | rank 1 |
| substitution | contrastive | diagonal (before) | 1 (9.63) | planted | 0.79 | rank 1 |
| substitution | divergence | kronecker | 1 (10.6) | planted | 0.93 | rank 1 |
| substitution | divergent-token, auto | kronecker | 1 (10.6) | planted | 0.93 | rank 1 |
| substitution | divergent-token, auto | diagonal (before) | 1 (9.25) | planted | 0.79 | rank 1 |
| substitution | margin | kronecker | 1 (6.29) | planted | 0.64 | rank 1 |
| substitution | classic | diagonal | 1 (2.18) | none (family-wise p 0.11) | 0.36 | rank 3 |
| substitution | classic | none | 2 (1.21) | none (family-wise p 0.56) | 0.43 | rank 6 |
| span | contrastive | kronecker | 1 (11.5) | planted | 1.00 | rank 1 |

Span drill-down puts the planted wrong sentence on top for 14 of the 14 failing items.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gradian.attribution.index_statistics import index_statistics
from gradian.config import load_config
from gradian.data import load_dataset
from gradian.pipelines.attribute import AttributionOutcome, attribute
from tests.support.scenario import PLANTED_SOURCE, Scenario, build_scenarios, single_thread

pytestmark = pytest.mark.slow

# Tiny models answer in a few tokens; the eval set's wanted answers are bare cities, so `contains` is the metric.
SETTINGS = (
    "evaluation.metric=contains",
    "evaluation.max_new_tokens=48",
    "evaluation.batch_size=32",
    "attribution.cluster_field=source",
    "grads.max_seq_length=256",
    "grads.batch_size=16",
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models on a shared 2-core machine run several times faster on one torch thread."""
    with single_thread():
        yield


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> dict[str, Scenario]:
    """The pre-trained base and both planted fine-tunes (substitution, span), built once."""
    return build_scenarios(tmp_path_factory.mktemp("planted"))


@pytest.fixture(scope="module")
def substitution(scenarios) -> Scenario:
    return scenarios["substitution"]


def run(scenario: Scenario, out: Path, *settings: str, eval_dataset: Path | None | str = "default",
        index_dir: Path | None = None) -> AttributionOutcome:
    """`gradian.attribute` on a scenario; the index is shared by every run on the same inputs unless given."""
    config = load_config(None, (*SETTINGS, *settings))
    return attribute(base_model=str(scenario.base_dir), adapter=scenario.adapter_dir, dataset=scenario.train_path,
                     eval_dataset=scenario.eval_path if eval_dataset == "default" else eval_dataset, out=out,
                     config=config, index_dir=index_dir or scenario.root / "index")


def planted_ranking(report: dict, scenario: Scenario) -> dict:
    """The planted cluster's rank, z and accusation, and recall@k of the planted rows (k = their number)."""
    ranked = report["clusters"]["ranked"]
    cluster = next(c for c in ranked if c["name"] == PLANTED_SOURCE)
    planted = set(scenario.planted_positions)
    k = len(planted)
    top = [row["position"] for row in report["top_examples"]]
    assert len(top) >= k, "attribution.top_k must list at least as many examples as were planted"
    first_hit = next((row["rank"] for row in report["top_examples"] if row["position"] in planted), None)
    return {"cluster_rank": cluster["rank"], "z": round(cluster["z"], 2), "p_adjusted": cluster["p_adjusted"],
            "accused": report["verdict"]["accused_cluster"], "recall_at_k": len(set(top[:k]) & planted) / k,
            "first_planted_example_rank": first_hit}


def own_blame(rows: list[dict], report: dict) -> np.ndarray:
    """scores.csv's blame less what attribution.cluster_prior added to the accused clusters' members (report.json)."""
    added = (report["method"].get("cluster_prior") or {}).get("added", {})
    return np.array([float(row["blame"]) - added.get(row["cluster"], 0.0) for row in rows])


def assert_significant_regression(report: dict) -> None:
    capability = report["capability"]
    assert capability["significant"] and capability["delta"] < 0 and capability["ci_high"] < 0, capability
    assert report["verdict"]["kind"] == "attributed"


@pytest.fixture(scope="module")
def contrastive(substitution, tmp_path_factory) -> AttributionOutcome:
    """The contrastive run on the substitution scenario (it builds the shared index)."""
    return run(substitution, tmp_path_factory.mktemp("contrastive") / "report", "evaluation.query_signal=contrastive")


def test_the_fixture_regression_is_real(scenarios):
    """The base answers every eval item; the fine-tune says the planted wrong city for most poisoned countries."""
    for scenario in scenarios.values():
        stats = scenario.stats
        print(f"\n{scenario.kind}: base right on {stats['base_right']} of 18 eval items, planted city said for "
              f"{len(stats['flipped'])} of {len(scenario.poisoned)} poisoned countries, fine-tune loss "
              f"{stats['finetune_first_loss']:.3f} -> {stats['finetune_last_loss']:.3f}")
        assert stats["base_right"] == 18
        assert len(stats["flipped"]) >= 12
        assert len(scenario.planted_positions) <= 0.1 * sum(1 for _ in scenario.train_path.open())


# Below the recall@14 measured on this fixture (module docstring). The raw margin does worse here than on SmolLM2,
# where it ranks with divergent-token (bench/results/query_signals.md): its two tokens are not weighed equally.
RECALL_FLOOR = {"contrastive": 0.7, "divergence": 0.7, "divergent-token": 0.7, "margin": 0.5}


@pytest.mark.parametrize("signal", ["contrastive", "divergence", "divergent-token", "margin", "auto"])
def test_paired_signals_and_auto_blame_the_planted_cluster_first(substitution, contrastive, signal, tmp_path):
    outcome = contrastive if signal == "contrastive" else run(substitution, tmp_path / "report",
                                                              f"evaluation.query_signal={signal}")
    report = outcome.report
    assert_significant_regression(report)
    effective = "divergent-token" if signal == "auto" else signal
    assert report["query_signal"]["requested"] == signal and report["query_signal"]["effective"] == effective
    ranking = planted_ranking(report, substitution)
    print(f"\n{signal}: {ranking}")
    assert ranking["cluster_rank"] == 1
    assert ranking["accused"] == PLANTED_SOURCE and ranking["p_adjusted"] < 0.05
    assert ranking["recall_at_k"] >= RECALL_FLOOR[effective]
    assert report["verdict"]["headline"] == f"Attributed: cluster `{PLANTED_SOURCE}` is blamed."
    if signal == "auto":  # auto with a text metric is divergent-token: the same blame, the same ranking
        token = run(substitution, tmp_path / "token", "evaluation.query_signal=divergent-token")
        assert report["top_examples"] == token.report["top_examples"]


def scores_csv(out_dir: Path) -> tuple[list[dict], np.ndarray]:
    """scores.csv's rows in dataset order and their per-item raw blame [rows, items]."""
    import csv

    from gradian.report.scores import ITEM_PREFIX

    with (out_dir / "scores.csv").open(newline="", encoding="utf-8") as handle:
        rows = sorted(csv.DictReader(handle), key=lambda row: int(row["position"]))
    items = [name for name in rows[0] if name.startswith(ITEM_PREFIX)]
    return rows, np.array([[float(row[item]) for item in items] for row in rows])


def test_examples_are_ranked_by_ranking_and_clusters_tested_on_aggregation(substitution, contrastive, tmp_path):
    """attribution.ranking orders the examples (smooth_max by default); the clusters, their p-values and the verdict
    come from attribution.aggregation (the mean), so they are the same under either ranking."""
    from gradian.attribution.aggregation import kurtosis_weights, mean_zscore, smooth_max_zscore

    by_mean = run(substitution, tmp_path / "report", "evaluation.query_signal=contrastive", "attribution.ranking=mean")
    for outcome, ranking, combine in ((contrastive, "smooth_max", smooth_max_zscore), (by_mean, "mean", mean_zscore)):
        report = outcome.report
        assert report["method"]["aggregation"] == ranking and report["method"]["clusters"]["aggregation"] == "mean"
        assert len(report.get("causes") or []) <= 1  # one cause: scores.csv's blame is its ranking over every item
        rows, matrix = scores_csv(outcome.out_dir)  # the items weighed by kurtosis, the default either way
        expected = combine(matrix, matrix.mean(axis=0), matrix.std(axis=0), kurtosis_weights(matrix))
        np.testing.assert_allclose(own_blame(rows, report), expected, rtol=1e-6, atol=1e-9)
        top = [row["position"] for row in report["top_examples"]]
        assert top == [int(row["position"]) for row in sorted(rows, key=lambda row: int(row["rank"]))][:len(top)]
    assert contrastive.report["clusters"] == by_mean.report["clusters"]
    tested_on = "clusters and causes tested on the mean of per-item z-scored blame"
    assert tested_on in (contrastive.out_dir / "report.md").read_text(encoding="utf-8")
    assert tested_on not in (by_mean.out_dir / "report.md").read_text(encoding="utf-8")
    assert "(clusters and causes: mean, items weighed uniform)" in (contrastive.out_dir / "report.html").read_text(
        encoding="utf-8")
    assert contrastive.report["verdict"]["accused_cluster"] == by_mean.report["verdict"]["accused_cluster"]
    print(f"\nranked by smooth_max: {planted_ranking(contrastive.report, substitution)}"
          f"\nranked by the mean: {planted_ranking(by_mean.report, substitution)}")


def test_items_weighed_by_kurtosis_change_the_ranking_alone(substitution, contrastive, tmp_path):
    """attribution.item_weights weighs each regressed item in the ranking by the kurtosis of its blame; the clusters,
    their p-values and the per-item blame are those of equal weights, and the report says how the items were weighed."""
    from gradian.attribution.aggregation import kurtosis_weights, smooth_max_zscore

    runs = {weights: run(substitution, tmp_path / weights, "evaluation.query_signal=contrastive",
                         f"attribution.item_weights={weights}") for weights in ("uniform", "kurtosis")}
    matrices = {}
    for weights, outcome in runs.items():
        assert outcome.report["method"]["item_weights"] == weights
        assert len(outcome.report.get("causes") or []) <= 1  # one cause: scores.csv's blame ranks every item
        rows, matrices[weights] = scores_csv(outcome.out_dir)
        share = kurtosis_weights(matrices[weights]) if weights == "kurtosis" else None
        expected = smooth_max_zscore(matrices[weights], matrices[weights].mean(axis=0), matrices[weights].std(axis=0),
                                     share)
        np.testing.assert_allclose(own_blame(rows, outcome.report), expected, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(matrices["uniform"], matrices["kurtosis"])
    assert runs["uniform"].report["clusters"] == runs["kurtosis"].report["clusters"]
    said = "each item weighted by the kurtosis of its blame"
    assert said in (runs["kurtosis"].out_dir / "report.md").read_text(encoding="utf-8")
    assert said not in (runs["uniform"].out_dir / "report.md").read_text(encoding="utf-8")
    print(f"\nequal weights: {planted_ranking(runs['uniform'].report, substitution)}"
          f"\nkurtosis: {planted_ranking(runs['kurtosis'].report, substitution)}")


def item_results(report: dict) -> list:
    """The regressed eval items of a report as the ItemResult rows query_gradients takes."""
    from gradian.evaluation import ItemResult

    return [ItemResult(row["id"], row["prompt"], row["wanted"], row["base_output"], row["finetuned_output"],
                       row["base_score"], row["finetuned_score"])
            for row in report["capability"]["items"] if row["regressed"]]


def answer_gradients(scenario: Scenario, report: dict, answer: str):
    """Per regressed item, the gradient of the loss of one of its answers (wanted, base or fine-tuned output)."""
    import dataclasses

    from gradian.grads.capture import GradientCapture
    from gradian.model.loaded import LoadedModel
    from gradian.query import query_gradients

    config = load_config(None, SETTINGS)
    loaded = LoadedModel.load(scenario.base_dir, scenario.adapter_dir)
    capture = GradientCapture.from_config(loaded, config.grads)
    items = [dataclasses.replace(item, wanted=getattr(item, answer)) for item in item_results(report)]
    prompts = {item.id: ({"role": "user", "content": item.prompt},) for item in items}
    # The classic signal is exactly the gradient of the "wanted" text's loss.
    return query_gradients(capture, loaded.tokenizer, items, prompts, "classic",
                           max_seq_length=config.grads.max_seq_length).vectors


def test_the_accused_clusters_members_are_ranked_with_its_mean_blame_added(substitution, contrastive, tmp_path):
    """attribution.cluster_prior (1 by default) adds to each member of an accused cluster its mean blame; what is
    accused, and every other row's blame, are those of each row ranked by its own blame alone."""
    alone = run(substitution, tmp_path / "alone", "evaluation.query_signal=contrastive", "attribution.cluster_prior=0")
    assert "cluster_prior" not in alone.report["method"]
    assert contrastive.report["clusters"] == alone.report["clusters"]
    assert contrastive.report["verdict"]["accused_cluster"] == PLANTED_SOURCE
    rows, _ = scores_csv(contrastive.out_dir)
    plain, _ = scores_csv(alone.out_dir)
    own = dict(zip((row["id"] for row in plain), own_blame(plain, alone.report), strict=True))
    members = [own[row["id"]] for row in plain if row["cluster"] == PLANTED_SOURCE]
    prior = contrastive.report["method"]["cluster_prior"]
    assert prior["share"] == 1.0 and prior["added"] == {PLANTED_SOURCE: pytest.approx(float(np.mean(members)))}
    for row in rows:
        lift = prior["added"][PLANTED_SOURCE] if row["cluster"] == PLANTED_SOURCE else 0.0
        assert float(row["blame"]) == pytest.approx(own[row["id"]] + lift, rel=1e-9, abs=1e-9)
    ranked = sorted(rows, key=lambda row: int(row["rank"]))
    assert all(float(a["blame"]) >= float(b["blame"]) for a, b in zip(ranked, ranked[1:], strict=False))
    said = f"ranked with 1 x its cluster's mean blame added (`{PLANTED_SOURCE}` +"
    assert said in (contrastive.out_dir / "report.md").read_text(encoding="utf-8")
    assert f"mean blame added ({PLANTED_SOURCE} +" in (contrastive.out_dir / "report.html").read_text(encoding="utf-8")
    assert "mean blame added" not in (alone.out_dir / "report.md").read_text(encoding="utf-8")
    print(f"\neach row's own blame: {planted_ranking(alone.report, substitution)}"
          f"\nwith the cluster prior: {planted_ranking(contrastive.report, substitution)}")


def test_the_classic_signal_loses_the_substitution(substitution, contrastive, tmp_path):
    """The spec: for a substitution failure the classic query (gradient of the wanted answer alone) is dominated by
    answer format and can invert the diagnosis. Here the wanted answers are bare cities and the model answers in
    sentences.

    The mechanism holds on this fixture: the wanted answer's gradient is about 16x (5-32x) larger than the gradient
    of what the fine-tuned model says, and nearly orthogonal (cosine ~0.01) to the base model's own correct
    sentence, the direction that separates right from wrong. The outcome is a lost signal: the planted cluster's z
    stays positive under the diagonal preconditioner (2.2 against 10.6 for the contrastive query) and nothing is
    accused; without one the planted cluster falls to second (z 1.2) and nothing is accused either; recall@k falls
    from 0.93 to 0.43 or less. The assertions hold that the planted cluster is never accused and its signal is
    lost, not a sign flip this fixture does not produce.
    """
    wanted = answer_gradients(substitution, contrastive.report, "wanted")
    generated = answer_gradients(substitution, contrastive.report, "finetuned_output")
    base = answer_gradients(substitution, contrastive.report, "base_output")
    norm = np.linalg.norm
    ratio = norm(wanted, axis=1) / norm(generated, axis=1)
    cosine = (wanted * base).sum(axis=1) / (norm(wanted, axis=1) * norm(base, axis=1))
    print(f"\n|grad(wanted)| / |grad(generated)|: median {np.median(ratio):.1f} (range {ratio.min():.1f}-"
          f"{ratio.max():.1f}); cosine(grad(wanted), grad(base output)): median {np.median(cosine):.3f}")
    assert np.median(ratio) > 5 and np.median(np.abs(cosine)) < 0.2

    reference = planted_ranking(contrastive.report, substitution)
    measured = {}
    for preconditioner in ("diagonal", "none"):
        outcome = run(substitution, tmp_path / preconditioner, "evaluation.query_signal=classic",
                      f"attribution.preconditioner={preconditioner}")
        report = outcome.report
        assert_significant_regression(report)
        causes = len(report.get("causes") or [])  # split into causes here without a preconditioner: each one's blame saved
        header = (outcome.out_dir / "scores.csv").read_text(encoding="utf-8").split("\n", 1)[0].split(",")
        assert [name for name in header if name.startswith("blame:cause-")] == (
            [f"blame:cause-{number}" for number in range(1, causes + 1)] if causes > 1 else [])
        assert report["query_signal"]["effective"] == "classic"
        measured[preconditioner] = planted_ranking(report, substitution)
        print(f"classic, preconditioner {preconditioner}: {measured[preconditioner]}")
    print(f"contrastive, the default preconditioner: {reference}")
    for ranking in measured.values():
        assert ranking["accused"] != PLANTED_SOURCE, "classic found the planted cluster on this fixture"
        assert ranking["z"] < reference["z"] / 3
        assert ranking["recall_at_k"] <= reference["recall_at_k"] - 0.3


def test_an_insignificant_delta_refuses(substitution, tmp_path):
    """Eval items the poison does not touch: nothing regressed, so no index is built and the report says why."""
    index_dir = tmp_path / "index"
    outcome = run(substitution, tmp_path / "report", eval_dataset=substitution.unaffected_eval_path,
                  index_dir=index_dir)
    report = outcome.report
    assert report["verdict"]["kind"] == "not_significant"
    assert report["verdict"]["headline"] == "Not attributed: the capability delta is not significant."
    assert report["capability"]["delta"] == 0 and not report["capability"]["significant"]
    assert report["capability"]["ci_low"] <= 0 <= report["capability"]["ci_high"]
    assert outcome.index is None and not index_dir.exists()
    assert report["top_examples"] == [] and report["clusters"] is None and report["method"] is None
    assert "index" not in outcome.timings
    markdown = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    for advice in ("The confidence interval includes zero", "Usually the eval set is too small. Widen it.",
                   "an exact_match metric on free-form answers will measure formatting rather than correctness",
                   "Do not reach for evaluation.require_significant: false"):
        assert advice in markdown
    assert json.loads((tmp_path / "report" / "report.json").read_text()) == report


def test_no_eval_set_is_flagged_as_not_a_diagnosis(substitution, contrastive, tmp_path):
    outcome = run(substitution, tmp_path / "report", eval_dataset=None)
    report = outcome.report
    assert report["verdict"]["kind"] == "no_capability_target"
    assert "attribution.no_capability_target" in report["verdict"]["headline"]
    assert report["capability"] is None
    assert report["warnings"][0]["code"] == "attribution.no_capability_target"
    assert "It runs, but it is not a diagnosis." in report["warnings"][0]["message"]
    # The stand-in target is the first training examples' own loss gradients, scored on the same cached index.
    fallback = load_config(None, SETTINGS).attribution.fallback_examples
    assert report["method"]["query_items"] == list(load_dataset(substitution.train_path).ids[:fallback])
    assert outcome.index.index_id == contrastive.index.index_id and outcome.index.reused
    assert report["method"]["aggregation"] == "smooth_max" and report["method"]["clusters"]["aggregation"] == "mean"
    markdown = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "attribution.no_capability_target" in markdown and "not a diagnosis" in markdown


def test_spans_localize_the_planted_wrong_sentence(scenarios, tmp_path):
    """One wrong sentence inside long, otherwise-correct entries: the planted cluster still ranks first, and the
    sentence-level blame of a planted entry, against the query of the one eval item it broke, puts the wrong sentence
    on top (the spec's drill-down). The wrong sentence sits at every position 0-4 across the planted rows.

    Measured restricted: on this tiny random model it localizes (14 of 14 items, the report's drill 5 of 5) where the
    shipped ``alone`` does not (8 of 14, the drill 1 of 5); ``alone`` is the default from SmolLM2-135M span cases,
    where it leads (bench/results/spans_checkpoints.md)."""
    from gradian.attribution.preconditioners import from_config
    from gradian.grads.capture import GradientCapture
    from gradian.model.loaded import LoadedModel
    from gradian.query import query_gradients, span_blames

    scenario = scenarios["span"]
    outcome = run(scenario, tmp_path / "report", "evaluation.query_signal=contrastive",
                  "attribution.span_blame=restricted")
    report = outcome.report
    assert_significant_regression(report)
    ranking = planted_ranking(report, scenario)
    print(f"\nspan scenario, contrastive: {ranking}")
    assert ranking["cluster_rank"] == 1 and ranking["accused"] == PLANTED_SOURCE

    config = load_config(None, SETTINGS)
    loaded = LoadedModel.load(scenario.base_dir, scenario.adapter_dir)
    capture = GradientCapture.from_config(loaded, config.grads)
    preconditioner = from_config(config.attribution, index_statistics(outcome.index))
    train = load_dataset(scenario.train_path)
    planted_by_country = {train[p].prompt_text.split()[-2]: p for p in scenario.planted_positions}
    results = []
    for item in item_results(report):
        prompts = {item.id: ({"role": "user", "content": item.prompt},)}
        position = planted_by_country[item.prompt.split()[-2]]
        query = query_gradients(capture, loaded.tokenizer, [item], prompts, "contrastive",
                                max_seq_length=config.grads.max_seq_length)
        spans = span_blames(capture, loaded.tokenizer, train[position], preconditioner.apply(query.vectors)[0],
                            max_seq_length=config.grads.max_seq_length, measure="restricted")
        planted_sentence = scenario.planted_sentences[position]
        where = [span.text for span in spans].index(planted_sentence)
        top = max(spans, key=lambda span: span.blame)
        results.append((where, top.text == planted_sentence))
    hits = sum(hit for _, hit in results)
    print(f"span top-1 localization: {hits} of {len(results)} failing items; planted sentence positions "
          f"{sorted(where for where, _ in results)}")
    assert len(results) >= 12
    assert hits / len(results) >= 0.85
    assert len({where for where, hit in results if hit}) >= 4  # found at (nearly) every position, not just first

    # The report's own drill-down: the top blamed examples, each against the one item that blames it most.
    drilled = [d for d in report["spans"] if d["position"] in scenario.planted_sentences]
    assert drilled, "no planted example among the drilled top examples"
    on_target = [d["spans"][d["top_span"]]["text"] == scenario.planted_sentences[d["position"]] for d in drilled]
    print(f"report drill-down: planted sentence on top in {sum(on_target)} of {len(drilled)} drilled planted rows")
    assert sum(on_target) >= len(drilled) - 1


def test_reports_are_deterministic(substitution, contrastive, tmp_path):
    """Two runs on the same inputs, each building its own index, write the same files except the timestamp."""
    second = run(substitution, tmp_path / "report", "evaluation.query_signal=contrastive",
                 index_dir=tmp_path / "index")
    assert not second.index.reused and second.index.index_id == contrastive.index.index_id
    first_dir, second_dir = contrastive.out_dir, second.out_dir
    one = json.loads((first_dir / "report.json").read_text())
    two = json.loads((second_dir / "report.json").read_text())
    assert one.pop("generated_at") and two.pop("generated_at")
    assert one == two

    def without_timestamp(path: Path) -> list[str]:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if not line.startswith("Generated at ")]

    assert without_timestamp(first_dir / "report.md") == without_timestamp(second_dir / "report.md")
    assert sorted(p.name for p in first_dir.iterdir()) == sorted(p.name for p in second_dir.iterdir())
    for plot in first_dir.glob("*.png"):
        assert plot.read_bytes() == (second_dir / plot.name).read_bytes()
    # The two independently built indexes hold byte-identical gradients.
    shards = sorted(contrastive.index.path.glob("shard-*.npy"))
    assert shards
    for shard in shards:
        assert shard.read_bytes() == (second.index.path / shard.name).read_bytes()


def test_the_cli_prints_the_verdict_and_the_report_path(substitution, contrastive, capsys, tmp_path):
    from gradian.cli.app import main

    out = tmp_path / "report"
    argv = ["attribute", "--base-model", str(substitution.base_dir), "--adapter", str(substitution.adapter_dir),
            "--dataset", str(substitution.train_path), "--eval-dataset", str(substitution.eval_path),
            "--eval-format", "messages", "--index", str(substitution.root / "index"), "--out", str(out)]
    for setting in (*SETTINGS, "evaluation.query_signal=contrastive"):
        argv += ["--set", setting]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"Attributed: cluster `{PLANTED_SOURCE}` is blamed." in captured.out
    assert f"accused cluster: {PLANTED_SOURCE} (rank 1 of 6" in captured.out
    assert "capability (contains): base 1.000 -> fine-tuned 0.222" in captured.out
    # the next step names this report's directory, as a command to paste
    assert f"Next: check the blamed cluster by retraining without it against a random drop of the same size " \
           f"(gradian verify --report {out} --out {tmp_path / 'verify'})" in captured.out
    assert f"report: {out / 'report.md'}" in captured.out
    report = json.loads((out / "report.json").read_text())
    assert report["provenance"]["command"].startswith("gradian attribute --base-model")
    assert report["top_examples"] == contrastive.report["top_examples"]
