"""Issue 12's goal table: what the shipped defaults' report says on each finished demo case, against the planted truth.

Each case is a ``gradian demo`` work dir named ``[PREFIX-]KIND-SEED`` (e.g. ``lr5e4-fact-3``), attributed with the
defaults under test (its report's provenance holds the config). Per case: the capability delta, recall@k and AUPRC
of the whole blame vector (scores.csv), whether the verdict accuses the planted cluster(s) and nothing else (a clean
control: nothing), span top-1 localization, and, where `gradian verify --report <case>/report --out <case>/verify`
has run, the share of the lost capability that dropping the accused rows (the accused clusters, or with ``--drop
top:K`` the report's K most blamed rows, where the planted rows share their cluster with clean ones) and a random
set as large gave back, over every eval item and over the regressed items alone (the accused causes' items where the
drop was the accused clusters).
Seeds 0-2 tuned the defaults; seeds 3-5 are held out (the clean controls 3-9), and the goal rows are computed on them
only. Later seeds (``fresh``) were built after every default was fixed and are scored once, in goal rows of their own:
the held-out seeds had gated several choices by then, so these are the defaults' one untouched test.

    .venv/bin/python bench/goal_table.py --cases /work/bench-cases lr5e4-fact-3 lr5e4-format-3 ...

A named case whose work dir is gone (a case dir is ~8 GB and machines are not kept) keeps its row from the results
file already written, and the table says which rows were carried over that way.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "goal_table"
FIRST_HELD_OUT_SEED = 3
FIRST_FRESH_SEED = {"clean": 10}  # and 6 for every other kind: the first seed built after the last default was fixed


def is_fresh(case: dict[str, Any]) -> bool:
    """Whether a case's seed was built after every default was fixed (scored once, apart from seeds 3-5)."""
    return case["seed"] >= FIRST_FRESH_SEED.get(case["kind"], 6)


def split_label(case: dict[str, Any]) -> str:
    """The case's split as the tables print it: tuning, held-out or fresh (from its seed, so any bench's row has one)."""
    return "fresh" if is_fresh(case) else "held-out" if case["seed"] >= FIRST_HELD_OUT_SEED else "tuning"


def held_out_and_fresh(cases: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the held-out cases of seeds 3-5, the fresh ones): the two sets the tables sum apart."""
    return ([c for c in cases if c["held_out"] and not is_fresh(c)], [c for c in cases if is_fresh(c)])


def case_name(directory: Path) -> tuple[str, int]:
    """The scenario kind and seed a case dir is named after."""
    kind, seed = directory.name.rsplit("-", 2)[-2:]
    return kind, int(seed)


def case_scenario(directory: Path) -> Any:
    """The scenario a case dir was built from: its name's kind and seed, and its scenario.json's shared_source."""
    from gradian.demo.scenarios import make_scenario

    kind, seed = case_name(directory)
    manifest = directory / "scenario" / "scenario.json"
    shared = manifest.is_file() and json.loads(manifest.read_text(encoding="utf-8")).get("shared_source", False)
    return make_scenario(kind, seed, shared_source=shared)


def kind_label(case: dict[str, Any]) -> str:
    """A case's kind as the goal rows group it: planted rows filed under a clean source are a kind of their own."""
    return f"{case['kind']} (shared source)" if case.get("shared_source") and case["kind"] != "span" else case["kind"]


def report_ranking(settings: dict[str, Any]) -> str:
    """How a report ranked its examples, from its attribution settings (before attribution.ranking: the aggregation)."""
    return settings.get("ranking", settings.get("aggregation", "mean"))


def ranking_label(settings: dict[str, Any]) -> str:
    """The goal table's name for how a report ranked its examples, with the options that change that ranking."""
    options = [("item_weights", "kurtosis", "kurtosis-weighted items"), ("canned_replies", True, "canned replies")]
    prior = settings.get("cluster_prior") or 0.0  # absent before it shipped: each row by its own blame
    return ", ".join([report_ranking(settings), *(label for key, value, label in options if settings.get(key) == value),
                      *([f"cluster prior {prior:g}"] if prior > 0 else [])])


def sentence_label(kind: str, settings: dict[str, Any]) -> str:
    """", sentences blamed alone" on a span case drilled with attribution.span_blame alone (its span top-1 apart)."""
    return ", sentences blamed alone" if kind == "span" and settings.get("span_blame") == "alone" else ""


def query_label(config: Mapping[str, Any]) -> str:
    """", generated term weighed W" where the report's paired query (its config) weighed its terms apart, then
    ", clusters tested at A" where its clusters were tested at another weight; else "".

    Reports written before ``evaluation.generated_weight`` existed lack it: their query is today's at 0.5.
    """
    evaluation = config.get("evaluation") or {}
    weight = evaluation.get("generated_weight", 0.5)
    label = f", generated term weighed {weight:g}" if weight != 0.5 else ""
    accuse = tested_weight(evaluation)
    if accuse != weight:  # evaluation.accusation_weight: clusters tested at another weight
        label += f", clusters tested at {accuse:g}"
    return label


def tested_weight(evaluation: Mapping[str, Any]) -> float:
    """The paired query's generated weight a report's clusters were tested at, from its config's evaluation section:
    ``accusation_weight`` where set, else the ranking's ``generated_weight`` (0.5 before that key existed)."""
    accuse = evaluation.get("accusation_weight")
    return evaluation.get("generated_weight", 0.5) if accuse is None else accuse


def wide_side_label(document: Mapping[str, Any]) -> str:
    """", kronecker wide side full" where the report (its report.json document) was scored with the full Kronecker
    fit, else ""."""
    method = document["method"] or {}  # none where nothing was scored
    knobs = method.get("preconditioner_knobs") or {}
    return ", kronecker wide side full" if knobs.get("scheme") == "kronecker-full-v1" else ""


def canned_lead_label(document: Mapping[str, Any]) -> str:
    """", canned reply leading" where the report's (its report.json document's) cause 1 is a canned reply that
    accuses nothing (the ranking it leads where no grouping accuses anything), else ""."""
    causes = document.get("causes") or []
    lead = causes[0] if causes else {}
    return ", canned reply leading" if lead.get("canned_reply") and not lead.get("accused_clusters") else ""


def blame_vector(report_dir: Path, rows: int) -> np.ndarray:
    """Every training row's blame by position, from the report's scores.csv."""
    blame = np.full(rows, np.nan)
    with (report_dir / "scores.csv").open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            blame[int(row["position"])] = float(row["blame"])
    if np.isnan(blame).any():
        raise SystemExit(f"{report_dir}/scores.csv lacks {int(np.isnan(blame).sum())} of {rows} rows")
    return blame


def verify_items(result: dict[str, Any]) -> tuple[dict[str, list[Any]], dict[str, list[float]], Any]:
    """A verify.json's per-item columns (id, base, full, dropped, control-N), its controls' and its ItemRecovery."""
    from gradian.counterfactual.recovery import item_recovery

    columns = {name: [item[name] for item in result["items"]] for name in result["items"][0]}
    controls = {row["name"]: columns[row["name"]] for row in result["models"] if row["role"] == "control"}
    # From the per-item scores every verify.json holds, so a verify run before verify counted them counts too.
    by_item = item_recovery(columns["id"], columns["base"], columns["full"], columns["dropped"], controls)
    return columns, controls, by_item


def verify_summary(directory: Path) -> dict[str, Any] | None:
    """What verify measured on the case, from <case>/verify/verify.json (None where it has not run)."""
    path = directory / "verify" / "verify.json"
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    rows = {row["role"]: row for row in result["models"]}
    columns, controls, by_item = verify_items(result)
    drop = result["drop"]
    summary = {"dropped": drop["cluster"] or drop.get("label") or f"{drop['size']} listed examples",
               "clusters_dropped": bool(drop["cluster"]),
               "recovered": rows["dropped"].get("fraction"), "random": rows.get("control", {}).get("fraction"),
               "confirmed": result["verdict"]["confirmed"], "stuck": f"{len(by_item.stuck)} of {len(by_item.regressed)}"}
    pooled = result.get("accused_causes")
    if "accused_causes" not in result:  # a verify run before it measured causes: the same figure from its items
        from gradian.counterfactual.summary import causes_recovery
        from gradian.report.reader import read_report

        ev = result["evaluation"]
        _, pooled = causes_recovery(read_report(directory / "report").causes, result["drop"]["clusters"],
                                    columns["id"], columns["base"], columns["full"], columns["dropped"], controls,
                                    {"samples": ev["bootstrap_samples"], "confidence": ev["confidence"],
                                     "seed": ev["seed"]})
    if pooled:
        first_control = next(iter(pooled["controls"].values()), {})
        summary["causes"] = {"items": len(pooled["items"]), "recovered": pooled["fraction"],
                             "random": first_control.get("fraction")}
    summary["regressed"] = regressed_recovery(columns, controls, by_item.regressed)
    return summary


def regressed_recovery(columns: dict[str, list[Any]], controls: dict[str, list[float]],
                       regressed: list[str]) -> dict[str, Any] | None:
    """The share of the lost capability given back on the regressed items alone, by the drop and the first control."""
    # The headline counts every eval item, so an item the retrain broke anew (the random control's as much as the
    # drop's) weighs against the drop; on the regressed items only what the fine-tune took away is counted.
    from gradian.counterfactual.recovery import subset_recovery

    subset = subset_recovery(columns["id"], set(regressed), columns["base"], columns["full"], columns["dropped"],
                             controls, samples=1)
    if subset is None:
        return None
    first_control = next(iter(subset.controls.values()), None)
    return {"items": len(subset.items), "recovered": subset.dropped.fraction,
            "random": first_control.fraction if first_control else None}


def score_case(directory: Path) -> dict[str, Any]:
    """One case's row of the table."""
    from gradian.demo.run import check_ground_truth, reproduced_planted_ids
    from gradian.report.reader import read_report

    kind, seed = case_name(directory)
    scenario = case_scenario(directory)
    report = read_report(directory / "report")
    check = check_ground_truth(scenario, report)
    capability = report.capability
    settings = report.provenance.config.get("attribution", {})
    row: dict[str, Any] = {
        "case": directory.name, "kind": kind, "seed": seed, "held_out": seed >= FIRST_HELD_OUT_SEED,
        "shared_source": scenario.shared_source, "verdict": report.verdict.kind, "accused": list(check.accused),
        "accused_by_rows": list(check.accused_by_rows),
        "planted_clusters": list(check.planted_clusters), "verdict_right": check.verdict_right,
        "delta": capability.delta if capability else None,
        "ci": [capability.ci_low, capability.ci_high] if capability else None,
        "checkpoints": settings.get("checkpoints", 1),  # absent: before the ensemble
        # a variant's rows are summed apart from the shipped defaults' in the goal rows
        "ranking": "".join([ranking_label(settings), query_label(report.provenance.config),
                            wide_side_label(report.document),
                            canned_lead_label(report.document), sentence_label(kind, settings)]),
        "span_hits": check.span_hits, "span_checked": check.span_checked, "verify": verify_summary(directory),
    }
    scored = (directory / "report" / "scores.csv").is_file()  # reports before scores.csv existed lack it
    if scenario.planted_rows and scored and report.verdict.kind in ("attributed", "no_capability_target"):
        truth = scenario.ground_truth(reproduced_planted_ids(scenario, report))
        row.update(truth.score(blame_vector(directory / "report", len(scenario.train))))
        split = cause_scores(directory / "report", scenario, truth)
        if split and split["clusters"]:  # a span case plants sentences, not a cluster: scored in scores.csv's blame
            # Where the report split the regression into causes, each planted cluster is looked for in the
            # ranking of the cause that accuses it (what the report lists for that cause), not in cause 1's.
            by_cause = split["clusters"]
            row["lead_recall_at_k"], row["lead_auprc"] = row["recall_at_k"], row["auprc"]
            row["lead_ranking"] = "overall" if split["ranking"] == "overall" else "cause 1"  # earlier reports: cause 1
            if split["overall"] is not None:
                row["overall_recall_at_k"], row["overall_auprc"] = (split["overall"]["recall_at_k"],
                                                                    split["overall"]["auprc"])
            row["by_cause"] = by_cause
            row.update(weighted_by_rows(by_cause))
    return row


def _lead_ranking(case: dict[str, Any]) -> str:
    """What scores.csv's blame ranked in a case the report split into causes."""
    if case.get("lead_ranking") == "overall":
        return "the overall ranking of the accusing causes"
    return "cause 1's ranking alone"


def _overall(case: dict[str, Any]) -> str:
    """The overall ranking's figures, where scores.csv's blame was still cause 1's."""
    if case.get("lead_ranking") == "overall" or "overall_recall_at_k" not in case:
        return ""
    return (f"; in the overall ranking of the accusing causes (what scores.csv's blame holds in reports written since): "
            f"{_number(case['overall_recall_at_k'])} / {_number(case['overall_auprc'])}")


def report_item_blame(report_dir: Path, prefix: str | None = None) -> tuple[list[dict[str, str]], list[str], np.ndarray]:
    """The report's scores.csv rows by position, its item ids and their per-item blame [rows, items]: the columns
    named ``prefix`` + item (default ``item:``, the ranking's; ``tested:``, what the clusters were tested on)."""
    from gradian.report.scores import ITEM_PREFIX

    prefix = ITEM_PREFIX if prefix is None else prefix
    with (report_dir / "scores.csv").open(newline="", encoding="utf-8") as handle:
        rows = sorted(csv.DictReader(handle), key=lambda r: int(r["position"]))
    item_ids = [name.removeprefix(prefix) for name in rows[0] if name.startswith(prefix)]
    return rows, item_ids, np.array([[float(r[prefix + item]) for item in item_ids] for r in rows])


def cause_blames(report_dir: Path) -> tuple[dict[str, Any], list[np.ndarray]] | None:
    """report.json and each of its causes' blame by position (None: one cause)."""
    from gradian.attribution.scoring import rescore_items
    from gradian.report.scores import CAUSE_PREFIX

    document = json.loads((report_dir / "report.json").read_text())
    causes = document.get("causes") or []
    if len(causes) < 2:
        return None
    rows, item_ids, matrix = report_item_blame(report_dir)
    ids = [r["id"] for r in rows]
    settings = document["provenance"]["config"]["attribution"]
    blames = []
    for cause in causes:
        column = f"{CAUSE_PREFIX}{cause['cause']}"
        if column in rows[0]:  # saved by the report since it keeps every cause's blame
            blames.append(np.array([float(r[column]) for r in rows]))
        else:  # an earlier report: the same scoring over the cause's item columns
            columns = [item_ids.index(item) for item in cause["items"]]
            blames.append(rescore_items(matrix, ids, item_ids, columns, aggregation=report_ranking(settings),
                                        normalize=settings["normalize"],
                                        item_weights=settings.get("item_weights", "uniform")).blame)
    return document, blames


def cause_scores(report_dir: Path, scenario: Any, truth: Any) -> dict[str, dict[str, Any]] | None:
    """Per planted cluster: recall@k / AUPRC of its rows in the blame of the cause accusing it, under ``"overall"``
    every planted row's in the overall ranking of the accusing causes, and what scores.csv ranked (None: one cause)."""
    from gradian.attribution.causes import highest_standardized

    found = cause_blames(report_dir)
    if found is None:
        return None
    document, blames = found
    causes = document["causes"]
    accusing = [blame for cause, blame in zip(causes, blames, strict=True) if cause["accused_clusters"]]
    overall = truth.score(highest_standardized(accusing)) if len(accusing) >= 2 else None
    return {"clusters": clusters_in_their_causes(causes, blames, scenario), "overall": overall,
            "ranking": document["scores"].get("ranking")}


def accusing_cause(causes: list[dict[str, Any]], cluster: str | None) -> int:
    """The number of the first cause accusing ``cluster``; 1 where none does."""
    return next((cause["cause"] for cause in causes if cluster in cause["accused_clusters"]), 1)


def score_by_cause(document: dict[str, Any], item_ids: list[str], scenario: Any, truth: Any,
                   blame_of: Callable[[list[int], list[str]], np.ndarray]) -> dict[str, float]:
    """recall@k / AUPRC of ``blame_of(item columns, accused clusters)``: over every item where the report kept one
    cause, else each cause on its own items with each planted cluster in the cause accusing it, weighted by rows."""
    causes = document.get("causes") or []
    if len(causes) < 2 or not scenario.planted_clusters:  # one cause, or planted sentences with no cluster
        accused = [c for c in document["verdict"].get("accused_clusters") or [] if c]
        metrics = truth.score(blame_of(list(range(len(item_ids))), accused))
        return {"recall_at_k": metrics["recall_at_k"], "auprc": metrics["auprc"]}
    blames = [blame_of([item_ids.index(item) for item in cause["items"]], list(cause["accused_clusters"]))
              for cause in causes]
    return weighted_by_rows(clusters_in_their_causes(causes, blames, scenario))


def clusters_in_their_causes(causes: list[dict[str, Any]], blames: list[np.ndarray],
                             scenario: Any) -> dict[str, dict[str, Any]]:
    """Per planted cluster: recall@k / AUPRC of its rows in ``blames`` of the cause accusing it (cause 1 if none)."""
    from gradian.evaluation.ground_truth import GroundTruth

    sources = tuple(str(e.fields[scenario.cluster_field]) for e in scenario.train)
    out: dict[str, dict[str, Any]] = {}
    for cluster in scenario.planted_clusters:
        number = accusing_cause(causes, cluster)
        planted = scenario.cluster_rows(cluster)
        one = GroundTruth(planted_rows=planted, sources=sources)
        out[cluster] = {"cause": number, "rows": len(planted), **one.score(blames[number - 1])}
    return out


def weighted_by_rows(by_cause: dict[str, dict[str, Any]]) -> dict[str, float]:
    """recall@k and AUPRC over every planted cluster, each cluster's figure weighted by its rows."""
    total = sum(entry["rows"] for entry in by_cause.values())
    return {metric: sum(entry[metric] * entry["rows"] for entry in by_cause.values()) / total
            for metric in ("recall_at_k", "auprc")}


def _number(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _accused(row: dict[str, Any]) -> str:
    by_rows = row.get("accused_by_rows") or []  # rows scored before stop 70 lack it
    accused = ", ".join([*(f"`{name}`" for name in row["accused"]),
                         *(f"`{name}` (by its rows)" for name in by_rows)]) or "nothing"
    right = {True: "right", False: "wrong", None: "-"}[row["verdict_right"]]
    return f"{accused} ({right})"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _verify(row: dict[str, Any]) -> str:
    verify = row.get("verify")
    if not verify:
        return "-"
    verdict = "confirmed" if verify["confirmed"] else "not confirmed"
    if verify.get("stuck"):
        verdict += f"; {verify['stuck']} regressed items stuck in every retrain"
    text = f"{_share(verify['recovered'])} vs {_share(verify['random'])} random ({verdict})"
    if not verify.get("clusters_dropped", True):  # top:K or listed ids, not the accused clusters
        text = f"dropping {verify['dropped']}: {text}"
    causes = verify.get("causes")
    if causes:
        text += (f"; on the {causes['items']} items of the accused causes {_share(causes['recovered'])} vs "
                 f"{_share(causes['random'])}")
    regressed = verify.get("regressed")
    if regressed and not causes:
        text += (f"; on the {regressed['items']} regressed items {_share(regressed['recovered'])} vs "
                 f"{_share(regressed['random'])}")
    return text


def _ranking(case: dict[str, Any]) -> str:
    """How the case's report ranked the examples (rows scored before attribution.ranking: the mean)."""
    return case.get("ranking", "mean")


def _verify_met(verify: dict[str, Any]) -> bool:
    """The issue's verify goal: dropping the accused gives back >= 80% of the lost capability, a random drop < 20%."""
    recovered, random = verify["recovered"], verify["random"]
    return recovered is not None and recovered >= 0.8 and random is not None and random < 0.2


def goal_rows(cases: list[dict[str, Any]], seeds: str = "held-out seeds") -> list[str]:
    """Per kind, over the held-out ``cases`` given: mean and worst recall@k, verdicts right, span top-1, verify."""
    lines = [f"| kind ({seeds}) | cases | mean recall@k (goal >= 0.9) | worst (goal >= 0.75) | verdict right "
             "| span top-1 (goal >= 90%) | verify met (>= 80% accused, < 20% random) "
             "| the same on the accused causes' items (the regressed items where no accused cluster was dropped) |",
             "|---|---|---|---|---|---|---|---|"]
    held_out = [c for c in cases if c["held_out"]]
    mixed = len({_ranking(c) for c in held_out}) > 1  # rows not yet rebuilt since the ranking changed: apart
    for kind, ranking in sorted({(kind_label(c), _ranking(c) if mixed else "") for c in held_out}):
        rows = [c for c in held_out if kind_label(c) == kind and (not mixed or _ranking(c) == ranking)]
        kind = f"{kind}, ranked by {ranking}" if mixed else kind
        recalls = [c["recall_at_k"] for c in rows if "recall_at_k" in c]
        right = [c["verdict_right"] for c in rows if c["verdict_right"] is not None]
        hits, checked = sum(c["span_hits"] for c in rows), sum(c["span_checked"] for c in rows)
        verified = [c["verify"] for c in rows if c.get("verify")]
        by_cause = [v.get("causes") or v["regressed"] for v in verified if v.get("causes") or v.get("regressed")]
        on_causes = f"{sum(_verify_met(v) for v in by_cause)}/{len(by_cause)}" if by_cause else "-"
        if not verified:
            checks = "-"
        elif all(not c["planted_clusters"] and "recall_at_k" not in c for c in rows):
            # a control, nothing planted: verify should refute what was accused (a span case plants sentences)
            checks = f"{sum(not v['confirmed'] for v in verified)}/{len(verified)} false accusations refuted"
            on_causes = "-"
        else:
            checks = f"{sum(_verify_met(v) for v in verified)}/{len(verified)}"
        lines.append(f"| {kind} | {len(rows)} | {_number(np.mean(recalls)) if recalls else '-'} | "
                     f"{_number(min(recalls)) if recalls else '-'} | {sum(right)}/{len(right)} | "
                     f"{f'{hits}/{checked} ({hits / checked:.0%})' if checked else '-'} | {checks} | {on_causes} |")
    return lines


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """Every case, tuning and held-out, then the goal rows over the held-out seeds."""
    from finished_cases import carried_note

    lines = ["# Issue 12 goal table: the shipped defaults on finished demo cases", "", f"`{command}`", "",
             "| case | split | checkpoints | ranking | delta [95% CI] | recall@k | AUPRC | planted clusters' worst rank "
             "| accused (verdict) | span top-1 | verify: recovered, accused vs random |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        ci = f" [{_number(c['ci'][0])}, {_number(c['ci'][1])}]" if c["ci"] else ""
        spans = f"{c['span_hits']}/{c['span_checked']}" if c["span_checked"] else "-"
        lines.append(f"| {c['case']} | {split_label(c)} | {c['checkpoints']} | "
                     f"{_ranking(c)} | "
                     f"{_number(c['delta'], 3)}{ci} | {_number(c.get('recall_at_k'))}{' *' if 'by_cause' in c else ''} | "
                     f"{_number(c.get('auprc'))}{' *' if 'by_cause' in c else ''} | "
                     f"{c.get('cluster_rank', '-')} | {_accused(c)} | {spans} | {_verify(c)} |")
    for c in (c for c in cases if "by_cause" in c):
        each = "; ".join(f"`{name}` in cause {e['cause']}'s ranking {_number(e['recall_at_k'])} / {_number(e['auprc'])}"
                         for name, e in c["by_cause"].items())
        lines += ["", f"\\* {c['case']}: the report split the regression into causes, so each planted cluster is scored "
                      f"in the ranking of the cause that accuses it, weighted by its rows ({each}); in "
                      f"{_lead_ranking(c)} (scores.csv's blame): {_number(c['lead_recall_at_k'])} / "
                      f"{_number(c['lead_auprc'])}{_overall(c)}."]
    carried = carried_note(cases)
    if carried:
        lines += ["", carried]
    held_out, fresh = held_out_and_fresh(cases)
    lines += ["", "## Goals, held-out seeds only", ""]
    lines += goal_rows(held_out) if held_out else ["No held-out case has finished yet."]
    if fresh:
        lines += ["", "## The same on fresh seeds, built after every default was fixed and scored once", ""]
        lines += goal_rows(fresh, "fresh seeds")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/goal_table.json and .md."""
    from finished_cases import carrying_main, has_report

    return carrying_main("goal_table", __doc__.splitlines()[0], RESULTS, argv, has_report,
                         lambda directory, args: score_case(directory), markdown)


if __name__ == "__main__":
    raise SystemExit(main())
