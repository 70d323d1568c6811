"""The dataset loader: five row formats, four file kinds, position-bearing ids, and file:line errors."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gradian.data import (
    Dataset,
    DatasetRowError,
    Message,
    load_dataset,
    load_eval_dataset,
    make_example,
    scan_dataset,
    write_jsonl,
)
from gradian.errors import DatasetError

QA = (Message("user", "What is the capital of France?"), Message("assistant", "Paris."))


def write_lines(path: Path, rows: list) -> Path:
    """Write rows as JSON Lines; a str row is written verbatim (for broken lines)."""
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows),
                    encoding="utf-8")
    return path


FORMAT_CASES = {
    "messages": ({"messages": [{"role": "user", "content": QA[0].content},
                               {"role": "assistant", "content": "Paris."}], "source": "wiki"}, QA, None),
    "sharegpt": ({"conversations": [{"from": "human", "value": QA[0].content},
                                    {"from": "gpt", "value": "Paris."}], "source": "wiki"}, QA, None),
    "prompt_completion": ({"prompt": QA[0].content, "completion": "Paris.", "source": "wiki"}, QA, None),
    "alpaca": ({"instruction": QA[0].content, "input": "", "output": "Paris.", "source": "wiki"}, QA, None),
    "text": ({"text": "Paris is the capital of France.", "source": "wiki"}, (), "Paris is the capital of France."),
}


@pytest.mark.parametrize("fmt", list(FORMAT_CASES))
def test_every_format_loads_and_normalizes(tmp_path, fmt):
    row, messages, text = FORMAT_CASES[fmt]
    dataset = load_dataset(write_lines(tmp_path / "d.jsonl", [row]))
    (example,) = dataset
    assert dataset.format == example.format == fmt
    assert example.messages == messages and example.text == text
    assert dict(example.fields) == {"source": "wiki"}
    assert example.location == f"{tmp_path / 'd.jsonl'}:1"
    assert re.fullmatch(r"ex-000000-[0-9a-f]{8}", example.id)


def test_the_same_conversation_in_any_chat_format_has_the_same_content_hash(tmp_path):
    rows = [case[0] for name, case in FORMAT_CASES.items() if name != "text"]
    dataset = load_dataset(write_lines(tmp_path / "d.jsonl", rows))
    assert dataset.format == "mixed"
    assert len({example.id[-8:] for example in dataset}) == 1
    assert [example.id[:9] for example in dataset] == [f"ex-{i:06d}" for i in range(4)]


def test_sharegpt_roles_and_multi_turn_helpers(tmp_path):
    row = {"conversations": [
        {"from": "system", "value": "Be brief."}, {"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"},
        {"from": "human", "value": "3+3?"}, {"from": "gpt", "value": "6"}]}
    (example,) = load_dataset(write_lines(tmp_path / "d.jsonl", [row]))
    assert [m.role for m in example.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert example.answer == "6"
    assert [m.content for m in example.prompt_messages] == ["Be brief.", "2+2?", "4", "3+3?"]
    assert example.supervised_text == "4\n\n6"


def test_alpaca_input_joins_the_instruction_with_a_blank_line(tmp_path):
    rows = [{"instruction": "Translate to French.", "input": "cat", "output": "chat"},
            {"instruction": "Say hi.", "output": "Hi."}]
    first, second = load_dataset(write_lines(tmp_path / "d.jsonl", rows))
    assert first.messages[0] == Message("user", "Translate to French.\n\ncat")
    assert second.messages[0] == Message("user", "Say hi.")


def test_conversational_prompt_completion_text_parts_and_weight(tmp_path):
    row = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
           "completion": [{"role": "assistant", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]}
    weighted = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "weight": 0},
                             {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}
    first, second = load_dataset(write_lines(tmp_path / "d.jsonl", [row, weighted]))
    assert first.format == "prompt_completion"
    assert first.messages == (Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello"))
    assert [m.supervised for m in second.messages] == [False, False, False, True]
    assert second.supervised_text == "d"
    assert not first.plain_pair and not second.plain_pair


def test_string_prompt_completion_is_marked_a_plain_pair(tmp_path):
    (example,) = load_dataset(write_lines(tmp_path / "d.jsonl", [FORMAT_CASES["prompt_completion"][0]]))
    assert example.plain_pair  # TRL tokenizes these raw; grads.string_pairs decides how Gradian does


def test_ids_embed_position_and_change_with_content_or_order(tmp_path):
    a = {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]}
    b = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    forward = load_dataset(write_lines(tmp_path / "f.jsonl", [a, b]))
    backward = load_dataset(write_lines(tmp_path / "b.jsonl", [b, a]))
    changed = load_dataset(write_lines(tmp_path / "c.jsonl", [a, {**b, "messages": b["messages"][:1] + [
        {"role": "assistant", "content": "5"}]}]))
    relabelled = load_dataset(write_lines(tmp_path / "r.jsonl", [{**a, "source": "x"}, b]))
    assert forward.ids[0].startswith("ex-000000-") and forward.ids[1].startswith("ex-000001-")
    assert set(forward.ids).isdisjoint(backward.ids)  # same rows, other order: every id differs
    assert forward.ids[0] == changed.ids[0] and forward.ids[1] != changed.ids[1]
    assert relabelled.ids == forward.ids  # metadata fields are not content
    assert forward.sha256 != backward.sha256
    assert forward[0].id[-8:] == make_example(0, messages=forward[0].messages).id[-8:]


def test_json_list_data_object_and_jsonl_named_json_with_true_line_numbers(tmp_path):
    rows = [FORMAT_CASES["messages"][0], FORMAT_CASES["alpaca"][0]]
    pretty = tmp_path / "list.json"
    pretty.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"version": 1, "data": rows}, indent=2), encoding="utf-8")
    lines = write_lines(tmp_path / "lines.json", rows)
    for path in (pretty, wrapped, lines):
        dataset = load_dataset(path)
        assert [e.format for e in dataset] == ["messages", "alpaca"]
        text_lines = path.read_text().splitlines()
        for example in dataset:  # each location points at the line where its row's object opens
            line = int(example.location.rsplit(":", 1)[1])
            assert text_lines[line - 1].strip().startswith("{")
    assert [e.location.rsplit(":", 1)[1] for e in load_dataset(pretty)] == ["2", "15"]
    assert [e.location.rsplit(":", 1)[1] for e in load_dataset(lines)] == ["1", "2"]


def test_parquet_and_save_to_disk_directories(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
             "source": "a"},
            {"messages": [{"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye"}],
             "source": "b"}]
    hf = datasets.Dataset.from_list(rows)
    hf.to_parquet(str(tmp_path / "d.parquet"))
    hf.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": hf}).save_to_disk(str(tmp_path / "one_split"))
    datasets.DatasetDict({"train": hf, "test": hf}).save_to_disk(str(tmp_path / "two_splits"))
    jsonl = load_dataset(write_lines(tmp_path / "d.jsonl", rows))
    for path in (tmp_path / "d.parquet", tmp_path / "saved", tmp_path / "one_split"):
        dataset = load_dataset(path)
        assert dataset.ids == jsonl.ids
        assert [dict(e.fields) for e in dataset] == [{"source": "a"}, {"source": "b"}]
        assert dataset[1].location == f"{path}:2"
    assert load_dataset(tmp_path / "saved").sha256 == load_dataset(tmp_path / "saved").sha256
    with pytest.raises(DatasetError, match="several splits") as info:
        load_dataset(tmp_path / "two_splits")
    assert "two_splits/" in info.value.hint
    (tmp_path / "plain_dir").mkdir()
    with pytest.raises(DatasetError, match="not one written by datasets"):
        load_dataset(tmp_path / "plain_dir")


GOOD = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
BAD_ROWS = {
    "invalid JSON": ('{"messages": [', "invalid JSON"),
    "row not an object": ("[1, 2]", "row is an array, not an object"),
    "unknown format": ({"question": "q", "answer": "a"}, "no known format (fields: 'question', 'answer')"),
    "message without role": ({"messages": [{"content": "hi"}]}, "messages[0] has no 'role'"),
    "message without content": ({"messages": [{"role": "user"}]}, "messages[0] has no 'content'"),
    "unknown role": ({"messages": [{"role": "tool", "content": "x"}]}, "unknown role 'tool'"),
    "unknown sharegpt role": ({"conversations": [{"from": "bot", "value": "x"}]}, "unknown role 'bot'"),
    "non-string content": ({"messages": [{"role": "user", "content": 42}]}, "content is a number, not a string"),
    "null content": ({"messages": [{"role": "assistant", "content": None}]}, "content is null, not a string"),
    "empty messages": ({"messages": []}, "'messages' is empty"),
    "prompt without completion": ({"prompt": "q", "response": "a"}, "'prompt' but no 'completion'"),
    "mixed prompt types": ({"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]}, "'prompt' is a string and 'completion' an array"),
    "alpaca without output": ({"instruction": "q", "response": "a"}, "no 'output'"),
    "text not a string": ({"text": ["a"]}, "'text' is an array, not a string"),
    "bad weight": ({"messages": [{"role": "assistant", "content": "a", "weight": 0.5}]}, "weight is 0.5"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_bad_row_is_an_error_at_its_file_and_line(tmp_path, case):
    bad, reason = BAD_ROWS[case]
    path = tmp_path / "train.jsonl"
    write_lines(path, [GOOD, "", bad, GOOD])  # line 2 is blank: the bad row is on line 3
    with pytest.raises(DatasetRowError) as info:
        load_dataset(path)
    error = info.value
    assert error.location == f"{path}:3"
    assert error.message.startswith(f"{path}:3: ")
    assert reason in error.reason
    assert error.hint
    assert "\n" not in error.one_line()


def test_not_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + '{"text": "café"}'.encode("latin-1") + b"\n")
    with pytest.raises(DatasetRowError, match="not UTF-8") as info:
        load_dataset(path)
    assert info.value.location == f"{path}:2"
    json_path = tmp_path / "latin1.json"
    json_path.write_bytes(b'[\n{"text": "ok"},\n{"text": "caf\xe9"}\n]')
    with pytest.raises(DatasetError, match=rf"{re.escape(str(json_path))}:3: file is not UTF-8"):
        load_dataset(json_path)


def test_invalid_json_document_names_the_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[\n  {"text": "a"},\n  {"text": "b",}\n]', encoding="utf-8")
    with pytest.raises(DatasetError, match=rf"{re.escape(str(path))}:3: invalid JSON"):
        load_dataset(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n", "[]", '{"data": []}'])
def test_empty_dataset_is_an_error(tmp_path, content):
    path = tmp_path / ("empty.json" if content.startswith(("[", "{")) else "empty.jsonl")
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DatasetError, match="(no rows|empty)"):
        load_dataset(path)


def test_missing_file_has_a_hint(tmp_path):
    with pytest.raises(DatasetError, match="dataset not found") as info:
        load_dataset(tmp_path / "nope.jsonl")
    assert ".jsonl" in info.value.hint


def test_scan_collects_every_bad_row_and_load_reports_the_count(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [GOOD, "{oops", {"foo": 1}, GOOD, {"messages": []}])
    scan = scan_dataset(path)
    assert [p.location.rsplit(":", 1)[1] for p in scan.problems] == ["2", "3", "5"]
    assert [e.index for e in scan.examples] == [0, 3]  # positions count the bad rows too
    assert scan.rows == 5
    with pytest.raises(DatasetRowError, match=r":2: invalid JSON.*\(2 more bad rows\)"):
        load_dataset(path)


def test_expected_format_mismatch(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [GOOD, FORMAT_CASES["alpaca"][0]])
    with pytest.raises(DatasetRowError, match=r":2: row is in format 'alpaca'.*'messages'"):
        load_dataset(path, expected_format="messages")
    with pytest.raises(DatasetError, match="unknown dataset format"):
        load_dataset(path, expected_format="csv")


def test_eval_dataset_needs_a_prompt_and_a_wanted_answer(tmp_path):
    good = load_eval_dataset(write_lines(tmp_path / "ok.jsonl", [FORMAT_CASES[f][0] for f in ("messages", "alpaca")]))
    assert [e.answer for e in good] == ["Paris.", "Paris."]
    cases = {
        "no answer": {"messages": [{"role": "user", "content": "q"}]},
        "ends with user": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                                        {"role": "user", "content": "q2"}]},
        "empty answer": {"prompt": "q", "completion": "  "},
        "text": {"text": "just text"},
        "no prompt": {"messages": [{"role": "assistant", "content": "a"}]},
    }
    for name, row in cases.items():
        path = write_lines(tmp_path / f"{name}.jsonl", [GOOD, row])
        with pytest.raises(DatasetRowError) as info:
            load_eval_dataset(path)
        assert info.value.location == f"{path}:2", name
    mixed = write_lines(tmp_path / "mixed.jsonl", [GOOD, FORMAT_CASES["prompt_completion"][0]])
    with pytest.raises(DatasetRowError, match=r":2: eval set row is in format 'prompt_completion'"):
        load_eval_dataset(mixed, expected_format="messages")


def test_write_jsonl_round_trips_ids_and_fields(tmp_path):
    source = write_lines(tmp_path / "d.jsonl", [case[0] for case in FORMAT_CASES.values()])
    original = load_dataset(source)
    copy = load_dataset(write_jsonl(original, tmp_path / "out" / "copy.jsonl"))
    assert copy.ids == original.ids
    assert [dict(e.fields) for e in copy] == [dict(e.fields) for e in original]
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_dataset_is_a_sequence():
    example = make_example(0, messages=QA)
    dataset = Dataset(Path("x.jsonl"), "0" * 64, (example,), "messages")
    assert len(dataset) == 1 and dataset[0] is example and list(dataset) == [example] and dataset[:1] == (example,)


def test_import_is_light():
    code = ("import sys, gradian.data; "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_examples_pickle_for_worker_processes(tmp_path):
    dataset = load_dataset(write_lines(tmp_path / "d.jsonl", [case[0] for case in FORMAT_CASES.values()]))
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy == dataset and [dict(e.fields) for e in copy] == [{"source": "wiki"}] * 5
    with pytest.raises(TypeError):
        copy[0].fields["source"] = "other"  # read-only


def test_parquet_without_datasets_installed_says_what_to_install(tmp_path, monkeypatch):
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DatasetError, match="needs the 'datasets' package") as info:
        load_dataset(path)
    assert info.value.hint == "pip install datasets"


def test_eval_errors_come_in_file_order(tmp_path):
    path = write_lines(tmp_path / "eval.jsonl", [GOOD, {"text": "no answer"}, "{broken", GOOD])
    with pytest.raises(DatasetRowError, match=r":2: plain text row.*\(1 more bad row\)"):
        load_eval_dataset(path)
