"""Where and with what a record was measured: its provenance columns, with their values."""

from __future__ import annotations

from datetime import datetime

import torch

from experiments.measurement.provenance import provenance
from experiments.records import record


def test_provenance_says_where_and_with_what():
    prov = provenance(torch.device("cpu"))
    assert set(prov) == {
        "git_commit",
        "torch_version",
        "device_name",
        "hostname",
        "timestamp",
        "thp_mem_alloc",
    }
    assert prov["torch_version"] == torch.__version__
    assert prov["device_name"] and prov["hostname"] and prov["git_commit"]
    assert datetime.fromisoformat(prov["timestamp"]).utcoffset() is not None  # zone-aware


def test_provenance_fills_exactly_the_schemas_provenance_columns_a_job_reads_itself():
    # The app adds the other two: the W&B run's directory and the launcher's parallel jobs.
    assert set(provenance()) == set(record.names(record.PROVENANCE)) - {
        "offline_run_dir",
        "parallel_jobs",
    }
