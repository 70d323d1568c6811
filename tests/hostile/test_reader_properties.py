"""Property: whatever bytes or JSON values a dataset or run log holds, the readers refuse them or read them; never crash."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradian.data import load_dataset
from gradian.data.loading import scan_dataset
from gradian.errors import GradianError
from gradian.runs import read_run

# JSON values with the row formats' keys in them, lone surrogates and deep nesting among them.
_KEYS = st.sampled_from(["messages", "conversations", "prompt", "completion", "instruction", "output", "text",
                         "role", "content", "from", "value", "log_history", "global_step", "loss", "step"])
_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.sampled_from(["\ud800", "\udfff"])
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(_KEYS | st.text(max_size=5), inner, max_size=4), max_leaves=20)
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _dump(value: object) -> str:
    return json.dumps(value)  # escapes lone surrogates as \\ud800, as a hostile exporter would write them


@_SETTINGS
@given(rows=st.lists(_VALUES, max_size=5))
def test_any_json_rows_load_or_are_refused_with_one_line(rows):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.jsonl"
        path.write_text("".join(_dump(row) + "\n" for row in rows), encoding="utf-8")
        try:
            dataset = load_dataset(path)
        except GradianError as error:
            assert "\n" not in error.one_line()
        else:
            for example in dataset:
                json.dumps(example.id).encode("utf-8")  # everything kept can be written out again
        try:
            scan = scan_dataset(path)  # diagnose's reader: bad rows become problems, not exceptions
        except GradianError as error:  # only the file as a whole (no rows at all) is refused
            assert not rows and "\n" not in error.one_line()
        else:
            assert len(scan.examples) + len(scan.problems) == len(rows)


@_SETTINGS
@given(data=st.binary(max_size=512), suffix=st.sampled_from([".jsonl", ".json"]))
def test_any_bytes_as_a_dataset_load_or_are_refused(data, suffix):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"train{suffix}"
        path.write_bytes(data)
        try:
            load_dataset(path)
        except GradianError as error:
            assert "\n" not in error.one_line()


@_SETTINGS
@given(state=_VALUES, log_lines=st.lists(_VALUES, max_size=4))
def test_any_trainer_state_and_log_read_or_are_refused(state, log_lines):
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        (run / "trainer_state.json").write_text(_dump(state), encoding="utf-8")
        (run / "trainer_log.jsonl").write_text("".join(_dump(line) + "\n" for line in log_lines), encoding="utf-8")
        try:
            read_run(run)
        except GradianError as error:
            assert "\n" not in error.one_line()
