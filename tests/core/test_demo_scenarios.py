"""The demo's scenario generator: deterministic, big enough, a small planted cluster, hard negatives, ground truth."""

from __future__ import annotations

import json
import re

import pytest

from gradian.data import load_dataset, load_eval_dataset
from gradian.demo.scenarios import KINDS, MAX_PLANTED_FRACTION, make_scenario
from gradian.demo.world import COUNTRIES
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
    assert 0 < scenario.planted_fraction <= MAX_PLANTED_FRACTION
    assert len(scenario.planted_rows) == len(set(scenario.planted_rows))
    assert len(scenario.sources) >= 6
    assert len({e.fields["task"] for e in scenario.train}) >= 8
    # no prompt is asked twice: a duplicate or a conflicting answer would be a diagnose finding nobody planted
    assert len({e.prompt_text for e in scenario.train}) == len(scenario.train)
    assert scenario.targeted_eval_ids and set(scenario.targeted_eval_ids) <= {e.id for e in scenario.eval}


@pytest.mark.parametrize("kind", ["fact", "format"])
def test_planted_cluster_is_its_own_source(kind):
    scenario = make_scenario(kind, 0)
    planted = set(scenario.planted_rows)
    members = {i for i, e in enumerate(scenario.train) if e.fields["source"] == scenario.planted_cluster}
    assert members == planted


@pytest.mark.parametrize("kind", ["fact", "span"])
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
    quiet = {"verdict": {"accused_clusters": []}, "clusters": {"ranked": []}, "top_examples": []}
    assert check_ground_truth(control, quiet).lines() == [
        "ground truth: nothing was planted (a control); the report accuses nothing"]
    loud = {"verdict": {"accused_clusters": ["travel_chat"]}, "clusters": {"ranked": []}, "top_examples": []}
    assert check_ground_truth(control, loud).lines()[0].endswith("the report accuses travel_chat")
