"""`--plots DIR`: loss, grad-norm and learning-rate curves as PNG, with the flagged steps marked."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from gradian.atomic_files import atomic_path
from gradian.diagnose.runner import DiagnoseReport
from gradian.errors import GradianError
from gradian.records import RunArtifact

CURVES = (("loss", "loss", "train loss"), ("grad_norm", "grad_norm", "grad norm"), ("learning_rate", "learning_rate", "learning rate"))


class PlotsUnavailableError(GradianError):
    """matplotlib is not installed."""


def _pyplot() -> ModuleType:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as pyplot
    except ImportError:
        raise PlotsUnavailableError("--plots needs matplotlib, which is not installed",
                                    "pip install matplotlib (or pip install 'gradian-core[plots]')") from None
    return pyplot


def write_plots(report: DiagnoseReport, run: RunArtifact, out_dir: Path) -> list[Path]:
    """Write one PNG per logged curve into ``out_dir``; flagged steps are marked with their check ids."""
    pyplot = _pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    flagged = report.flagged_steps()
    written = []
    for name, attribute, title in CURVES:
        points = [(p.step, getattr(p, attribute)) for p in run.metrics if getattr(p, attribute) is not None]
        if not points:
            continue
        figure, axes = pyplot.subplots(figsize=(8, 3.5), dpi=100)
        steps, values = zip(*points, strict=True)
        axes.plot(steps, values, linewidth=1.2, label=title)
        if name == "loss":
            evals = [(p.step, p.eval_loss) for p in run.metrics if p.eval_loss is not None]
            if evals:
                axes.plot(*zip(*evals, strict=True), marker="o", linewidth=1.0, label="eval loss")
        by_step = dict(points)
        for check_id, check_steps in sorted(flagged.items()):
            marked = [(s, by_step[s]) for s in check_steps if s in by_step]
            if marked:
                axes.scatter(*zip(*marked, strict=True), marker="x", s=50, zorder=3, label=check_id)
        axes.set_xlabel("step")
        axes.set_title(f"{title} ({run.path.name})")
        axes.legend(fontsize="small")
        figure.tight_layout()
        target = out_dir / f"{name}.png"
        try:
            with atomic_path(target) as temp:
                figure.savefig(temp, format="png")
        finally:
            pyplot.close(figure)
        written.append(target)
    return written
