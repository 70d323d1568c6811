"""verify.json / verify.md and inject.json / inject.md: the numbers as a document, and the same numbers to read.

JSON keeps a fixed key order and refuses NaN; each file is written atomically (temp file + rename).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradian.atomic_files import write_atomic
from gradian.counterfactual.recovery import Recovery, item_recovery, margin, recovery, subset_recovery
from gradian.counterfactual.retrain import TrainedModel
from gradian.evaluation.capability import CapabilityResult
from gradian.report.reader import CauseRow

if TYPE_CHECKING:
    from gradian.counterfactual.verify import VerifyPlan  # verify imports this module

VERIFY_JSON, VERIFY_MD = "verify.json", "verify.md"
INJECT_JSON, INJECT_MD = "inject.json", "inject.md"


@dataclass(frozen=True)
class WrittenResult:
    """A result document and where it was written (its JSON and its Markdown)."""

    result: dict[str, Any]
    json_path: Path
    markdown_path: Path


# --- verify -------------------------------------------------------------------------------------


def verify_result(plan: VerifyPlan, trained: Mapping[str, TrainedModel], evaluations: Mapping[str, CapabilityResult], *,
                  command: str | None = None) -> dict[str, Any]:
    """The verify.json document from the plan, the trained models and each model's CapabilityResult."""
    ev = plan.config.evaluation
    boot = {"samples": ev.bootstrap_samples, "confidence": ev.confidence, "seed": ev.seed}
    full_eval = evaluations["full"]
    base = [item.base_score for item in full_eval.items]
    full = [item.finetuned_score for item in full_eval.items]
    names = [name for name in evaluations if name != "full"]
    scores = {name: [item.finetuned_score for item in evaluations[name].items] for name in names}
    models = [_model_row("full", "full", trained.get("full"), plan, full_eval, None)]
    for name in names:
        role = "dropped" if name == "dropped" else "control"
        rec = recovery(base, full, scores[name], **boot)
        models.append(_model_row(name, role, trained.get(name), plan, evaluations[name], rec))
    comparisons = []
    for name in names:
        if name != "dropped":
            m = margin(scores["dropped"], scores[name], **boot)
            comparisons.append({"control": name, "delta": m.delta, "low": m.low, "high": m.high,
                                "significant": m.significant})
    base_consistent = all([i.base_score for i in evaluations[name].items] == base for name in names)
    lost = sum(b - f for b, f in zip(base, full, strict=True)) / len(base)
    dropped_row = next(row for row in models if row["role"] == "dropped")
    confirmed = bool(lost > 0 and dropped_row["recovered_low"] > 0 and all(c["significant"] for c in comparisons))
    ids = [item.id for item in full_eval.items]
    control_scores = {name: scores[name] for name in names if name != "dropped"}
    by_item = item_recovery(ids, base, full, scores["dropped"], control_scores)
    causes, accused_causes = causes_recovery(plan.causes, plan.drop.clusters, ids, base, full, scores["dropped"],
                                             control_scores, boot)
    items = []
    for position, item in enumerate(full_eval.items):
        row = {"id": item.id, "prompt": item.prompt, "wanted": item.wanted, "base": base[position],
               "full": full[position]}
        row.update({name: scores[name][position] for name in names})
        items.append(row)
    result = {
        "schema": "gradian.verify/1",
        "verdict": {"confirmed": confirmed, "headline": "", "summary": ""},
        "inputs": {
            "report": str(plan.report_dir) if plan.report_dir is not None else None,
            "base_model": plan.base_model, "dataset": str(plan.dataset), "dataset_sha256": plan.dataset_sha256,
            "n_examples": plan.n_examples, "eval_dataset": str(plan.eval_dataset),
            "adapter": str(plan.adapter) if plan.adapter is not None else None,
            "full_model": plan.full_model, "full_model_why": _full_model_why(plan), "backend": plan.backend,
            "device": plan.placement.device, "dtype": plan.placement.dtype,
            "config_sources": list(plan.config_sources),
        },
        "drop": {"origin": plan.drop.origin, "label": plan.drop.label, "cluster": plan.drop.cluster,
                 "clusters": list(plan.drop.clusters),
                 "membership": plan.drop.membership,
                 "size": len(plan.drop), "ids": list(plan.drop.ids)},
        "controls": {"count": len(plan.controls), "seed": plan.control_seed,
                     "how": "random examples outside the drop set, as many as it holds, drawn without replacement "
                            "from a generator seeded with [seed, control number]"},
        "evaluation": {"metric": full_eval.metric, "n_items": full_eval.n_items, "base_mean": _mean(base),
                       "full_mean": _mean(full), "lost": lost, "bootstrap_samples": ev.bootstrap_samples,
                       "confidence": ev.confidence, "seed": ev.seed, "base_scores_consistent": base_consistent},
        "models": models,
        "comparisons": comparisons,
        "regressed_items": {"count": len(by_item.regressed), "back": by_item.back, "stuck": by_item.stuck},
        "causes": causes,
        "accused_causes": accused_causes,
        "items": items,
        "config": plan.config.to_dict(),
        "command": command,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    result["verdict"]["headline"], result["verdict"]["summary"] = _verify_verdict(result)
    return result


def _model_row(name: str, role: str, model: TrainedModel | None, plan: VerifyPlan, evaluation: CapabilityResult,
               rec: Recovery | None) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, "role": role, "mean": evaluation.finetuned_mean}
    if role == "full":
        row["source"] = plan.full_model
    if role == "control":
        number = int(name.rsplit("-", 1)[1])
        row["drop_ids"] = list(plan.controls[number - 1])
    if rec is not None:
        row.update(_recovery_fields(rec))
    row["training"] = model.to_dict() if model is not None else None
    return row


def _recovery_fields(rec: Recovery) -> dict[str, Any]:
    return {"recovered": rec.recovered, "recovered_low": rec.recovered_low, "recovered_high": rec.recovered_high,
            "fraction": rec.fraction, "fraction_low": rec.fraction_low, "fraction_high": rec.fraction_high,
            "fraction_resamples": rec.fraction_resamples}


def _subset_fields(ids: Sequence[str], subset: set[str], base: Sequence[float], full: Sequence[float],
                   dropped: Sequence[float], controls: Mapping[str, Sequence[float]],
                   boot: Mapping[str, Any]) -> dict[str, Any] | None:
    """The drop's and each control's recovery on ``subset`` of the eval items (None when none of them is here)."""
    on = subset_recovery(ids, subset, base, full, dropped, controls, **boot)
    if on is None:
        return None
    return {"items": list(on.items), "lost": on.dropped.lost, **_recovery_fields(on.dropped),
            "controls": {name: _recovery_fields(rec) for name, rec in on.controls.items()}}


def causes_recovery(causes: Sequence[CauseRow], dropped_clusters: Collection[str], ids: Sequence[str],
                    base: Sequence[float], full: Sequence[float], dropped: Sequence[float],
                    controls: Mapping[str, Sequence[float]], boot: Mapping[str, Any],
                    ) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None]:
    """Per cause of a report, what each retrain gave back of its items' loss; and the same over every dropped cause."""
    # The overall fraction mixes what an accusation claims with items no cluster was accused of; a cause's own
    # items are what dropping its accused clusters should give back, so verify measures that too.
    if not causes:
        return None, None
    rows = []
    for cause in causes:
        fields = _subset_fields(ids, set(cause.items), base, full, dropped, controls, boot)
        if fields is None:
            continue  # an eval set other than the report's: none of this cause's items is scored here
        in_drop = bool(cause.accused_clusters) and set(cause.accused_clusters) <= set(dropped_clusters)
        rows.append({"cause": cause.number, "accused_clusters": list(cause.accused_clusters), "in_drop": in_drop,
                     **fields})
    accused = [row for row in rows if row["in_drop"]]
    if not accused:
        return rows, None
    numbers = [row["cause"] for row in accused]
    if len(accused) == 1:  # one dropped cause: its own row is the pooled figure, no second bootstrap
        fields = {key: value for key, value in accused[0].items() if key not in ("cause", "accused_clusters", "in_drop")}
        return rows, {"causes": numbers, **fields}
    items = {item for row in accused for item in row["items"]}
    return rows, {"causes": numbers, **(_subset_fields(ids, items, base, full, dropped, controls, boot) or {})}


def _full_model_why(plan: VerifyPlan) -> str:
    if not plan.retrain_full:
        return ("the adapter the report attributed; if it was trained with another trainer or config than the "
                "retrained models, part of the recovery is that difference: rerun with --retrain-full")
    if plan.adapter is None:
        return "no original adapter was given, so the full dataset was retrained with the dropped models' settings"
    return ("retrained with the same backend, config and seed as the dropped models, so only the dropped "
            "examples differ (--retrain-full)")


def _verify_verdict(result: Mapping[str, Any]) -> tuple[str, str]:
    ev, drop = result["evaluation"], result["drop"]
    dropped = next(row for row in result["models"] if row["role"] == "dropped")
    controls = [row for row in result["models"] if row["role"] == "control"]
    named = drop.get("clusters") or ([drop["cluster"]] if drop["cluster"] else [])  # older files: "cluster" only
    what = (", ".join(f"`{name}`" for name in named) + f" ({drop['size']} examples)" if named
            else drop.get("label") or f"{drop['size']} listed examples")  # older files have no label
    level = f"{ev['confidence']:.0%}"
    if ev["lost"] <= 0:
        headline = (f"Nothing to recover: the full model scores {ev['full_mean']:.4g} and the base {ev['base_mean']:.4g} "
                    f"on {ev['metric']}.")
        return headline, "The fine-tune did not lose capability on this eval set, so no drop can give any back."
    headline = (f"Dropping {what} recovered {_fraction_text(dropped, level)} of the capability the fine-tune lost "
                f"({ev['metric']})")
    if controls:
        headline += "; random drops of the same size recovered " + ", ".join(
            _fraction_text(row, level) for row in controls)
    headline += "."
    summary = (f"{ev['metric']}: base {ev['base_mean']:.4g}, full {ev['full_mean']:.4g} ({result['inputs']['full_model']}), "
               f"lost {ev['lost']:.4g}; without {what}: {dropped['mean']:.4g} (recovered {dropped['recovered']:+.4g}, "
               f"{level} CI [{dropped['recovered_low']:+.4g}, {dropped['recovered_high']:+.4g}]).")
    for comparison in result["comparisons"]:
        summary += (f" Accused minus {comparison['control']}: {comparison['delta']:+.4g} "
                    f"[{comparison['low']:+.4g}, {comparison['high']:+.4g}].")
    summary += _items_text(result.get("regressed_items"), what)
    summary += _accused_causes_text(result.get("accused_causes"), controls, level)
    summary += (" Confirmed: the drop recovered significantly more than nothing and than every control."
                if result["verdict"]["confirmed"] else
                " Not confirmed: the recovery is not significantly above zero or above every control.")
    return headline, summary


def _items_text(by_item: Mapping[str, Any] | None, what: str) -> str:
    """The regressed items the drop gave back, and those no retrain moved; '' for files written before."""
    if not by_item or not by_item["count"]:
        return ""
    text = (f" Of the {by_item['count']} regressed items, {len(by_item['back'])} came back to the base's score "
            f"without {what}")
    if not by_item["stuck"]:
        return text + "."
    return text + (f"; {len(by_item['stuck'])} stayed at or under the full model's score in every retrained model: "
                   "what regresses those is shared by every retrain (the training settings, or rows no drop "
                   "removed), and it caps the fraction this drop can recover.")


def _accused_causes_text(pooled: Mapping[str, Any] | None, controls: Sequence[Mapping[str, Any]], level: str) -> str:
    """The recovery on the items of the causes whose clusters were dropped; '' when there are none (or older files)."""
    if not pooled or not pooled.get("items"):
        return ""
    numbers = pooled["causes"]
    which = f"cause {numbers[0]}" if len(numbers) == 1 else "causes " + ", ".join(str(n) for n in numbers)
    text = (f" On the {len(pooled['items'])} items of {which}, which the report attributes to what was dropped, "
            f"the drop gave back {_fraction_text(pooled, level)}")
    if controls:
        text += "; random drops " + ", ".join(_fraction_text(pooled["controls"][row["name"]], level)
                                              for row in controls)
    return text + "."


def _fraction_text(row: Mapping[str, Any], level: str | None = None) -> str:
    """A recovered fraction with its interval: "84% (95% CI 71% to 97%)" for prose, "84% [71%, 97%]" for a table."""
    if row.get("fraction") is None:
        return "an undefined fraction" if level else ""
    text = f"{row['fraction']:.0%}"
    if row.get("fraction_low") is not None:
        low, high = f"{row['fraction_low']:.0%}", f"{row['fraction_high']:.0%}"
        text += f" ({level} CI {low} to {high})" if level else f" [{low}, {high}]"
    return text


def verify_markdown(result: Mapping[str, Any]) -> str:
    """verify.md: verdict first, then the models table, the comparisons, the inputs and the per-item scores."""
    ev, inputs = result["evaluation"], result["inputs"]
    lines = ["# gradian verify", "", f"**{result['verdict']['headline']}**", "", result["verdict"]["summary"], "",
             "## Models", "",
             f"Recovered fraction = (score without the drop set - score of the full model) / (base - full), per "
             f"{ev['metric']} over {ev['n_items']} eval items; {ev['confidence']:.0%} intervals from a paired bootstrap "
             f"over items ({ev['bootstrap_samples']} resamples, seed {ev['seed']}).", "",
             "| model | dropped | mean | recovered (CI) | fraction (CI) | steps | final loss |",
             "|---|---|---|---|---|---|---|"]
    lines.append(f"| base (adapter off) | - | {ev['base_mean']:.4g} | | | | |")
    for row in result["models"]:
        training = row.get("training") or {}
        dropped = training.get("dropped", 0) if row["role"] != "full" else 0
        recovered = (f"{row['recovered']:+.4g} [{row['recovered_low']:+.4g}, {row['recovered_high']:+.4g}]"
                     if "recovered" in row else "")
        fraction = _fraction_text(row)
        loss = training.get("final_loss")
        label = row["name"] + (f" ({row['source']})" if row["role"] == "full" else "")
        lines.append(f"| {label} | {dropped} | {row['mean']:.4g} | {recovered} | {fraction} | "
                     f"{training.get('steps', '')} | {'' if loss is None else f'{loss:.4f}'} |")
    if result["comparisons"]:
        lines += ["", "## Accused vs controls", "", "| control | accused minus control | CI | significant |",
                  "|---|---|---|---|"]
        lines += [f"| {c['control']} | {c['delta']:+.4g} | [{c['low']:+.4g}, {c['high']:+.4g}] | "
                  f"{'yes' if c['significant'] else 'no'} |" for c in result["comparisons"]]
    stuck = (result.get("regressed_items") or {}).get("stuck") or []
    if stuck:
        wanted = {item["id"]: item["wanted"] for item in result["items"]}
        lines += ["", "## Regressed items no retrain gave back", "",
                  "Each scores at or under the full model in every retrained model (the accused drop and each "
                  "control): what regresses them is not in the drop set alone.", ""]
        lines += [f"- {item}: wanted {_cell(wanted[item])}" for item in stuck]
    lines += _causes_lines(result.get("causes"), names=[row["name"] for row in result["models"]
                                                        if row["role"] == "control"])
    drop = result["drop"]
    lines += ["", "## What was dropped", "", f"- {drop['origin']}: {drop['size']} examples",
              f"- controls: {result['controls']['count']} ({result['controls']['how']}; seed {result['controls']['seed']})",
              "", "## Inputs", "",
              f"- base model: `{inputs['base_model']}`",
              f"- dataset: `{inputs['dataset']}` ({inputs['n_examples']} examples, sha256 {inputs['dataset_sha256'][:16]})",
              f"- eval set: `{inputs['eval_dataset']}`",
              f"- full model: {inputs['full_model']}" + (f" (`{inputs['adapter']}`)" if inputs["adapter"] else "")
              + f" - {inputs['full_model_why']}",
              f"- backend: {inputs['backend']}; config: " + "; ".join(inputs["config_sources"]),
              f"- base scores identical across every evaluation: {'yes' if ev['base_scores_consistent'] else 'NO'}"]
    if result.get("command"):
        lines += [f"- command: `{result['command']}`"]
    names = [row["name"] for row in result["models"] if row["role"] != "full"]
    lines += ["", "## Per item", "", "| item | wanted | base | full | " + " | ".join(names) + " |",
              "|---|---|---|---|" + "---|" * len(names)]
    for item in result["items"]:
        lines.append(f"| {item['id']} | {_cell(item['wanted'])} | {item['base']:.3g} | {item['full']:.3g} | "
                     + " | ".join(f"{item[name]:.3g}" for name in names) + " |")
    return "\n".join(lines) + "\n"


def _causes_lines(causes: Sequence[Mapping[str, Any]] | None, names: Sequence[str]) -> list[str]:
    """verify.md's per-cause table: each of the report's causes and the share of its items' loss each retrain gave back."""
    if not causes:
        return []
    lines = ["", "## Per cause", "",
             "The report split the regressed items into causes by their query gradients. Per cause, the fraction of "
             "its own items' lost capability that each retrained model gave back: dropping a cause's accused "
             "clusters should give back that cause's items. A cause of a few items has an interval that says little.", "",
             "| cause | items | accused | dropped here | lost | without the drop set | " + " | ".join(names) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(names)]
    for cause in causes:
        accused = ", ".join(f"`{name}`" for name in cause["accused_clusters"]) or "nothing"
        lines.append(f"| {cause['cause']} | {len(cause['items'])} | {accused} | {'yes' if cause['in_drop'] else 'no'} | "
                     f"{cause['lost']:.4g} | {_fraction_text(cause)} | "
                     + " | ".join(_fraction_text(cause["controls"][name]) for name in names) + " |")
    return lines


def write_verify(result: Mapping[str, Any], out: Path) -> tuple[Path, Path]:
    """Write verify.json and verify.md into ``out`` atomically."""
    return _write_pair(result, out, VERIFY_JSON, VERIFY_MD, verify_markdown)


# --- inject ---------------------------------------------------------------------------------------


def inject_markdown(result: Mapping[str, Any]) -> str:
    """inject.md: pass or fail first, then the planted cluster's rank, recall@k and the inputs."""
    m, inputs = result["metrics"], result["inputs"]
    lines = ["# gradian inject", "", f"**{result['verdict']['headline']}**", "", result["verdict"]["summary"], "",
             "## Metrics", "",
             "| metric | value |", "|---|---|",
             f"| planted cluster rank | {_maybe(m['cluster_rank'])} of {_maybe(m['n_clusters'])} |",
             f"| planted cluster accused | {'yes' if m['accused'] else 'no'} (accused: {_maybe(m['accused_cluster'])}) |",
             f"| recall@{m['k']} (planted among the top {m['k']} / planted) | {_maybe(m['recall_at_k'], '.3f')} |",
             f"| precision@{m['k']} (planted share of the top {m['k']}) | {_maybe(m['precision_at_k'], '.3f')} |",
             f"| rank of the first planted example | {_maybe(m['first_planted_rank'])} |",
             f"| examples ranked in the report | {m['ranked_listed']} |",
             "", "## Inputs", "",
             f"- base model: `{inputs['base_model']}`",
             f"- dataset: `{inputs['dataset']}` ({inputs['n_clean']} rows) + poison `{inputs['poison']}` "
             f"({inputs['n_planted']} rows, planted as `{inputs['cluster_field']}: {inputs['label']}`)",
             f"- combined training set: `{inputs['combined_dataset']}`",
             f"- eval set: `{inputs['eval_dataset']}`",
             f"- backend: {inputs['backend']}; attribution report: `{inputs['report']}`"]
    training = result.get("training")
    if training:
        loss = training.get("final_loss")
        lines.append(f"- training: {training['steps']} steps, final loss {'n/a' if loss is None else f'{loss:.4f}'}"
                     + (" (reused)" if training.get("reused") else ""))
    if result.get("command"):
        lines.append(f"- command: `{result['command']}`")
    ranked = result.get("clusters") or []
    if ranked:
        lines += ["", "## Clusters", "", "| rank | cluster | size | z | family-wise p |", "|---|---|---|---|---|"]
        lines += [f"| {c['rank']} | {c['name']}{' (planted)' if c['name'] == inputs['label'] else ''} | {c['size']} | "
                  f"{c['z']:.3g} | {c['p_adjusted']:.3g} |" for c in ranked]
    return "\n".join(lines) + "\n"


def write_inject(result: Mapping[str, Any], out: Path) -> tuple[Path, Path]:
    """Write inject.json and inject.md into ``out`` atomically."""
    return _write_pair(result, out, INJECT_JSON, INJECT_MD, inject_markdown)


# --- shared -------------------------------------------------------------------------------------


def _write_pair(result: Mapping[str, Any], out: Path, json_name: str, md_name: str,
                render: Callable[[Mapping[str, Any]], str]) -> tuple[Path, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / json_name, out / md_name
    write_atomic(json_path, (json.dumps(result, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8"))
    write_atomic(md_path, render(result).encode("utf-8"))
    return json_path, md_path


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _cell(text: Any) -> str:
    flat = " ".join(str(text or "").split()).replace("|", "\\|")
    return flat if len(flat) <= 60 else flat[:59] + "…"


def _maybe(value: Any, spec: str = "") -> str:
    return "n/a" if value is None else format(value, spec)
