"""What was measured and how far to trust it (analysis.measured): the report's list of figures
measured on the explicit path (`kernel_path`)."""

from __future__ import annotations

from analysis import load, measured
from tests.analysis.conftest import FIXTURE


def test_explicit_path_lists_only_the_series_that_ran_explicit():
    frame = load.tidy(load.load_results([FIXTURE]))
    assert measured.explicit_path(frame.drop(columns="kernel_path", errors="ignore")) is None
    frame["kernel_path"] = "fused"
    assert measured.explicit_path(frame) is None
    lsh = (frame["attention"] == "lsh") & (frame["status"] == "ok")
    frame.loc[lsh, "kernel_path"] = "explicit"
    table = measured.explicit_path(frame)
    assert table is not None and "explicit path" in table.markdown()
    assert set(table.frame["variant"]) == {"lsh"}
    assert sorted(table.frame["jobs"].str.split(", ").sum()) == sorted(
        frame.loc[lsh, "job"].astype(str)
    )
