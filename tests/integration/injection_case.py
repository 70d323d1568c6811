"""The tiny planted-cluster scenario (tests/support/scenario.py) as `gradian inject` takes it, run once per session.

The scenario's base model knows twenty capitals; its training set mixes several sources with a planted cluster
that substitutes a wrong city for 14 of them. Here the planted rows become the ``--poison`` file and the rest the
clean ``--dataset``. Everything runs on one torch thread, which is several times faster for models this small
on a shared machine (the whole case builds in seconds).

``inject_runs`` runs `gradian inject` twice into one directory: first against an eval set of countries the poison
does not touch (no regression, so nothing is blamed: exit 1), then against the poisoned countries (exit 0). The
second run reuses the model the first trained (same data, config and backend), so the pair costs one training.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The scenario's own fine-tune settings (plain AdamW, constant lr, r=8 on all projections), through gradian train.
SETTINGS = (
    "train.learning_rate=3e-3", "train.max_steps=160", "train.batch_size=16", "train.lora_r=8",
    "train.lora_alpha=16", "train.warmup_ratio=0", "train.scheduler=constant", "train.max_seq_length=256",
    "train.logging_steps=20", "evaluation.metric=contains", "evaluation.max_new_tokens=12",
    "evaluation.batch_size=32", "evaluation.bootstrap_samples=2000", "grads.max_seq_length=256",
    "grads.batch_size=16", "attribution.permutations=500",
)


@dataclass(frozen=True)
class InjectionCase:
    """The inputs of `gradian inject` cut from the scenario."""

    base_dir: Path
    clean: Path
    poison: Path
    eval_path: Path  # the poisoned countries (and a few clean ones): the regression to explain
    unaffected_eval_path: Path  # only countries the poison does not touch
    n_planted: int


@dataclass(frozen=True)
class InjectRun:
    """One `gradian inject` run through gradian.cli.app.main."""

    code: int
    stdout: str
    result: dict[str, Any]


_SESSION: dict[str, Any] = {}


def injection_case(root: Path) -> InjectionCase:
    """Build the base model and write the clean / poison / eval files under ``root``."""
    import tests.support.scenario as scenario

    with scenario.single_thread():
        base_dir, _ = scenario.build_base(root)
        built = scenario.build_scenario(root / "scenario", base_dir)
    rows = [json.loads(line) for line in built.train_path.read_text(encoding="utf-8").splitlines()]
    planted = set(built.planted_positions)
    _write(root / "clean.jsonl", [row for i, row in enumerate(rows) if i not in planted])
    # The poison file carries no source: inject labels it; the planted rows' own label must not leak in.
    _write(root / "poison.jsonl", [{"messages": row["messages"]} for i, row in enumerate(rows) if i in planted])
    return InjectionCase(base_dir=base_dir, clean=root / "clean.jsonl", poison=root / "poison.jsonl",
                         eval_path=built.eval_path, unaffected_eval_path=built.unaffected_eval_path,
                         n_planted=len(planted))


def inject_runs(tmp_path_factory: Any) -> tuple[InjectionCase, InjectRun, InjectRun]:
    """The case, the unaffected-eval run (expected to fail) and the poisoned-eval run, once per session."""
    from tests.support.scenario import single_thread

    if "runs" not in _SESSION:
        case = injection_case(tmp_path_factory.mktemp("injection-case"))
        out = tmp_path_factory.mktemp("inject") / "out"
        with single_thread():  # tiny models train and score several times faster on one thread here
            unaffected = run_inject(case, case.unaffected_eval_path, out)
            poisoned = run_inject(case, case.eval_path, out)
        _SESSION["runs"] = (case, unaffected, poisoned)
    return _SESSION["runs"]


def run_inject(case: InjectionCase, eval_path: Path, out: Path) -> InjectRun:
    """`gradian inject` on the case through the CLI entry point, with its stdout and inject.json."""
    from gradian.cli.app import main

    argv = ["inject", "--base-model", str(case.base_dir), "--dataset", str(case.clean), "--poison", str(case.poison),
            "--eval-dataset", str(eval_path), "--out", str(out)]
    for setting in SETTINGS:
        argv += ["--set", setting]
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured), _environ(GRADIAN_CACHE_DIR=str(out.parent / "gradian-cache")):
        code = main(argv)  # the gradient index goes to a test cache dir, never the user's
    result = json.loads((out / "inject.json").read_text(encoding="utf-8")) if (out / "inject.json").is_file() else {}
    return InjectRun(code=code, stdout=captured.getvalue(), result=result)


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
