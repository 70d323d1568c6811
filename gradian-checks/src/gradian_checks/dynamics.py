"""Dynamics checks: what the logged loss, grad norm, learning rate and eval loss say about the run."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gradian.file_names import TRAINER_STATE
from gradian.records import Evidence
from gradian_checks.config import DECAYING_SCHEDULES, total_steps
from gradian_checks.registry import CheckFamily, Hit, count, point_evidence

family = CheckFamily("dynamics")


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


@family.check(
    "nan_or_inf", "error",
    "NaN/inf in loss, grad_norm or eval_loss",
    "lower the learning rate, keep gradient clipping on, and train in bf16 rather than fp16; resume from the "
    "last checkpoint before the first NaN",
    needs={"run_logs"},
)
def nan_or_inf(ctx: Any) -> Iterator[Hit]:
    """Non-finite values anywhere in the logs."""
    evidence = []
    for point in ctx.run.metrics:
        bad = {name: getattr(point, name) for name in ("loss", "grad_norm", "eval_loss")
               if getattr(point, name) is not None and not math.isfinite(getattr(point, name))}
        if bad:
            shown = ", ".join(f"{k} = {v}" for k, v in bad.items())
            evidence.append(point_evidence(ctx, point, f"step {point.step}: {shown}", **{k: str(v) for k, v in bad.items()}))
    if evidence:
        yield Hit(f"NaN or inf at {count(len(evidence), 'logged step')}, first at step {evidence[0].steps[0]}", tuple(evidence))


@family.check(
    "loss_collapse_zero", "error",
    "loss == 0.0 for 2 or more consecutive logs",
    "the labels are (nearly) all masked or the loss is broken: check the loss mask, the data collator and the "
    "learning rate",
    needs={"run_logs"},
)
def loss_collapse_zero(ctx: Any) -> Iterator[Hit]:
    """Runs of exactly-zero loss."""
    points = ctx.train_points()
    runs, current = [], []
    for point in points:
        if point.loss == 0.0:
            current.append(point)
            continue
        if len(current) >= ctx.config.diagnose.loss_zero_consecutive:
            runs.append(current)
        current = []
    if len(current) >= ctx.config.diagnose.loss_zero_consecutive:
        runs.append(current)
    if runs:
        evidence = tuple(Evidence(f"loss 0.0 from step {r[0].step} to {r[-1].step} ({len(r)} logs)",
                                  location=ctx.metric_location(r[0]), steps=tuple(p.step for p in r)) for r in runs)
        yield Hit(f"loss is exactly 0.0 for {count(sum(len(r) for r in runs), 'log')}", evidence)


@family.check(
    "grad_norm_zero", "error",
    "grad_norm == 0 throughout",
    "nothing is being trained: check that the LoRA parameters require grad, that labels are not all -100, and "
    "that the optimizer holds the adapter's parameters",
    needs={"run_logs"},
)
def grad_norm_zero(ctx: Any) -> Iterator[Hit]:
    """A gradient norm that is zero at every logged step."""
    norms = [p for p in ctx.run.metrics if p.grad_norm is not None]
    if norms and all(p.grad_norm == 0 for p in norms):
        yield Hit(f"grad_norm is 0 at all {len(norms)} logged steps",
                  (point_evidence(ctx, norms[0], f"steps {norms[0].step}-{norms[-1].step}: grad_norm = 0"),))


@family.check(
    "adapter_untrained", "error",
    "every lora_B tensor in the adapter has near-zero norm",
    "the adapter never moved from its initialization (lora_B starts at zero): check that training ran, that "
    "the learning rate is not 0 and that the saved adapter is the trained one",
    needs={"adapter"},
)
def adapter_untrained(ctx: Any) -> Iterator[Hit]:
    """An adapter whose B matrices are still (near) zero."""
    adapter = ctx.adapter
    names = adapter.lora_b_names()
    if not names:
        return
    norms = adapter.norms(names)
    largest = max(norms.values())
    if largest <= ctx.config.diagnose.adapter_zero_norm:
        yield Hit(f"all {len(names)} lora_B tensors have norm ≤ {ctx.config.diagnose.adapter_zero_norm:g} (largest {largest:.3g})",
                  (Evidence(f"{len(names)} lora_B tensors, largest norm {largest:.3g}", location=adapter.weights.as_posix(),
                            values={"largest_norm": largest}),))


@family.check(
    "loss_spike", "warning",
    "loss > 2x the rolling median (not the oscillation group_by_length causes)",
    "find the batch at the flagged steps (bad or very long examples), lower the learning rate, keep clipping on",
    needs={"run_logs"},
)
def loss_spike(ctx: Any) -> Iterator[Hit]:
    """Isolated jumps of the loss above its recent median."""
    t = ctx.config.diagnose
    points = [p for p in ctx.train_points() if _finite(p.loss)]
    spikes = []
    for index in range(3, len(points)):
        window = [p.loss for p in points[max(0, index - t.loss_spike_window):index]]
        median = statistics.median(window)
        if median > 0 and points[index].loss > t.loss_spike_factor * median:
            spikes.append((points[index], median))
    if not spikes:
        return
    if len(spikes) / len(points) > t.loss_spike_max_fraction:
        return  # too many to be spikes: the periodic swing of group_by_length / length-sorted batches
    evidence = tuple(point_evidence(ctx, p, f"step {p.step}: loss {p.loss:.4g} vs rolling median {m:.4g}",
                                    loss=p.loss, median=m) for p, m in spikes)
    yield Hit(f"{count(len(spikes), 'loss spike')} above {t.loss_spike_factor:g}x the rolling median", evidence)


@family.check(
    "grad_norm_explosion", "warning",
    "grad_norm > 100 or > 10x its median",
    "lower the learning rate and keep max_grad_norm at 1.0; look at the batches at the flagged steps",
    needs={"run_logs"},
)
def grad_norm_explosion(ctx: Any) -> Iterator[Hit]:
    """Gradient norms far above the usual."""
    t = ctx.config.diagnose
    points = [p for p in ctx.run.metrics if _finite(p.grad_norm)]
    if not points:
        return
    median = statistics.median(p.grad_norm for p in points)
    bad = [p for p in points if p.grad_norm > t.grad_norm_max or (median > 0 and p.grad_norm > t.grad_norm_median_factor * median)]
    if bad:
        evidence = tuple(point_evidence(ctx, p, f"step {p.step}: grad_norm {p.grad_norm:.4g} (median {median:.3g})",
                                        grad_norm=p.grad_norm) for p in bad)
        yield Hit(f"grad_norm explodes at {count(len(bad), 'step')} (largest {max(p.grad_norm for p in bad):.4g}, median {median:.3g})",
                  evidence)


@family.check(
    "implausible_initial_loss", "warning",
    "first loss > ln(vocab size)",
    "a loss above uniform guessing means the labels are misaligned, the chat template is wrong, or the base "
    "model did not load its weights",
    needs={"run_logs", "tokenizer"},
)
def implausible_initial_loss(ctx: Any) -> Iterator[Hit]:
    """A starting loss worse than guessing uniformly over the vocabulary."""
    points = [p for p in ctx.train_points() if _finite(p.loss)]
    if not points:
        return
    vocab = len(ctx.tokenizer)
    bound = math.log(vocab)
    first = points[0]
    if first.loss > bound:
        yield Hit(f"the first logged loss {first.loss:.4g} is above ln({vocab}) = {bound:.4g}, worse than uniform guessing",
                  (point_evidence(ctx, first, f"step {first.step}: loss {first.loss:.4g}", loss=first.loss, bound=bound),))


@family.check(
    "eval_loss_rising", "warning",
    "eval_loss rises 2 or more consecutive evals while the train loss falls",
    "the run over-fits: stop at the best step (load_best_model_at_end / EarlyStoppingCallback), train fewer "
    "epochs or lower the learning rate",
    needs={"run_logs"},
)
def eval_loss_rising(ctx: Any) -> Iterator[Hit]:
    """Held-out loss climbing while training loss keeps dropping."""
    evals = [p for p in ctx.eval_points() if _finite(p.eval_loss)]
    train = [p for p in ctx.train_points() if _finite(p.loss)]
    need = ctx.config.diagnose.eval_rising_consecutive
    if len(evals) < need + 1 or not train:
        return

    def train_loss_at(step: int) -> float | None:
        before = [p.loss for p in train if p.step <= step][-3:]
        return statistics.fmean(before) if before else None

    best = min(evals, key=lambda p: p.eval_loss)
    rises = 0
    for previous, current in zip(evals, evals[1:], strict=False):
        rises = rises + 1 if current.eval_loss > previous.eval_loss else 0
        if rises >= need:
            start = evals[evals.index(current) - rises]
            before, after = train_loss_at(start.step), train_loss_at(current.step)
            if before is not None and after is not None and after < before:
                yield Hit(f"eval_loss rose {rises} evals in a row (step {start.step} {start.eval_loss:.4g} → step "
                          f"{current.step} {current.eval_loss:.4g}) while train loss fell; best eval_loss "
                          f"{best.eval_loss:.4g} at step {best.step}",
                          (point_evidence(ctx, current, f"eval_loss {start.eval_loss:.4g} → {current.eval_loss:.4g}",
                                          best_step=best.step),
                           point_evidence(ctx, best, f"best eval_loss {best.eval_loss:.4g} at step {best.step}")))
                return


@family.check(
    "memorization", "warning",
    "train loss < 0.1 or mean_token_accuracy >= 0.99",
    "the adapter memorizes the training set: fewer epochs, a lower learning rate, more data; healthy SFT loss "
    "stays around 0.5-2.0",
    needs={"run_logs"},
)
def memorization(ctx: Any) -> Iterator[Hit]:
    """A training loss (or token accuracy) only memorization reaches."""
    t = ctx.config.diagnose
    points = [p for p in ctx.train_points() if _finite(p.loss)]
    if points:
        tail = points[-max(1, len(points) // 10):]
        final = statistics.fmean(p.loss for p in tail)
        if final < t.memorization_loss:
            first = next(p for p in points if p.loss < t.memorization_loss)
            yield Hit(f"final train loss {final:.3g} is below {t.memorization_loss:g} (first under it at step {first.step})",
                      (point_evidence(ctx, first, f"step {first.step}: loss {first.loss:.3g}", loss=first.loss),))

            return
    accurate = [p for p in ctx.run.metrics if p.mean_token_accuracy is not None]
    if accurate and accurate[-1].mean_token_accuracy >= t.memorization_accuracy:
        last = accurate[-1]
        yield Hit(f"mean_token_accuracy reaches {last.mean_token_accuracy:.3f}",
                  (point_evidence(ctx, last, f"step {last.step}: mean_token_accuracy {last.mean_token_accuracy:.3f}"),))


@family.check(
    "epoch_boundary_drops", "info",
    "sharp loss drops at epoch boundaries",
    "the model recognizes examples it has seen: fewer epochs, more data, or stop after the first epoch",
    needs={"run_logs"},
)
def epoch_boundary_drops(ctx: Any) -> Iterator[Hit]:
    """Staircase loss curves: the loss falls sharply each time an epoch starts over."""
    points = [p for p in ctx.train_points() if _finite(p.loss) and p.epoch is not None]
    if len(points) < 4:
        return
    evidence = []
    for index in range(1, len(points)):
        boundary = math.floor(points[index - 1].epoch + 1e-9) + 1
        if not (points[index - 1].epoch < boundary <= points[index].epoch + 1e-9) or boundary <= 0:
            continue
        per_epoch = sum(1 for p in points if p.epoch <= 1.0 + 1e-9)
        width = max(1, min(5, per_epoch // 4))
        before = [p.loss for p in points[max(0, index - width):index]]
        after = [p.loss for p in points[index:index + width]]
        if len(after) < width or not before:
            continue
        mean_before, mean_after = statistics.fmean(before), statistics.fmean(after)
        if mean_before > 0 and (mean_before - mean_after) / mean_before >= ctx.config.diagnose.epoch_drop_fraction:
            evidence.append(point_evidence(ctx, points[index], f"epoch {boundary}: loss {mean_before:.3g} → {mean_after:.3g}",
                                           before=mean_before, after=mean_after))
    if evidence:
        yield Hit(f"the loss drops sharply at {len(evidence)} epoch {'boundary' if len(evidence) == 1 else 'boundaries'}", tuple(evidence))


@family.check(
    "loss_plateau", "warning",
    "less than 5% loss improvement from the first to the last quarter",
    "the run is not learning: raise the learning rate (LoRA wants 1e-4 to 2e-4), check the loss mask and that "
    "the LoRA targets cover the MLP",
    needs={"run_logs"},
)
def loss_plateau(ctx: Any) -> Iterator[Hit]:
    """A loss curve that does not go down."""
    points = [p for p in ctx.train_points() if _finite(p.loss)]
    if len(points) < 8:
        return
    quarter = len(points) // 4
    first = statistics.fmean(p.loss for p in points[:quarter])
    last = statistics.fmean(p.loss for p in points[-quarter:])
    if first <= ctx.config.diagnose.memorization_loss:
        return
    improvement = (first - last) / first
    if improvement < ctx.config.diagnose.plateau_improvement:
        change = f"improves only {improvement:.1%}" if improvement >= 0 else f"gets {-improvement:.1%} worse"
        yield Hit(f"loss {change} from the first quarter ({first:.4g}) to the last ({last:.4g})",
                  (point_evidence(ctx, points[0], f"steps {points[0].step}-{points[quarter - 1].step}: mean {first:.4g}"),
                   point_evidence(ctx, points[-1], f"steps {points[-quarter].step}-{points[-1].step}: mean {last:.4g}")))


@family.check(
    "lr_schedule_mismatch", "warning",
    "the logged learning rate does not follow the configured schedule (constant or 0 where decay was set)",
    "check the scheduler the trainer really built (lr_scheduler_type, a custom optimizer without its "
    "scheduler, a resumed run whose scheduler state was lost)",
    needs={"run_logs"},
)
def lr_schedule_mismatch(ctx: Any) -> Iterator[Hit]:
    """Logged learning rates that contradict the configured schedule."""
    cfg = ctx.run.config
    points = [p for p in ctx.run.metrics if _finite(p.learning_rate)]
    if len(points) < 3:
        return
    rates = [p.learning_rate for p in points]
    if all(rate == 0 for rate in rates):
        yield Hit(f"the logged learning rate is 0 at all {len(points)} logged steps",
                  (point_evidence(ctx, points[0], f"steps {points[0].step}-{points[-1].step}: learning_rate 0"),))
        return
    schedule = (cfg.lr_scheduler or "").lower()
    warmup = cfg.warmup_steps or (cfg.warmup_ratio or 0) * (total_steps(ctx) or 0)
    after = [p for p in points if p.step > warmup]
    if schedule in DECAYING_SCHEDULES and len(after) >= 3 and max(p.learning_rate for p in after) == min(p.learning_rate for p in after):
        yield Hit(f"lr_scheduler is {schedule} but the learning rate stays at {after[0].learning_rate:g} "
                  f"from step {after[0].step} to {after[-1].step}",
                  (point_evidence(ctx, after[-1], f"step {after[-1].step}: learning_rate {after[-1].learning_rate:g}"),))
        return
    peak = max(rates)
    if cfg.learning_rate and (peak > 2 * cfg.learning_rate or peak < cfg.learning_rate / 2):
        top = max(points, key=lambda p: p.learning_rate)
        yield Hit(f"the peak logged learning rate {peak:g} is not the configured {cfg.learning_rate:g}",
                  (point_evidence(ctx, top, f"step {top.step}: learning_rate {peak:g}"),))


def _checkpoint_state_note(run: Any) -> str:
    """Which checkpoint's trainer_state.json the step came from, when the run dir has none at the top level."""
    state = run.sources.get(TRAINER_STATE)
    if not state or Path(state).parent == Path(run.path):
        return ""
    # The user should know the step is the latest checkpoint's: a run that went on unsaved looks the same.
    return f" (read from {Path(state).parent.name}/trainer_state.json, the latest checkpoint: there is none at the top level)"


@family.check(
    "run_incomplete", "warning",
    "global_step < max_steps or no final summary entry (the run crashed or was stopped)",
    "the adapter is from an unfinished run: resume from the last checkpoint, or diagnose the run that finished",
    needs={"run_config"},
)
def run_incomplete(ctx: Any) -> Iterator[Hit]:
    """A run that stopped before its planned end."""
    run, cfg = ctx.run, ctx.run.config
    if run.global_step is not None and cfg.max_steps and run.global_step < cfg.max_steps:
        yield Hit(f"the run stopped at step {run.global_step} of {cfg.max_steps}{_checkpoint_state_note(run)}",
                  (Evidence(f"global_step {run.global_step} < max_steps {cfg.max_steps}",
                            location=run.sources.get("global_step") or run.sources.get("max_steps"),
                            steps=(run.global_step,), values={"global_step": run.global_step, "max_steps": cfg.max_steps}),))
    elif run.finished is False:
        yield Hit("the logs have no final summary entry (train_runtime): the run crashed or was stopped",
                  (Evidence("no final summary entry", location=run.sources.get("metrics") or run.sources.get("global_step")),))


CHECKS = tuple(family.checks)
