"""The report's decoding figure, table and headline on hand-made decode records."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import decode_report, figures, load, report
from experiments.records.record import MIB
from tests.analysis.conftest import FIXTURE

LENGTHS = (1024, 4096, 65536)


def decode_records(state: str = "decode_state_bytes") -> list[dict]:
    """Exact attention: 1e-3·L ms per token and a cache of 2·4·L·64 floats; linear: 0.2 ms and
    66,560 bytes at every context; blockwise times out at 64K. `state`: the column the state's
    bytes are in (older records: `cache_bytes`)."""
    records = []
    for length in LENGTHS:
        for attention, ms, cache in (
            ("full", 1e-3 * length, 2 * 4 * length * 64 * 4),
            ("linear", 0.2, 4 * 64 * 65 * 4),
            ("blockwise", 0.5, 2 * 4 * 256 * 64 * 4),
        ):
            timed_out = attention == "blockwise" and length == 65536
            records.append(
                {
                    "sweep": "decode",
                    "job": str(len(records)),
                    "config_hash": f"d{len(records)}",
                    "status": "timeout" if timed_out else "ok",
                    "attention": attention,
                    "block": "residual",
                    "task": "random_lm",
                    "seq_len": length,
                    "batch_size": 1,
                    "causal": True,
                    "seed": 0,
                    "measure.decode": True,
                    "decode_ms_per_token": None if timed_out else ms,
                    state: None if timed_out else cache,
                    "decode_bandwidth_fraction": None if timed_out else 0.6,
                    "timestamp": "2026-01-01T00:00:00",
                }
            )
    return records


def frame(state: str = "decode_state_bytes") -> pd.DataFrame:
    return load.tidy(pd.DataFrame(decode_records(state)))


@pytest.mark.parametrize("state", ["decode_state_bytes", "cache_bytes"])
def test_the_table_gives_time_and_cache_per_context(state):
    table = decode_report.decode_table(frame(state))
    assert table is not None and table.title == "Decoding"
    rows = table.frame.set_index("variant")
    assert rows.loc["full", "L=65,536"] == "65.5 ms · 128 MiB"
    assert rows.loc["linear", "L=1,024"] == "0.2 ms · 65 KiB"
    assert rows.loc["blockwise", "L=65,536"] == "—"  # timed out: no value
    assert rows.loc["full", "bandwidth fraction @ longest"] == "0.60"


def test_the_headline_has_one_clause_per_variant_against_exact():
    text = "\n".join(decode_report.headline(frame()))
    assert "## Decoding" in text
    assert "**full** at 64K: 65.5 ms/token, cache 128 MiB" in text
    assert "**linear** at 64K: 0.2 ms/token, cache 65 KiB vs exact 128 MiB" in text
    assert "**blockwise** at 4K: 0.5 ms/token, cache 512 KiB vs exact 8 MiB" in text


def test_the_figure_draws_time_and_cache_and_the_report_leaves_it_out_without_decode():
    figure = decode_report.decode_vs_context(frame())
    assert figures.nothing_drawn(figure) is None
    cache_panel = figure.axes[1]
    ys = [y for line in cache_panel.get_lines() for y in line.get_ydata()]
    assert max(ys) == 2 * 4 * 65536 * 64 * 4 / MIB
    assert report.not_applicable("decode_vs_context", frame()) is None
    assert "measure.decode" in report.not_applicable(
        "decode_vs_context", load.load_results([FIXTURE])
    )
    assert decode_report.decode_table(load.tidy(load.load_results([FIXTURE]))) is None
