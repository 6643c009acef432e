"""Targets timed once per length, not for 0.3 s: the rows are tested, not the machine."""

import pytest

from benchmarks.targets import call_timing


@pytest.fixture
def one_call(monkeypatch):
    timed = call_timing.seconds_per_call
    monkeypatch.setattr(call_timing, "seconds_per_call", lambda fn: timed(fn, min_time_s=0))
