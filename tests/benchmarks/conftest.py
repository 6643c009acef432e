"""Micro-benchmark setup: all cores while a benchmark runs (the shared test setup pins one)."""

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def all_threads():
    # A fixture, not module code: this conftest is imported by every default test run too, and
    # the correctness tests must keep their single thread.
    before = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    yield
    torch.set_num_threads(before)
