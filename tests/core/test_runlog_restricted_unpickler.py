"""training_args.bin is read by an unpickler that builds plain dicts and executes nothing the file names."""

from __future__ import annotations

import io
import os
import pickle
import zipfile

import pytest

from gradian.errors import RunDirError
from gradian.runs import read_run
from gradian.runs.restricted_unpickler import PickledObject, class_name, load_restricted, to_plain


class Payload:
    """An object whose unpickling runs a shell command (the classic pickle exploit)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class TrainingArguments:
    """A TrainingArguments look-alike with an exploit hidden in one field."""

    def __init__(self, marker):
        self.output_dir = "out"
        self.learning_rate = 3e-4
        self.report_to = Payload(marker)


class EvalPayload:
    """An object whose unpickling evaluates Python code that writes a file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_the_payload_is_live_under_a_normal_unpickler(tmp_path):
    marker = tmp_path / "ran-with-pickle-loads"
    pickle.loads(pickle.dumps(Payload(marker)))  # proves the test below could fail
    assert marker.exists()


@pytest.mark.parametrize("payload", [Payload, EvalPayload])
def test_a_reduce_that_would_run_code_is_read_without_running_it(tmp_path, payload):
    marker = tmp_path / "ran"
    path = tmp_path / "training_args.bin"
    path.write_bytes(pickle.dumps(payload(marker)))
    obj = load_restricted(path)
    assert not marker.exists()
    assert isinstance(obj, PickledObject) and class_name(obj) in ("posix.system", "nt.system", "builtins.eval")
    with pytest.raises(RunDirError, match="not a TrainingArguments"):
        read_run(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("zipped", [False, True])
def test_an_exploit_inside_a_training_arguments_field_stays_inert(tmp_path, zipped):
    marker = tmp_path / "ran"
    data = pickle.dumps(TrainingArguments(marker), protocol=2)
    if zipped:  # torch.save's layout: a zip archive holding <name>/data.pkl
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("archive/data.pkl", data)
            archive.writestr("archive/version", "3\n")
        data = buffer.getvalue()
    (tmp_path / "training_args.bin").write_bytes(data)
    artifact = read_run(tmp_path)
    assert artifact.config.learning_rate == 3e-4
    assert not marker.exists()
    plain = to_plain(load_restricted(tmp_path / "training_args.bin"))
    assert plain["report_to"] == f"touch {marker}"  # the would-be call's argument, kept as data


def test_torch_legacy_format_is_read(tmp_path):
    stream = io.BytesIO()
    for part in (0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001}):
        pickle.dump(part, stream, protocol=2)
    pickle.dump(TrainingArguments(tmp_path / "ran"), stream, protocol=2)
    (tmp_path / "training_args.bin").write_bytes(stream.getvalue())
    assert read_run(tmp_path).config.learning_rate == 3e-4
    assert not (tmp_path / "ran").exists()


def test_a_getattr_import_chain_is_refused_without_running(tmp_path):
    marker = tmp_path / "ran"
    # getattr(__import__("os"), "system")("touch marker") in protocol 0: a REDUCE on a REDUCE's result.
    chain = (b"cbuiltins\ngetattr\n(cbuiltins\n__import__\n(Vos\ntRVsystem\ntR(V"
             + f"touch {marker}".encode() + b"\ntR.")
    pickle.loads(chain)  # live under a normal unpickler...
    assert marker.exists()
    marker.unlink()
    (tmp_path / "training_args.bin").write_bytes(chain)
    with pytest.raises(RunDirError, match="not a readable pickle"):  # ...inert here: the stub is not callable
        read_run(tmp_path)
    assert not marker.exists()
