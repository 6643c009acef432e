"""What the results are: where, when and with what they were measured (`provenance`, the
bullets under report.md's headline), and every configuration that was not measured
(`failures`, the "Not measured" table)."""

from __future__ import annotations

import pandas as pd

from analysis import series
from analysis.column_names import (
    DEVICE,
    DEVICE_NAME,
    ERROR,
    GIT_COMMIT,
    HOSTNAME,
    SEQ_LEN,
    STATUS,
    SWEEP,
    THREADS,
    TIMESTAMP,
    TORCH_VERSION,
)
from analysis.markdown_table import Table, distinct, format_length, with_keys
from experiments.records import record


def failures(frame: pd.DataFrame) -> Table | None:
    """Every configuration that did not end ok, grouped by variant, status and reason."""
    labelled, keys = series.with_series(frame, x=SEQ_LEN)
    failed = labelled[labelled[STATUS] != "ok"]
    if failed.empty:
        return None
    rows = []
    for (name, status, reason), group in failed.groupby(
        ["series", STATUS, failed[ERROR].map(lambda e: "" if e is None else str(e))],
        sort=False,
    ):
        rows.append(
            {
                "series": name,
                STATUS: status,
                SEQ_LEN: ", ".join(
                    format_length(v) for v in sorted(group[SEQ_LEN].dropna().unique())
                ),
                "records": len(group),
                "reason": reason[:160] + ("…" if len(reason) > 160 else ""),
            }
        )
    not_ok = ", ".join(s for s in record.STATUSES if s != record.OK)
    return Table(f"Not measured ({not_ok})", with_keys(rows, labelled, keys))


def provenance(frame: pd.DataFrame) -> list[str]:
    """Markdown bullets: what was measured, where, with what."""
    counts = frame[STATUS].value_counts().to_dict()
    lines = [
        f"- sweeps: {distinct(frame[SWEEP])}; {len(frame)} records "
        f"({', '.join(f'{n} {s}' for s, n in counts.items())})",
        f"- device: {distinct(frame[DEVICE_NAME])} ({distinct(frame[DEVICE])}), "
        f"threads {distinct(frame[THREADS])}, torch {distinct(frame[TORCH_VERSION])}",
        f"- git commit: {distinct(frame[GIT_COMMIT])}; hosts: {distinct(frame[HOSTNAME])}",
    ]
    stamps = frame[TIMESTAMP].dropna()
    if len(stamps):
        lines.append(f"- measured: {stamps.min()} … {stamps.max()}")
    return lines
