"""The one atomic write and the one file lock."""

from __future__ import annotations

import os

import pytest

from experiments.records import files


def test_a_failed_write_leaves_the_old_file_and_nothing_beside_it(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("old")

    def broken(tmp):
        tmp.write_text("half")
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        files.write_atomic(path, broken)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["a.txt"]
    files.write_atomic(path, lambda tmp: tmp.write_text("new"), durable=True)
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["a.txt"]


def test_the_lock_says_whether_it_waited_and_takes_its_mode(tmp_path):
    with files.file_lock(tmp_path / "x.lock", mode=0o600) as waited:
        assert waited is False
    assert (tmp_path / "x.lock").stat().st_mode & 0o777 == 0o600
