"""The sweep's index (experiments/records/index.py): a job's bookkeeping reads a few records,
not the sweep, and resume still finds every ok record the store has."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from hydra.types import RunMode
from omegaconf import OmegaConf

from experiments.app import sweep
from experiments.records import index, store
from tests.experiments.records.test_store import put, rec


def fill(sweep_dir, n, **columns):
    for job in range(n):
        put(sweep_dir, job, rec(f"h{job:04d}", seq_len=job + 1, job=str(job), **columns))


@pytest.fixture
def reads(monkeypatch):
    """Every record file the code under test opens, counted."""
    opened = []
    real = store.read_record

    def counted(path, **kwargs):
        opened.append(path)
        return real(path, **kwargs)

    monkeypatch.setattr(store, "read_record", counted)
    return opened


def end_of_job(sweep_dir):
    """A job of a multirun into `sweep_dir` ends: the app's callback (`SweepEnd.on_job_end`)."""
    config = OmegaConf.create(
        {"hydra": {"mode": RunMode.MULTIRUN, "sweep": {"dir": str(sweep_dir)}}}
    )
    sweep.SweepEnd().on_job_end(config)


def test_a_jobs_bookkeeping_reads_a_few_records_not_the_sweep(tmp_path, reads):
    """The resume check parsed every record of the sweep, and each job's end gathered them all
    again: 0.37 s per job at 1000 records, quadratic over a sweep."""
    fill(tmp_path, 200)
    index.rebuild(tmp_path)  # the multirun's start
    reads.clear()
    for job in range(3):
        assert index.find_ok_record(tmp_path, f"new{job}") is None  # a new configuration
        path = put(tmp_path, f"new{job}", rec(f"new{job}", seq_len=1000 + job))
        index.written(tmp_path, path, json.loads(path.read_text()))
        end_of_job(tmp_path)
    assert index.find_ok_record(tmp_path, "h0100") == tmp_path / "100" / "result.json"
    assert len(reads) <= 2, reads  # the found record, checked; no gathering was due
    assert not (tmp_path / "results.csv").exists()
    for job in range(3, 6):  # 200 // 32 = 6 records written since: the tables are due
        path = put(tmp_path, f"new{job}", rec(f"new{job}", seq_len=1000 + job))
        index.written(tmp_path, path, json.loads(path.read_text()))
        end_of_job(tmp_path)
    assert len(pd.read_csv(tmp_path / "results.csv")) == 206


def test_in_a_small_sweep_the_tables_are_rewritten_after_every_record(tmp_path):
    fill(tmp_path, 3)
    index.rebuild(tmp_path)
    for job in range(2):
        path = put(tmp_path, f"new{job}", rec(f"new{job}", seq_len=100 + job))
        index.written(tmp_path, path, json.loads(path.read_text()))
        end_of_job(tmp_path)
        assert len(pd.read_csv(tmp_path / "results.csv")) == 4 + job
    end_of_job(tmp_path)  # a job resumed: nothing written, nothing to gather
    assert len(pd.read_csv(tmp_path / "results.csv")) == 5


def test_resume_finds_records_changed_behind_the_index(tmp_path):
    fill(tmp_path, 3)
    index.rebuild(tmp_path)
    # Moved by hand (the marker points at nothing), edited to not ok, added by hand.
    moved = tmp_path / "elsewhere" / "result.json"
    moved.parent.mkdir()
    os.replace(tmp_path / "0" / "result.json", moved)
    failed = tmp_path / "1" / "result.json"
    failed.write_text(json.dumps({**json.loads(failed.read_text()), "status": "error"}))
    assert index.find_ok_record(tmp_path, "h0000") == moved
    assert index.find_ok_record(tmp_path, "h0001") is None
    put(tmp_path, "copied", rec("h9999"))
    assert index.find_ok_record(tmp_path, "h9999") is None  # during a multirun: not yet seen
    index.rebuild(tmp_path)  # the next multirun's start
    assert index.find_ok_record(tmp_path, "h9999") == tmp_path / "copied" / "result.json"


def test_without_an_index_resume_scans_and_a_marker_never_leaves_the_sweep(tmp_path):
    fill(tmp_path, 2)
    assert index.find_ok_record(tmp_path, "h0001") == tmp_path / "1" / "result.json"
    outside = tmp_path.parent / "outside.json"
    outside.write_text(json.dumps(rec("h0001")))
    (tmp_path / index.DIR / "ok" / "h0001").write_text("../outside.json")
    assert index.find_ok_record(tmp_path, "h0001") == tmp_path / "1" / "result.json"


def test_an_index_that_cannot_be_written_leaves_resume_scanning(tmp_path, monkeypatch):
    fill(tmp_path, 2)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(index, "write_atomic", full)
    assert index.find_ok_record(tmp_path, "h0001") == tmp_path / "1" / "result.json"
    index.written(tmp_path, tmp_path / "1" / "result.json", rec("h0001"))  # never raises
    assert index.find_ok_record(tmp_path, "h0000") == tmp_path / "0" / "result.json"
