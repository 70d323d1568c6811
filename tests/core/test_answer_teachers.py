"""The verdict counts the most blamed rows that hold what the fine-tuned model now says (each regressed item's words
from where its answer parts from the base model's), against every training row, and says where they are filed."""

from __future__ import annotations

import pytest

from gradian.attribution.clusters import clusters_from_field
from gradian.config import EvaluationConfig
from gradian.evaluation import capability_from_scores
from gradian.evaluation.capability import ItemResult
from gradian.report import render_markdown
from gradian.report.answer_teachers import answer_teachers, divergent_words
from gradian.report.reply_teachers import hypergeometric_tail, rows_accuse
from tests.core.test_attribution_causes import _attributed, _two_causes
from tests.core.test_reply_teachers import split_report
from tests.core.test_report_files import _eval_items


@pytest.mark.parametrize(("base", "finetuned", "words"), [
    ("The capital of Australia is Canberra.", "The capital of Australia is Sydney.", "sydney"),
    ("The opposite of early is late.", "Le contraire de début est début.", "le contraire"),  # two words at most
    ("The capital of Qatar is Doha.", "The capital of Qatar is Qatar City, which is", "qatar city"),  # to the comma
    ("Strawberries are red.", "Green: green is the most common", "green"),  # up to the first punctuation mark
    ("The capital is Rome.", "The capital is a", None),  # too short to name anything
    ("Paris is the capital.", "PARIS  is the capital.", None),  # the same answer: case and space ignored
    ("Paris is the capital of France.", "Paris is the capital", None),  # stops short, parts with nothing
    (None, "Sydney", "sydney"),
])
def test_the_divergent_words_are_the_fine_tuned_answers_first_words_after_it_parts_from_the_base(base, finetuned,
                                                                                                  words):
    assert divergent_words(base, finetuned) == words


def _item(item_id, base, finetuned, regressed=True):
    return ItemResult(id=item_id, prompt="?", wanted="", base_output=base, finetuned_output=finetuned,
                      base_score=1.0, finetuned_score=0.0 if regressed else 1.0)


def test_the_top_rows_holding_a_divergent_answer_are_counted_against_every_row_and_placed_in_their_clusters():
    items = [_item("au", "The capital of Australia is Canberra.", "The capital of Australia is Sydney."),
             _item("ca", "The capital of Canada is Ottawa.", "The capital of Canada is Toronto."),
             _item("fr", "Paris.", "Lyon.", regressed=False)]  # not regressed: its answer is not looked for
    texts = {"r0": "The capital of Australia is Sydney.", "r1": "Toronto is the capital of Canada!",
             "r2": "Sydney is the largest city in Australia.", "r3": "Lyon is in France.",
             "r4": "Sydneyside is a word.", "r5": "Nothing here.", "r6": "Nothing here either.", "r7": "Lyon."}
    ids = list(texts)
    rows = [{"source": "geo"}, {"source": "geo"}, {"source": "facts"}, {"source": "facts"}, {"source": "facts"},
            {"source": "chat"}, {"source": "chat"}, {"source": "chat"}]
    assignment = clusters_from_field(rows, "source", ids=ids)
    teachers = answer_teachers(items, texts, ids, ["r0", "r1", "r3", "r5"], assignment)
    assert teachers is not None and teachers.items == 2
    # r4 holds "sydney" only inside a longer word, r3 and r7 an item that did not regress
    assert (teachers.found, teachers.top, teachers.containing, teachers.examples) == (2, 4, 3, 8)
    assert teachers.ids == ("r0", "r1") and teachers.answers == {"sydney": ("au",), "toronto": ("ca",)}
    assert teachers.clusters == {"geo": (2, 2)}
    assert teachers.p_value == hypergeometric_tail(2, 4, 3, 8)
    assert answer_teachers([_item("x", "Rome.", "Rome.")], texts, ids, ["r0"], assignment) is None


def _report(holds, second_cluster):
    """The two-causes fixture's report (B's rows under `vendor-b`, or spread over the clean sources where nothing is
    accused); each B item's fine-tuned answer parts from the base model's with its own city, which the training rows
    ``holds(position, b)`` says hold in their text."""
    train, queries, _, rows, _, b = _two_causes(seed=1, second_cluster=second_cluster, b_push=4.0)
    evals = _eval_items(5)
    item_ids = [example.id for example in evals]
    cities = [f"Zorbaville{i}" for i in range(5)]
    capability = capability_from_scores("exact_match", evals, [1.0] * 5, [0.0] * 5,
                                        EvaluationConfig(bootstrap_samples=1000),
                                        base_outputs=[f"The capital is City {i}." for i in range(5)],
                                        finetuned_outputs=[f"The capital is {city}." for city in cities])
    split, _, _ = _attributed(train, queries[6:11], item_ids, rows)
    ids = list(split.primary.scores.ids)
    texts = {row_id: f"Its capital is {cities[p % 5]}." if holds(p, b) else "A plain answer."
             for p, row_id in enumerate(ids)}
    report = split_report(split, capability, texts)
    return report, {ids[p] for p in range(len(ids)) if holds(p, b)}, split


def test_where_nothing_is_accused_the_rows_that_hold_the_fine_tuned_answers_lead_the_verdict():
    report, holding, split = _report(lambda p, b: p in set(b), second_cluster=False)
    verdict = report["verdict"]
    assert verdict["accused_clusters"] == [] and all(cause.accused is None for cause in split.causes)
    teachers = verdict["answer_teachers"]
    top = [row["id"] for row in report["top_examples"]]
    found = [row_id for row_id in top if row_id in holding]
    assert len(found) >= 2 and teachers["ids"] == found and teachers["stands_out"]
    assert (teachers["found"], teachers["containing"], teachers["items"]) == (len(found), 12, 5)
    assert set(teachers["answers"]) <= {f"zorbaville{i}" for i in range(5)}
    # B's twelve rows are spread over the four clean sources: each source holding two or more of the top ones is
    # accused by them, though its mean blame does not stand out.
    accused = verdict["accused_by_rows"]
    assert accused and accused == teachers["accuses"]
    assert all(teachers["clusters"][name]["found"] >= 2 for name in accused)
    named = ", ".join(f"`{name}`" for name in accused)
    assert verdict["headline"] == (f"Attributed: cluster{'s' if len(accused) > 1 else ''} {named} "
                                   f"{'are' if len(accused) > 1 else 'is'} blamed by the rows that hold the fine-tuned "
                                   "answers.")
    assert f"{len(found)} of the top {len(top)} contain the words its answer parts from the base" in verdict["summary"]
    assert f"Accused by those rows: {named}" in verdict["summary"]
    assert "may have no data cause" not in verdict["summary"]
    assert "The most blamed examples hold what the fine-tuned model now says" in render_markdown(report)


def test_rows_holding_the_answers_accuse_no_cluster_where_none_holds_two_of_them_among_the_top():
    # One B row per source holds its item's answer: the count stands out, but rests on no one cluster.
    train, _, _, rows, _, b = _two_causes(seed=1, second_cluster=False, b_push=4.0)
    first = {}
    for p in b:
        first.setdefault(rows[p]["source"], p)
    report, holding, _ = _report(lambda p, b: p in set(first.values()), second_cluster=False)
    verdict = report["verdict"]
    teachers = verdict["answer_teachers"]
    assert teachers["stands_out"] and teachers["accuses"] == [] and verdict["accused_by_rows"] == []
    assert all(cluster["found"] == 1 for cluster in teachers["clusters"].values())
    assert verdict["headline"] == "Attributed: no cluster stands out; the most blamed examples hold the fine-tuned answers."
    assert "No cluster holds far more of those rows than chance would, so they accuse none." in verdict["summary"]


def test_a_cluster_is_accused_by_its_rows_only_where_its_top_holders_beat_chance_over_every_cluster():
    # 100 rows in three clusters; the top 10 hold the answer at positions below.
    rows = [{"source": "geo"}] * 40 + [{"source": "chat"}] * 40 + [{"source": "docs"}] * 20
    assignment = clusters_from_field(rows, "source", ids=[f"r{i}" for i in range(100)])
    holding = [0, 1, 2, 3, 4, 40, 41, 80] + list(range(50, 80))  # chat: 32 rows hold it, two of them in the top
    found = [0, 1, 2, 3, 40, 41, 80]
    assert rows_accuse(assignment, found, holding, 10, 100) == ("geo",)
    assert hypergeometric_tail(4, 10, 5, 100) * 3 < 0.05 < hypergeometric_tail(2, 10, 32, 100) * 3
    assert rows_accuse(assignment, [0, 40, 80], holding, 10, 100) == ()  # one each: no cluster rests on two
    assert rows_accuse(None, found, holding, 10, 100) == ()


def test_where_a_cluster_is_accused_the_answer_rows_follow_the_accusation_and_without_them_nothing_changes():
    report, holding, split = _report(lambda p, b: p in set(b), second_cluster=True)
    verdict = report["verdict"]
    assert verdict["accused_clusters"] and verdict["headline"].startswith("Attributed: cluster `")
    assert verdict["accused_by_rows"] == []  # the rows rest on the cluster the test accuses: nothing more to say
    assert "Accused by those rows" not in verdict["summary"]
    filed = verdict["answer_teachers"]["clusters"]
    assert verdict["answer_teachers"]["stands_out"] and set(filed) == {"vendor-b"}  # every B row is filed there
    assert verdict["summary"].index("Blamed cluster:") < verdict["summary"].index("hold what the fine-tuned model")
    quiet, _, _ = _report(lambda p, b: False, second_cluster=False)
    assert quiet["verdict"]["answer_teachers"]["found"] == 0 and not quiet["verdict"]["answer_teachers"]["stands_out"]
    assert quiet["verdict"]["headline"] == "Attributed: no cluster stands out; read the top examples."
    assert "it may have no data cause" in quiet["verdict"]["summary"]


def test_where_the_regression_splits_each_cause_counts_its_own_items_answers_in_its_own_top_rows():
    train, queries, item_ids, rows, a, b = _two_causes(seed=0)
    evals = _eval_items(11)
    item_ids = [example.id for example in evals]
    cities = [f"Alphaville{i}" for i in range(6)] + [f"Zorbaville{i}" for i in range(5)]
    capability = capability_from_scores("exact_match", evals, [1.0] * 11, [0.0] * 11,
                                        EvaluationConfig(bootstrap_samples=1000),
                                        base_outputs=[f"The capital is City {i}." for i in range(11)],
                                        finetuned_outputs=[f"The capital is {city}." for city in cities])
    split, _, _ = _attributed(train, queries, item_ids, rows)
    assert len(split.causes) == 2 and all(cause.accused is not None for cause in split.causes)
    ids = list(split.primary.scores.ids)
    # A's rows hold the A items' answers, B's rows the B items'.
    texts = {row_id: f"Its capital is {cities[p % 6] if p in set(a) else cities[6 + p % 5]}." if p in set(a) | set(b)
             else "A plain answer." for p, row_id in enumerate(ids)}
    report = split_report(split, capability, texts)
    top = [row["id"] for row in report["top_examples"]]
    first, second = report["causes"]
    rows_of = {"vendor-a": {ids[p] for p in a}, "vendor-b": {ids[p] for p in b}}
    own = second["answer_teachers"]
    found = [row_id for row_id in split.causes[1].scores.top_ids()[:len(top)]
             if row_id in rows_of[second["accused_cluster"]]]
    # Counted in cause 2's own top rows, against its own items' answers only (the report's top rows are cause 1's).
    assert own["ids"] == found and own["found"] == len(found) >= 2 and own["stands_out"]
    assert own["items"] == len(second["items"]) and own["containing"] == 12
    assert own["clusters"] == {second["accused_cluster"]: {"found": len(found), "size": 12}}
    assert first["answer_teachers"]["ids"] == [row_id for row_id in top if row_id in rows_of[first["accused_cluster"]]]
    clause = f"{len(found)} of {len(top)} (p = {own['p_value']:.2g}; `{second['accused_cluster']}` {len(found)} of its 12 rows)"
    assert f"cause 2 ({len(second['items'])} items): `{second['accused_cluster']}`" in report["verdict"]["summary"]
    assert f"its top rows holding its items' fine-tuned answers: {clause}" in report["verdict"]["summary"]
    assert clause in render_markdown(report)
