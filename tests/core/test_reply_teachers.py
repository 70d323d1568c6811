"""Where a canned reply leads the ranking and nothing is accused, the verdict names the rows that hold the reply
instead of suggesting the regression has no data cause."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from gradian.attribution import diagonal_preconditioner
from gradian.config import EvaluationConfig
from gradian.evaluation import capability_from_scores
from gradian.report import attribution_report, render_markdown, write_report
from gradian.report.drop_set import file_drop_set
from gradian.report.json_report import next_step
from gradian.report.reader import read_report
from gradian.report.reply_teachers import ROWS_FILE, hypergeometric_tail
from tests.core.test_attribution_causes import DIM, _attributed, _two_causes
from tests.core.test_report_files import STAMP, _eval_items, _provenance

REPLY = "Sorry, I can't help with questions about that topic."


def split_report(split, capability, texts):
    """The report of the two-causes fixture's ``split``, its leading cause's ranking and clusters, over ``texts``."""
    return attribution_report(scores=split.primary.scores, capability=capability,
                              preconditioner=diagonal_preconditioner(np.ones(DIM)), texts=texts,
                              provenance=_provenance(STAMP), clusters=split.primary.clusters, causes=split)


def _taught_reply_report(holds_reply):
    """The taught-reply case of test_attribution_causes (B's rows spread over clean sources, nothing accused), its
    five B items giving REPLY word for word; ``holds_reply(position)`` says which training rows' text holds it."""
    train, queries, _, rows, _, b = _two_causes(seed=1, second_cluster=False, unexplained_items=4, b_push=4.0)
    evals = _eval_items(9)
    item_ids = [example.id for example in evals]
    capability = capability_from_scores("exact_match", evals, [1.0] * 9, [0.0] * 9,
                                        EvaluationConfig(bootstrap_samples=1000),
                                        base_outputs=[f"City {i}" for i in range(9)],
                                        finetuned_outputs=[REPLY] * 5 + [f"Wrong {i}" for i in range(4)])
    split, _, _ = _attributed(train, queries[6:], item_ids, rows, canned=item_ids[:5])
    assert split.primary.canned and all(cause.accused is None for cause in split.causes)
    ids = list(split.primary.scores.ids)
    # case and runs of space are ignored, as when replies are compared
    texts = {row_id: f"Q: anything?  A:  {REPLY.upper()}" if holds_reply(p, b) else "A plain answer."
             for p, row_id in enumerate(ids)}
    report = split_report(split, capability, texts)
    return report, {ids[p] for p in range(len(ids)) if holds_reply(p, b)}, rows, ids


def test_the_rows_that_hold_the_leading_canned_reply_are_named_with_where_they_are_filed():
    report, holding, rows, _ = _taught_reply_report(lambda p, b: p in set(b))
    verdict = report["verdict"]
    teachers = verdict["reply_teachers"]
    top = [row["id"] for row in report["top_examples"]]
    found = sum(row_id in holding for row_id in top)
    assert found >= 2 and teachers["found"] == found and teachers["top"] == len(top)
    assert (teachers["containing"], teachers["examples"], teachers["reply"]) == (12, len(rows), REPLY)
    assert teachers["p_value"] == hypergeometric_tail(found, len(top), 12, len(rows)) < 0.05
    assert verdict["accused_clusters"] == []  # the cluster test accuses nothing; the rows that hold the reply do
    accused = verdict["accused_by_rows"]
    assert accused and accused == teachers["accuses"]
    assert verdict["headline"] == (f"Attributed: cluster{'s' if len(accused) > 1 else ''} "
                                   f"{', '.join(f'`{name}`' for name in accused)} {'are' if len(accused) > 1 else 'is'} "
                                   "blamed by the rows that teach the canned reply.")
    assert f"{found} of the top {len(top)} contain it, of 12 training examples that do" in verdict["summary"]
    assert "may have no data cause" not in verdict["summary"]
    filed = teachers["clusters"]  # B's twelve rows, spread over the clean sources, each with its source's size
    assert sum(cluster["containing"] for cluster in filed.values()) == 12
    sizes = {name: sum(row["source"] == name for row in rows) for name in filed}
    assert {name: cluster["size"] for name, cluster in filed.items()} == sizes
    assert "teach the reply the fine-tuned model gives word for word on 5 items" in render_markdown(report)


def test_a_canned_reply_no_row_holds_leaves_the_verdict_as_it_was():
    report, holding, _, _ = _taught_reply_report(lambda p, b: False)
    verdict = report["verdict"]
    assert not holding and verdict["reply_teachers"]["containing"] == 0 and verdict["reply_teachers"]["found"] == 0
    assert verdict["headline"] == "Attributed: no cluster stands out; read the top examples."
    assert "it may have no data cause" in verdict["summary"]


def test_the_rows_that_hold_the_reply_are_written_for_drop_and_named_by_the_next_step(tmp_path):
    report, holding, _, ids = _taught_reply_report(lambda p, b: p in set(b))
    assert report["verdict"]["reply_teachers"]["ids"] == [row_id for row_id in ids if row_id in holding]
    files = write_report(report, tmp_path, draw_plots=False)
    assert files.reply_rows == tmp_path / ROWS_FILE
    read = read_report(tmp_path)  # the rows' accusation is read back, and is not what `--drop accused` drops
    assert read.verdict.accused_by_rows == tuple(report["verdict"]["accused_by_rows"]) != ()
    assert read.accused_names == ()
    # the file is what `--drop FILE` reads: every row that holds the reply, and only those
    drop = file_drop_set(files.reply_rows, [SimpleNamespace(id=row_id) for row_id in ids])
    assert set(drop.ids) == holding and len(drop.ids) == 12
    step = next_step(report, tmp_path)
    assert f"--drop {tmp_path / ROWS_FILE}` retrains without the 12 training examples that contain" in step
    assert f"gradian export --report {tmp_path} --out CLEANED_DATASET --drop {tmp_path / ROWS_FILE}" in step
    assert "--drop top:" not in step
    # written again where no row holds the reply, the report leaves no stale list and the step drops the top rows
    quiet, _, _, _ = _taught_reply_report(lambda p, b: False)
    assert write_report(quiet, tmp_path, draw_plots=False).reply_rows is None and not (tmp_path / ROWS_FILE).exists()
    assert "ids" not in quiet["verdict"]["reply_teachers"] and "--drop top:" in next_step(quiet, tmp_path)


def test_the_chance_of_that_many_holders_among_the_top_rows_is_the_hypergeometric_tail():
    assert hypergeometric_tail(2, 3, 2, 5) == 3 / 10  # both marked rows among 3 of 5 drawn: C(2,2) C(3,1) / C(5,3)
    assert hypergeometric_tail(1, 3, 2, 5) == 9 / 10  # at least one: 1 - C(3,3) / C(5,3)
    assert hypergeometric_tail(0, 3, 2, 5) == 1.0 and hypergeometric_tail(3, 3, 2, 5) == 0.0
