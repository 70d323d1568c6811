"""The plain run format for custom loops, read from the very examples docs/run-format.md shows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gradian.errors import RunDirError
from gradian.runs import read_run

DOC = Path(__file__).resolve().parents[2] / "docs" / "run-format.md"


def doc_blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def write_doc_example(run: Path) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "run.json").write_text(doc_blocks("json")[0], encoding="utf-8")
    (run / "metrics.jsonl").write_text(doc_blocks("jsonl")[0], encoding="utf-8")
    return run


def test_the_documented_example_reads(tmp_path):
    artifact = read_run(write_doc_example(tmp_path / "run"))
    cfg = artifact.config
    assert artifact.reader == "plain" and artifact.finished is True and artifact.global_step == 200
    assert (cfg.learning_rate, cfg.lr_scheduler, cfg.max_length, cfg.loss_mask, cfg.precision) == (2e-4, "cosine", 1024, "assistant_only", "bf16")
    assert (cfg.lora_r, cfg.lora_alpha, cfg.use_rslora, cfg.framework) == (16, 32.0, False, "my-loop")
    assert len(cfg.lora_target_modules) == 7
    assert [(p.step, p.loss, p.eval_loss) for p in artifact.metrics] == [(1, 2.31, None), (2, 2.27, None), (2, None, 2.25)]
    assert artifact.metrics[1].mean_token_accuracy == 0.41
    assert [p.line for p in artifact.metrics] == [1, 2, 3]
    assert artifact.framework_versions["peft"] == "0.21.2"


def test_without_status_a_train_runtime_line_marks_the_end(tmp_path):
    run = write_doc_example(tmp_path / "run")
    document = json.loads((run / "run.json").read_text())
    del document["status"]
    (run / "run.json").write_text(json.dumps(document))
    assert read_run(run).finished is True
    lines = (run / "metrics.jsonl").read_text().splitlines()[:-1]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert read_run(run).finished is False


def test_nan_and_infinity_are_values_not_errors(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": NaN, "grad_norm": Infinity}\n')
    point = read_run(run, "plain").metrics[0]
    assert point.loss != point.loss and point.grad_norm == float("inf")


@pytest.mark.parametrize("line, reason", [
    ('{"step": 1, "loss": 2.0', "metrics.jsonl:2: not valid JSON"),
    ('[1, 2]', "metrics.jsonl:2: a JSON list, not an object"),
    ('{"loss": 2.0}', "metrics.jsonl:2: has no integer 'step'"),
])
def test_a_bad_metrics_line_is_an_error_with_its_line(tmp_path, line, reason):
    run = write_doc_example(tmp_path / "run")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.1}\n' + line + "\n")
    with pytest.raises(RunDirError, match=re.escape(reason)):
        read_run(run)


def test_unknown_status_is_an_error(tmp_path):
    run = write_doc_example(tmp_path / "run")
    (run / "run.json").write_text(json.dumps({"status": "done"}))
    with pytest.raises(RunDirError, match="status 'done' is unknown"):
        read_run(run)
