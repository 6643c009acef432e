"""analysis/job_phases.py: a run's records cut into launches by the pauses between them."""

import pandas as pd

from analysis import job_phases


def _job(sweep, attention, end_s, seconds, causal=True, impl=None, seq_len=256):
    end = pd.Timestamp("2026-12-08T01:00:00+00:00") + pd.Timedelta(seconds=end_s)
    return {
        "sweep": sweep,
        "attention": attention,
        "seq_len": seq_len,
        "causal": causal,
        "attention.impl": impl,
        "timestamp": end.isoformat(),
        "job_seconds": seconds,
    }


def test_two_workers_side_by_side_are_one_launch_and_a_pause_starts_the_next():
    frame = pd.DataFrame(
        [
            # launch 1: two workers, jobs overlapping and back to back (0.4 s apart)
            _job("scaling", "full", 10, 10),
            _job("scaling", "lsh", 30, 30),
            _job("scaling", "blockwise", 20.5, 10.1),
            # launch 2, 12 s after the last job's end: one job at a time, impl=math
            _job("scaling", "full", 45, 3, impl="math", seq_len=512),
            _job("scaling", "full", 49, 3.5, impl="math", seq_len=1024),
        ]
    )
    jobs = job_phases.launches(frame)
    assert list(jobs.groupby("launch").size()) == [3, 2]
    table = job_phases.phases(frame).frame
    assert list(table["jobs"]) == [3, 2, 5]
    assert list(table["wall"]) == ["30 s", "7 s", "49 s"]  # 42 -> 49; 0 -> 49 overall
    assert list(table["job seconds"]) == ["50", "6", "57"]
    assert table["launch"][0] == "01:00:00 scaling, causal, L=256"
    assert table["launch"][1] == "01:00:42 scaling, causal, impl=math, L=512–1024"
    assert table["longest jobs"][0].startswith("lsh L=256 30 s, blockwise L=256 10 s")


def test_records_without_timing_have_no_table(capsys):
    assert job_phases.phases(pd.DataFrame({"attention": ["full"]})) is None


def test_a_curriculum_stages_record_is_not_another_job():
    stage = _job("long_range_quick", "performer", 70, 70) | {"job": "performer-L1024-ab/64"}
    final = _job("long_range_quick", "performer", 78, 78) | {"job": "performer-L1024-ab"}
    table = job_phases.phases(pd.DataFrame([stage, final])).frame
    assert list(table["jobs"]) == [1, 1] and list(table["job seconds"]) == ["78", "78"]
    assert table["longest jobs"][0] == "performer L=256 78 s"
