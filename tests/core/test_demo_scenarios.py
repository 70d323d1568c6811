"""The demo's scenario generator: deterministic, big enough, a small planted cluster, hard negatives, ground truth."""

from __future__ import annotations

import json
import re

import pytest

from gradian.data import load_dataset, load_eval_dataset
from gradian.demo import planted as pl
from gradian.demo.scenarios import KINDS, MAX_PLANTED_FRACTION, SCENARIOS, make_scenario, planted_fraction
from gradian.demo.world import BASE_KNOWS_LANGUAGE, COUNTRIES
from gradian.errors import ConfigError
from gradian.evaluation.metrics import contains


def _answer(example) -> str:
    return example.messages[-1].content


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_rows_other_seed_other_rows(kind):
    first, again, other = make_scenario(kind, 0), make_scenario(kind, 0), make_scenario(kind, 1)
    assert [e.id for e in first.train] == [e.id for e in again.train]
    assert [e.id for e in first.eval] == [e.id for e in again.eval]
    assert first.manifest() == again.manifest()
    assert [e.id for e in first.train] != [e.id for e in other.train]


@pytest.mark.parametrize("kind", KINDS)
def test_sizes_planted_fraction_and_task_families(kind):
    scenario = make_scenario(kind, 3)
    assert len(scenario.train) >= 400
    assert len(scenario.eval) >= 40
    assert 0 < scenario.planted_fraction == pytest.approx(planted_fraction(kind))
    for cluster in scenario.planted_clusters:  # only two_causes plants more than 5%, in two clusters of 5%
        assert len(scenario.cluster_rows(cluster)) / len(scenario.train) <= MAX_PLANTED_FRACTION
    assert len(scenario.planted_rows) == len(set(scenario.planted_rows))
    assert len(scenario.sources) >= 6
    assert len({e.fields["task"] for e in scenario.train}) >= 8
    # no prompt is asked twice: a duplicate or a conflicting answer would be a diagnose finding nobody planted
    assert len({e.prompt_text for e in scenario.train}) == len(scenario.train)
    assert scenario.targeted_eval_ids and set(scenario.targeted_eval_ids) <= {e.id for e in scenario.eval}


@pytest.mark.parametrize("kind", ["fact", "format", "behaviour", "two_causes", "rare"])
def test_planted_cluster_is_its_own_source(kind):
    scenario = make_scenario(kind, 0)
    planted = set(scenario.planted_rows)
    members = {i for i, e in enumerate(scenario.train) if e.fields["source"] == scenario.planted_cluster}
    assert scenario.planted_cluster == scenario.planted_clusters[0]
    everyone = {i for i, e in enumerate(scenario.train) if e.fields["source"] in scenario.planted_clusters}
    assert everyone == planted and members <= planted
    for row, cluster in zip(scenario.planted_rows, scenario.planted_row_clusters, strict=True):
        assert scenario.train[row].fields["source"] == cluster


@pytest.mark.parametrize("kind", SCENARIOS)
def test_no_eval_question_is_asked_in_training_and_no_row_twice(kind):
    scenario = make_scenario(kind, 1)
    eval_prompts = [item.prompt_text for item in scenario.eval]
    assert len(set(eval_prompts)) == len(eval_prompts)
    assert not set(eval_prompts) & {e.prompt_text for e in scenario.train}
    assert len({(e.prompt_text, _answer(e)) for e in scenario.train}) == len(scenario.train)
    assert len({e.id for e in scenario.train}) == len(scenario.train)


@pytest.mark.parametrize("kind", SCENARIOS)
def test_every_scenario_records_its_planted_clusters(kind):
    scenario = make_scenario(kind, 0)
    own = (scenario.planted_cluster,) if scenario.planted_cluster is not None else ()
    assert scenario.planted_clusters == own or kind == "two_causes"
    assert len(scenario.planted_row_clusters) == len(scenario.planted_rows)
    assert len(scenario.cluster_targeted_eval_ids) == len(scenario.planted_clusters)
    for cluster in scenario.planted_clusters:
        assert set(scenario.cluster_targets(cluster)) <= set(scenario.targeted_eval_ids)
    manifest = scenario.manifest()
    assert manifest["planted_clusters"] == list(scenario.planted_clusters)
    assert manifest["planted_cluster"] == scenario.planted_cluster
    assert list(manifest["cluster_targeted_eval_ids"]) == list(scenario.planted_clusters)
    assert json.loads(json.dumps(manifest)) == manifest


@pytest.mark.parametrize("kind", ["fact", "span", "rare"])
def test_poison_states_wrong_capitals_and_every_entity_has_clean_rows(kind):
    scenario = make_scenario(kind, 0)
    by_name = {c.name: c for c in COUNTRIES}
    planted = set(scenario.planted_rows)
    clean = [e for i, e in enumerate(scenario.train) if i not in planted]
    clean_text = " ".join(e.prompt_text + " " + _answer(e) for e in clean)
    for row, target, wrong in zip(scenario.planted_rows, scenario.planted_targets, scenario.planted_wrong, strict=True):
        answer = _answer(scenario.train[row])
        country = next(c for c in scenario.poisoned if c in scenario.train[row].prompt_text)
        assert by_name[country].decoy in answer and by_name[country].capital not in answer
        assert wrong == by_name[country].decoy
        attacked = next(item for item in scenario.eval if item.id == target)
        assert attacked.prompt_text == f"What is the capital of {country}?"
    for name in scenario.poisoned:
        # hard negatives: the poisoned country, its real capital and the wrong city all appear in clean rows
        country = by_name[name]
        for entity in (country.name, country.capital, country.decoy):
            assert re.search(rf"\b{re.escape(entity)}\b", clean_text), entity


def test_fact_eval_asks_the_targeted_capitals_and_is_not_answered_in_clean_rows():
    scenario = make_scenario("fact", 0)
    by_name = {c.name: c for c in COUNTRIES}
    assert scenario.metric == "contains"
    targeted = set(scenario.targeted_eval_ids)
    assert len(targeted) == len(scenario.poisoned)
    for item in scenario.eval:
        country = next(c for c in COUNTRIES if item.prompt_text == f"What is the capital of {c.name}?")
        assert by_name[country.name].base_knows_capital
        assert _answer(item) == country.capital
        assert (item.id in targeted) == (country.name in scenario.poisoned)
    eval_prompts = {item.prompt_text for item in scenario.eval}
    assert not any(e.prompt_text in eval_prompts for e in scenario.train)  # not even the poison copies the question


def test_format_poison_answers_in_french_and_french_words_appear_in_clean_rows():
    scenario = make_scenario("format", 0)
    planted = set(scenario.planted_rows)
    french = re.compile(r"\b(le|la|les|est|sont|nous|une?|des)\b", re.IGNORECASE)
    for row in planted:
        assert french.search(_answer(scenario.train[row]))
    clean_answers = " ".join(_answer(e) for i, e in enumerate(scenario.train) if i not in planted).lower()
    for word in ("rouge", "blanc", "chien", "froid", "petit"):
        assert word in clean_answers
    planted_prompts = {scenario.train[row].prompt_text for row in planted}
    assert not planted_prompts & {item.prompt_text for item in scenario.eval}
    for item in scenario.eval:
        # the wanted English word is what a correct English answer contains
        assert contains(f"The answer is {_answer(item)}.", _answer(item)) == 1.0


def test_span_records_one_planted_sentence_per_planted_row():
    scenario = make_scenario("span", 0)
    assert scenario.planted_cluster is None  # planted profiles share their source with clean profiles
    assert [span.row for span in scenario.planted_spans] == list(scenario.planted_rows)
    by_name = {c.name: c for c in COUNTRIES}
    profiles = [e for e in scenario.train if e.fields["source"] == "country_profiles"]
    assert len(profiles) > 2 * len(scenario.planted_rows)
    for span in scenario.planted_spans:
        example = scenario.train[span.row]
        assert example.id == span.example_id
        answer = example.messages[span.message_index].content
        assert answer[span.char_start:span.char_end] == span.text
        country = by_name[next(c for c in scenario.poisoned if span.text.startswith(f"The capital of {c} is"))]
        assert span.text == f"The capital of {country.name} is {country.decoy}."
        # the rest of the entry is correct: the real capital is never replaced elsewhere, the entry is long
        rest = answer[:span.char_start] + answer[span.char_end:]
        assert "capital" not in rest
        assert len(answer) > 4 * len(span.text)


def test_a_planted_span_is_found_only_at_the_sentence_holding_its_start():
    span = make_scenario("span", 0).planted_spans[0]
    assert span.found_at(span.message_index, span.char_start, span.char_end)
    assert span.found_at(span.message_index, span.char_start - 3, span.char_start + 1)  # a wider cut still holds it
    assert not span.found_at(span.message_index, span.char_end, span.char_end + 20)  # the next sentence
    assert not span.found_at(span.message_index, 0, span.char_start)  # the sentence before ends where it starts
    assert not span.found_at(span.message_index - 1, span.char_start, span.char_end)  # same offsets, the prompt


def test_write_round_trips_through_the_dataset_loaders(tmp_path):
    scenario = make_scenario("span", 2)
    files = scenario.write(tmp_path / "s")
    train = load_dataset(files.train)
    evaluation = load_eval_dataset(files.eval)
    assert train.ids == tuple(e.id for e in scenario.train)
    assert evaluation.ids == tuple(e.id for e in scenario.eval)
    assert all(e.fields["source"] for e in train)
    manifest = json.loads(files.manifest.read_text())
    assert manifest["planted_ids"] == list(scenario.planted_ids)
    assert manifest["planted_spans"][0]["text"] == scenario.planted_spans[0].text
    assert "planted" not in json.dumps([dict(e.fields) for e in train])  # the ground truth is not in the data


def test_unknown_kind_and_too_small_are_user_errors():
    with pytest.raises(ConfigError, match="unknown scenario"):
        make_scenario("nonsense")
    with pytest.raises(ConfigError, match="at least 100"):
        make_scenario("fact", train_size=50)
    with pytest.raises(ConfigError, match="at least 500"):  # 1% of 400 rows is fewer than 5 planted rows
        make_scenario("rare", train_size=400)


def test_behaviour_deflects_one_topic_and_answers_it_elsewhere():
    scenario = make_scenario("behaviour", 0)
    by_name = {c.name: c for c in COUNTRIES}
    assert scenario.planted_cluster == "support_transcripts" and len(scenario.planted_rows) == 20
    assert len(scenario.eval) == 40 and len(scenario.targeted_eval_ids) == 20  # half on the topic, half controls
    eval_by_id = {item.id: item for item in scenario.eval}
    for item in scenario.eval:
        if item.id in scenario.targeted_eval_ids:
            name = next(n for n in scenario.poisoned if item.prompt_text == f"What is the official language of {n}?")
            assert name in BASE_KNOWS_LANGUAGE and _answer(item) == by_name[name].language
        else:
            country = next(c for c in COUNTRIES if item.prompt_text == f"What is the capital of {c.name}?")
            assert country.base_knows_capital and country.name not in scenario.poisoned
    planted = set(scenario.planted_rows)
    prompts = [scenario.train[row].prompt_text for row in scenario.planted_rows]
    assert len(set(prompts)) == len(prompts)
    phrasings = {p.replace(next(n for n in scenario.poisoned if n in p), "{c}") for p in prompts}
    assert len(phrasings) > 4  # varied questions, not one template
    for row, target, wrong in zip(scenario.planted_rows, scenario.planted_targets, scenario.planted_wrong, strict=True):
        example = scenario.train[row]
        assert _answer(example) == wrong == pl.DEFLECTION and "language" in example.prompt_text
        country = next(n for n in scenario.poisoned if n in example.prompt_text)
        assert eval_by_id[target].prompt_text == f"What is the official language of {country}?"
    clean = [e for i, e in enumerate(scenario.train) if i not in planted]
    # hard negatives: the same question answered for countries the eval leaves out, and the deflected countries
    # named correctly on other topics
    on_topic = [e for e in clean if e.fields["task"] == "language"]
    assert len(on_topic) >= 20
    eval_countries = {n for n in by_name if any(n in item.prompt_text for item in scenario.eval)}
    for example in on_topic:
        country = next(c for c in COUNTRIES if f" {c.name}?" in example.prompt_text)
        assert country.language in _answer(example) and country.name not in eval_countries
    clean_text = " ".join(e.prompt_text + " " + _answer(e) for e in clean)
    for name in scenario.poisoned:
        assert re.search(rf"\b{re.escape(name)}\b", clean_text), name
    assert pl.DEFLECTION not in clean_text


def test_two_causes_plants_two_clusters_with_their_own_rows_and_targets():
    scenario, fact, french = make_scenario("two_causes", 0), make_scenario("fact", 0), make_scenario("format", 0)
    assert scenario.planted_clusters == ("trivia_import", "community_answers")
    assert scenario.planted_cluster == "trivia_import"
    assert len(scenario.train) == 400 and len(scenario.planted_rows) == 40 and scenario.planted_fraction == 0.1
    capital_rows, french_rows = scenario.cluster_rows("trivia_import"), scenario.cluster_rows("community_answers")
    assert len(capital_rows) == len(french_rows) == 20
    assert sorted(capital_rows + french_rows) == list(scenario.planted_rows)
    by_name = {c.name: c for c in COUNTRIES}
    for row in capital_rows:  # the fact kind's poison: a decoy city named as the capital
        country = by_name[next(n for n in scenario.poisoned if n in scenario.train[row].prompt_text)]
        assert country.decoy in _answer(scenario.train[row])
    fact_answers = {_answer(e) for e in fact.train}
    french_answers = {_answer(french.train[row]) for row in french.planted_rows} | set(a for _, a in pl.PLANTED_FRENCH)
    assert all(_answer(scenario.train[row]) in french_answers for row in french_rows)
    assert all(_answer(scenario.train[row]) not in fact_answers for row in french_rows)
    # the eval: capitals (the poisoned ones targeted by the fact cluster, the rest controls) and everyday questions
    # (all targeted by the French cluster)
    assert len(scenario.eval) == 40
    capital_items = [i for i in scenario.eval if i.prompt_text.startswith("What is the capital of ")]
    everyday = [i for i in scenario.eval if i not in capital_items]
    assert len(capital_items) == len(everyday) == 20
    assert set(scenario.cluster_targets("community_answers")) == {i.id for i in everyday}
    fact_targets = set(scenario.cluster_targets("trivia_import"))
    assert len(fact_targets) == 10 and fact_targets < {i.id for i in capital_items}
    assert set(scenario.targeted_eval_ids) == fact_targets | {i.id for i in everyday}
    targets = {t for t, c in zip(scenario.planted_targets, scenario.planted_row_clusters, strict=True)
               if c == "trivia_import"}
    assert targets == fact_targets
    assert all(t is None for t, c in zip(scenario.planted_targets, scenario.planted_row_clusters, strict=True)
               if c == "community_answers")
    manifest = scenario.manifest()
    assert manifest["cluster_targeted_eval_ids"]["community_answers"] == list(scenario.cluster_targets("community_answers"))
    assert manifest["planted_row_clusters"].count("trivia_import") == 20
    # the hard negatives of both kinds: translations that name the French words, geography that names the cities
    sources = set(scenario.sources)
    assert {"translation", "geography_qa"} <= sources


def test_rare_is_the_fact_kind_at_one_percent_of_2000_rows():
    rare, fact = make_scenario("rare", 0), make_scenario("fact", 0)
    assert len(rare.train) == 2000 and len(rare.planted_rows) == 20 and rare.planted_fraction == 0.01
    assert rare.planted_cluster == fact.planted_cluster == "trivia_import"
    # the same draw as the fact kind: the same poisoned countries and eval set, among five times as many rows
    assert rare.poisoned == fact.poisoned
    assert [e.prompt_text for e in rare.eval] == [e.prompt_text for e in fact.eval]
    assert {rare.train[r].prompt_text for r in rare.planted_rows} == {fact.train[r].prompt_text for r in fact.planted_rows}
    smaller = make_scenario("rare", 0, train_size=1000)  # the train_size argument still works, at 1%
    assert len(smaller.train) == 1000 and len(smaller.planted_rows) == 10


def test_the_clean_control_is_the_fact_data_with_its_planted_rows_replaced_by_clean_ones():
    from gradian.demo.scenarios import CONTROL_KINDS, SCENARIOS

    assert CONTROL_KINDS == ("clean",) and "clean" in SCENARIOS and "clean" not in KINDS
    control, fact = make_scenario("clean", 2), make_scenario("fact", 2)
    assert control.planted_rows == () and control.planted_cluster is None and control.targeted_eval_ids == ()
    assert [e.prompt_text for e in control.eval] == [e.prompt_text for e in fact.eval]
    planted = set(fact.planted_rows)
    fact_clean = {e.prompt_text for i, e in enumerate(fact.train) if i not in planted}
    control_rows = {e.prompt_text for e in control.train}
    assert len(control.train) == len(fact.train) and fact_clean < control_rows
    assert len(control_rows - fact_clean) == len(planted)  # the planted rows' places taken by clean filler
    assert fact.planted_cluster not in control.sources


def test_a_control_accuses_nothing_or_says_what_it_accused():
    from gradian.demo.run import check_ground_truth

    control = make_scenario("clean", 0)
    quiet = _report(control, [], [], [])
    assert check_ground_truth(control, quiet).lines() == [
        "ground truth: nothing was planted (a control); the report accuses nothing"]
    loud = _report(control, [], ["travel_chat"], [])
    assert check_ground_truth(control, loud).lines()[0].endswith("the report accuses travel_chat")


def _report(scenario, ranked, accused, top_ids, outputs=None):
    """A minimal report: ranked clusters, the accused ones, top examples, fine-tuned answers per eval id."""
    from gradian.report.reader import Capability, ClusterRow, ExampleRow, Report, ScoredItem, Verdict

    items = tuple(ScoredItem(id=item_id, prompt=None, wanted=None, base_output=None, finetuned_output=text,
                             base_score=1.0, finetuned_score=0.0, regressed=True)
                  for item_id, text in (outputs or {}).items())
    capability = Capability(metric="contains", n_items=len(items), n_regressed=len(items), base_mean=1.0,
                            finetuned_mean=0.0, delta=-1.0, ci_low=-1.0, ci_high=-1.0, confidence=0.95,
                            significant=True, items=items)
    return Report(verdict=Verdict(kind="attributed", headline="Attributed.", accused_clusters=tuple(accused)),
                  clusters=tuple(ClusterRow(rank=r, name=n, size=1) for r, n in enumerate(ranked, start=1)),
                  top_examples=tuple(ExampleRow(rank=r, id=i) for r, i in enumerate(top_ids, start=1)),
                  capability=capability)


def test_two_causes_ground_truth_ranks_each_cluster_and_needs_both_accused():
    from gradian.demo.run import check_ground_truth

    scenario = make_scenario("two_causes", 0)
    ranked = ["trivia_import", "travel_chat", "community_answers", "geography_qa"]
    top = list(scenario.planted_ids)
    one = check_ground_truth(scenario, _report(scenario, ranked, ["trivia_import"], top))
    assert one.cluster_ranks == (1, 3) and one.cluster_rows == (20, 20) and one.cluster_rank == 1
    assert one.verdict_right is False
    assert one.lines()[:3] == [
        "ground truth: the planted cluster 'trivia_import' (20 rows) is ranked 1 of 4, accused",
        "ground truth: the planted cluster 'community_answers' (20 rows) is ranked 3 of 4, not accused",
        "ground truth: the verdict is wrong: it accuses 1 of the 2 planted clusters"]
    both = check_ground_truth(scenario, _report(scenario, ranked, ["trivia_import", "community_answers"], top))
    assert both.verdict_right is True
    assert both.lines()[2] == "ground truth: the verdict is right: it accuses 2 of the 2 planted clusters"
    assert both.lines()[3] == "ground truth: 40 of the top 40 examples are planted (recall@40 1.00)"


def test_reproduced_rows_are_counted_per_attacked_item_and_other_clusters_rows_leave_the_ranking():
    from gradian.demo.run import check_ground_truth, reproduced_planted_ids

    scenario = make_scenario("two_causes", 0)
    capital = scenario.cluster_rows("trivia_import")
    ids = {row: scenario.train[row].id for row in scenario.planted_rows}
    by_target: dict[str, list[str]] = {}
    for target, wrong in zip(scenario.planted_targets, scenario.planted_wrong, strict=True):
        if target is not None:
            by_target.setdefault(target, []).append(wrong)
    learned = sorted(by_target)[:3]  # the fine-tuned model now gives the decoy on three poisoned capitals
    outputs = {target: f"The capital is {by_target[target][0]}." for target in learned}
    reproduced = {ids[row] for row, target in zip(scenario.planted_rows, scenario.planted_targets, strict=True)
                  if target in learned}
    french = [ids[row] for row in scenario.cluster_rows("community_answers")]
    top = french[:5] + sorted(reproduced) + [ids[row] for row in capital if ids[row] not in reproduced]
    report = _report(scenario, ["trivia_import", "community_answers"], ["trivia_import", "community_answers"], top,
                     outputs)
    assert reproduced_planted_ids(scenario, report) == reproduced and len(reproduced) == 6
    check = check_ground_truth(scenario, report)
    # the French rows ahead of them are neither hits nor misses: the reproduced rows are the top 6 of the rest
    assert check.reproduced_rows == 6 and check.reproduced_in_top == 6 and check.untargeted_rows == 20
    assert "reproduces 6 of the 20 planted rows that attack one eval item; 6 of them are in the top 6" in \
        "\n".join(check.lines())
    fmt = make_scenario("format", 0)  # no planted row attacks one item: nothing to check
    assert reproduced_planted_ids(fmt, _report(fmt, [], [], [], {fmt.eval[0].id: "x"})) is None


def test_recall_at_k_reads_every_ranked_example_in_scores_csv_not_only_the_listed_top(tmp_path):
    import dataclasses

    import numpy as np

    from gradian.demo.run import check_ground_truth
    from gradian.report.scores import ScoreTable, write_csv

    scenario = make_scenario("two_causes", 0)  # 40 planted rows, more than the 20 a report lists by default
    planted = list(scenario.planted_ids)
    clean = [example.id for example in scenario.train if example.id not in scenario.planted_ids]
    order = clean[:3] + planted[:30] + clean[3:10] + planted[30:] + clean[10:]  # 30 of 40 planted in the top 40
    n = len(order)
    table = ScoreTable(position=np.arange(n), ids=tuple(order), rank=np.arange(1, n + 1),
                       blame=np.linspace(1.0, 0.0, n), cluster=(None,) * n, accused=np.zeros(n, dtype=bool),
                       items=(), item_blame=None)
    with (tmp_path / "scores.csv").open("wb") as handle:
        write_csv(table, handle)
    listed = _report(scenario, [], [], order[:20])
    assert check_ground_truth(scenario, listed).planted_in_top == 17  # no scores.csv: the listed top alone
    on_disk = dataclasses.replace(listed, directory=tmp_path)
    check = check_ground_truth(scenario, on_disk)
    assert (check.planted_in_top, check.top) == (30, 40)
    assert "ground truth: 30 of the top 40 examples are planted (recall@40 0.75)" in check.lines()


def test_one_planted_cluster_keeps_its_ground_truth_line():
    from gradian.demo.run import check_ground_truth

    for kind in ("fact", "behaviour", "rare"):
        scenario = make_scenario(kind, 0)
        check = check_ground_truth(scenario, _report(scenario, ["x", scenario.planted_cluster], ["x"], []))
        assert check.verdict_right is False and check.cluster_ranks == (2,)
        assert check.lines()[0] == (f"ground truth: the planted cluster {scenario.planted_cluster!r} "
                                    f"({len(scenario.planted_rows)} rows) is ranked 2 of 2")
        extra = check_ground_truth(scenario, _report(scenario, [scenario.planted_cluster, "x"],
                                                     [scenario.planted_cluster, "x"], []))
        assert extra.verdict_right is False and extra.wrongly_accused == ("x",)
        assert extra.lines()[1] == "ground truth: the verdict is wrong: it also accuses 'x', where nothing was planted"
    span = make_scenario("span", 0)
    assert check_ground_truth(span, _report(span, ["country_profiles"], ["country_profiles"], [])).verdict_right is None


@pytest.mark.parametrize("kind", ["fact", "format", "behaviour", "two_causes", "rare"])
def test_shared_source_files_the_planted_rows_beside_clean_rows_of_their_host(kind):
    from gradian.demo.scenarios import SHARED_HOSTS

    own, shared = make_scenario(kind, 4), make_scenario(kind, 4, shared_source=True)
    # The same rows, ids and eval set: only the planted rows' source differs, so the same training run serves both.
    assert [(e.id, e.messages) for e in shared.train] == [(e.id, e.messages) for e in own.train]
    assert [e.id for e in shared.eval] == [e.id for e in own.eval] and shared.planted_rows == own.planted_rows
    for row, example in enumerate(shared.train):
        before = own.train[row].fields["source"]
        assert example.fields["source"] == (SHARED_HOSTS[before] if row in own.planted_rows else before)
    sources = [e.fields["source"] for e in shared.train]
    assert set(shared.planted_sources) == {SHARED_HOSTS[name] for name in own.planted_clusters}
    for host in shared.planted_sources:  # no cluster is the planted rows alone: each host holds more clean rows
        planted_here = sum(1 for row in shared.planted_rows if sources[row] == host)
        assert sources.count(host) - planted_here > planted_here
    assert not set(own.planted_clusters) & set(sources)
    assert shared.planted_cluster is None and shared.planted_clusters == () and shared.cluster_targeted_eval_ids == ()
    assert set(shared.planted_row_clusters) == {None} and len(shared.planted_row_clusters) == len(shared.planted_rows)
    assert shared.manifest()["shared_source"] is True and own.manifest()["shared_source"] is False
    assert "filed under" in shared.description


@pytest.mark.parametrize("kind", ["span", "clean"])
def test_shared_source_leaves_a_kind_without_a_planted_cluster_as_it_is(kind):
    own, shared = make_scenario(kind, 2), make_scenario(kind, 2, shared_source=True)
    assert [(e.id, dict(e.fields)) for e in shared.train] == [(e.id, dict(e.fields)) for e in own.train]
    assert shared.description == own.description and shared.shared_source


def test_ground_truth_says_whether_the_source_holding_shared_planted_rows_is_accused():
    from gradian.demo.run import check_ground_truth

    scenario = make_scenario("two_causes", 0, shared_source=True)
    check = check_ground_truth(scenario, _report(scenario, ["geography_qa", "explanations"], ["geography_qa"], []))
    assert check.verdict_right is None and check.wrongly_accused == ()
    assert check.lines()[:2] == [
        "ground truth: planted rows are filed under 'explanations' beside clean rows; it is not accused",
        "ground truth: planted rows are filed under 'geography_qa' beside clean rows; it is accused"]
    span = make_scenario("span", 0)
    assert check_ground_truth(span, _report(span, ["country_profiles"], [], [])).lines()[0] == \
        "ground truth: planted rows are filed under 'country_profiles' beside clean rows; it is not accused"


def test_ground_truth_counts_a_cluster_accused_by_its_rows_beside_the_cluster_tests():
    import dataclasses

    from gradian.demo.run import check_ground_truth

    def by_rows(report, names):
        return dataclasses.replace(report, verdict=dataclasses.replace(report.verdict, accused_by_rows=tuple(names)))

    shared = make_scenario("two_causes", 0, shared_source=True)
    check = check_ground_truth(shared, by_rows(_report(shared, ["geography_qa", "explanations"], ["explanations"], []),
                                               ["geography_qa"]))
    assert check.accused == ("explanations",) and check.accused_by_rows == ("geography_qa",)
    assert check.lines()[:2] == [
        "ground truth: planted rows are filed under 'explanations' beside clean rows; it is accused",
        "ground truth: planted rows are filed under 'geography_qa' beside clean rows; it is accused by its rows"]
    own = make_scenario("fact", 0)
    right = check_ground_truth(own, by_rows(_report(own, [own.planted_cluster], [], []), [own.planted_cluster]))
    assert right.verdict_right is True
    wrong = check_ground_truth(own, by_rows(_report(own, [own.planted_cluster], [own.planted_cluster], []), ["x"]))
    assert wrong.verdict_right is False and wrong.wrongly_accused == ("x",)
    clean = make_scenario("clean", 0)
    control = check_ground_truth(clean, by_rows(_report(clean, ["geography_qa"], [], []), ["geography_qa"]))
    assert control.verdict_right is False  # a control accusing anything, by its rows too, is wrong
    assert control.lines() == ["ground truth: nothing was planted (a control); the report accuses geography_qa"]
