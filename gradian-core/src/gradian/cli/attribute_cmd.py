"""`gradian attribute`: which training data pushed the model toward the regression."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from gradian.cli.options import (
    AdapterOption,
    AllowPickleFlag,
    BaseModelOption,
    ConfigOption,
    DatasetOption,
    DeviceOption,
    DtypeOption,
    EvalDatasetOption,
    FormatOption,
    RunOption,
    SetOption,
    TokenizerOption,
    TrustRemoteCodeFlag,
    check_tokenizer_dir,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gradian.report.reader import Report

OutOption = Annotated[Optional[Path], typer.Option("--out", help="Report directory (report.md, report.html, report.json, scores.csv, plots).")]
IndexOption = Annotated[Optional[Path], typer.Option("--index", help="Gradient index directory (default: the cache, keyed by the index id); one holding the index of other inputs is refused, not overwritten.")]
EvalFormatOption = Annotated[Optional[str], typer.Option(
    "--eval-format", help="Declare the eval set's row format (messages, sharegpt, prompt_completion, alpaca); "
                          "a row in another format is an error.")]


def attribute(
    base_model: BaseModelOption = None,
    adapter: AdapterOption = None,
    dataset: DatasetOption = None,
    eval_dataset: EvalDatasetOption = None,
    eval_format: EvalFormatOption = None,
    run: RunOption = None,
    out: OutOption = None,
    index: IndexOption = None,
    config: ConfigOption = None,
    set_: SetOption = None,
    allow_pickle: AllowPickleFlag = False,
    trust_remote_code: TrustRemoteCodeFlag = False,
    tokenizer: TokenizerOption = None,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
    output_format: FormatOption = "table",
) -> None:
    """Measure the regression, then rank the examples, clusters and sentences that pushed the model toward it."""
    from gradian.cli.app import invoked_command
    from gradian.cli.options import load_cli_config
    from gradian.cli.output import libraries_quiet, note
    from gradian.cli.output import output_format as check_format
    from gradian.cli.progress import stage_bars
    from gradian.errors import ConfigError
    from gradian.model.base import base_model_for
    from gradian.model.loaded import require_adapter
    from gradian.model.placement import resolve_placement
    from gradian.pipelines.attribute import attribute as run_attribution

    fmt = check_format(output_format)
    placement = resolve_placement(device, dtype)  # before anything is read: a bad --device writes nothing
    require_adapter(adapter, "attribute")
    if dataset is None:
        raise ConfigError("gradian attribute needs --dataset", "pass the exact training data, in the same order")
    if out is None:
        raise ConfigError("gradian attribute needs --out", "pass a directory for report.md and report.json")
    from gradian.output_location import check_output_dir

    check_output_dir(out, "--out")  # before the model loads: a bad --out must not cost the whole run
    check_tokenizer_dir(tokenizer)
    base_model = base_model_for(base_model, adapter, "attribute")  # default: the base the adapter names
    cfg = load_cli_config(config, set_)
    if run is not None:  # a run dir that cannot be read is refused now, not after the model and the index
        from gradian.runs import read_run

        read_run(Path(run))
    with stage_bars() as bars, libraries_quiet():  # no transformers bars or warnings between ours and an error
        outcome = run_attribution(base_model=base_model, adapter=adapter, dataset=dataset, out=out,
                                  eval_dataset=eval_dataset, run=run, config=cfg, index_dir=index,
                                  allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, progress=bars,
                                  command=invoked_command(), eval_format=eval_format,
                                  refuse_other_index=index is not None, device=placement.device,
                                  dtype=placement.dtype, tokenizer=tokenizer,
                                  say=note)
    print_outcome(outcome, fmt)


def print_outcome(outcome: Any, fmt: str) -> None:
    """The result on stdout in ``fmt`` (json: report.json, md: report.md); timings and file names on stderr."""
    from gradian.cli.output import is_quiet, note
    from gradian.report.reader import REPORT_FILE

    stages = "stages: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in outcome.timings.items())
    if fmt == "json":
        typer.echo((outcome.out_dir / REPORT_FILE).read_text(encoding="utf-8"), nl=False)
    elif fmt == "md":
        typer.echo((outcome.out_dir / "report.md").read_text(encoding="utf-8"), nl=False)
    else:
        typer.echo(verdict_text(outcome.parsed))
        echo_next_step(outcome.parsed.document, outcome.out_dir)
        if not is_quiet():
            typer.echo(stages)
        typer.echo(f"report: {outcome.out_dir / 'report.md'} (also report.html; every score in scores.csv)")
        return
    note(stages)
    note(f"report: {outcome.out_dir / 'report.md'}")


def echo_next_step(document: Mapping[str, Any], directory: Path) -> None:
    """Print the report's next step (what to run to check it) for a terminal, if it has one."""
    from gradian.report.json_report import next_step

    step = next_step(document, directory)
    if step:
        typer.echo(step.replace("`", ""))


def verdict_text(report: Report) -> str:
    """The verdict as a few terminal lines: headline, delta with CI, accused cluster, top examples."""
    verdict, lines = report.verdict, [report.verdict.headline]
    capability = report.capability
    if capability:
        lines.append(f"capability ({capability.metric}): base {capability.base_mean:.3f} -> fine-tuned "
                     f"{capability.finetuned_mean:.3f}, delta {capability.delta:+.3f} "
                     f"[{capability.ci_low:+.3f}, {capability.ci_high:+.3f}] "
                     f"({capability.confidence:.0%} CI, {capability.n_items} items)")
    clusters = report.clusters
    accused = [row for row in clusters if row.accused]
    # The first accused cluster is the verdict's (most blamed per member); others follow in the report's order.
    accused.sort(key=lambda row: row.name != verdict.accused_cluster)
    for row in accused or clusters[:1]:
        label = "accused cluster" if row.accused else "top cluster (not accused)"
        lines.append(f"{label}: {row.name} (rank {row.rank} of {len(clusters)}, {row.size} examples, "
                     f"p = {row.p_value:.3g}, family-wise p = {row.p_adjusted:.3g})")
    shown = {row.name for row in accused}
    # A cluster accused by another cause of the regression: the ranked table is cause 1's, so its numbers are not here.
    lines += [f"accused cluster: {name} (by another cause among the regressed items; see Causes in the report)"
              for name in report.accused_names if name not in shown]
    for row in report.top_examples[:5]:
        lines.append(f"  #{row.rank} {row.id} blame {row.blame:+.3g} [{row.cluster or '-'}] {row.excerpt[:80]!r}")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("attribute")(attribute)
