"""gradian.atomic_files: whole or nothing, readable by others, and the streamed hash."""

from __future__ import annotations

import hashlib
import stat

import pytest

from gradian.atomic_files import atomic_file, sha256_file, write_atomic, write_text_atomic, write_with


def test_a_write_lands_whole_readable_by_others_and_leaves_no_temp(tmp_path):
    target = tmp_path / "report.json"
    write_text_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp(tmp_path):
    target = tmp_path / "shard.npy"
    write_atomic(target, b"old")

    def half_then_fail(temp):
        temp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_with(target, half_then_fail)
    with pytest.raises(KeyboardInterrupt), atomic_file(target) as out:
        out.write(b"half")
        raise KeyboardInterrupt
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["shard.npy"]


def test_sha256_file_streams_in_blocks_to_the_same_digest(tmp_path):
    data = bytes(range(256)) * 1000
    (tmp_path / "blob").write_bytes(data)
    assert sha256_file(tmp_path / "blob", block=4097) == hashlib.sha256(data).hexdigest()
