"""What the results are and how far to trust them: where, when and with what they were measured
(`provenance`, the bullets under report.md's headline), and the report's section (`SECTION`) of
every configuration that was not measured (`failures`), timings not to take at face value
(`timing_warnings`) and kernels timed on the explicit path (`explicit_path`)."""

from __future__ import annotations

import pandas as pd

from analysis import series
from analysis.column_names import (
    ATTENTION,
    BATCH_SIZE,
    CAUSAL,
    D_MODEL,
    DEVICE,
    DEVICE_NAME,
    DTYPE,
    ERROR,
    GIT_COMMIT,
    HOSTNAME,
    JOB,
    KERNEL_PATH,
    N_HEADS,
    SEQ_LEN,
    SHARED_QK,
    STATUS,
    SWEEP,
    THREADS,
    TIMESTAMP,
    TIMING_WARNING,
    TORCH_VERSION,
)
from analysis.load import format_value
from analysis.markdown_table import Table, distinct, format_length, with_keys
from analysis.scaling_fits import TIME_METRICS
from analysis.section import Section, TableSpec
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


# What a kernel's time depends on: records agreeing on all of these time the same kernel, so
# their times must agree (a different block, depth or task cannot matter to the kernel alone).
KERNEL_INPUTS = (
    SEQ_LEN,
    BATCH_SIZE,
    N_HEADS,
    D_MODEL,
    CAUSAL,
    DTYPE,
    DEVICE,
    THREADS,
    SHARED_QK,
    HOSTNAME,
    SWEEP,
)
KERNEL_DISAGREEMENT = 3.0  # a kernel time this many times the same kernel's fastest is flagged


def timing_warnings(frame: pd.DataFrame) -> Table | None:
    """Timings not to take at face value: a figure whose blocks spread widely (the record's
    `timing_warning`), and a kernel time that disagrees with the same kernel elsewhere in the
    sweep (same attention, options and shape, another block or depth: the kernel alone is timed,
    so its time cannot depend on them) by more than KERNEL_DISAGREEMENT×."""
    labelled, keys = series.with_series(frame)
    ok = labelled[labelled[STATUS] == "ok"]
    rows = []
    if TIMING_WARNING in ok:
        for _, rec in ok[ok[TIMING_WARNING].notna()].iterrows():
            rows.append({"series": rec["series"], JOB: rec[JOB], "warning": rec[TIMING_WARNING]})
    options = sorted(c for c in ok.columns if c.startswith("attention."))
    inputs = [c for c in (ATTENTION, *options, *KERNEL_INPUTS) if c in ok]
    for metric in TIME_METRICS.values():
        timed = ok[ok[metric].notna()]
        if timed.empty:
            continue
        same_kernel = timed[inputs].map(format_value).apply(tuple, axis=1)
        for _, group in timed.groupby(same_kernel, sort=False):
            fastest = group.loc[group[metric].idxmin()]
            for _, rec in group.iterrows():
                ratio = rec[metric] / fastest[metric]
                if ratio > KERNEL_DISAGREEMENT:
                    rows.append(
                        {
                            "series": rec["series"],
                            JOB: rec[JOB],
                            "warning": (
                                f"{metric} {rec[metric]:.3g} is {ratio:.0f}× the "
                                f"{fastest[metric]:.3g} of the same kernel in job "
                                f"{fastest[JOB]} ({fastest['series']})"
                            ),
                        }
                    )
    if not rows:
        return None
    note = (
        "Treat these figures with care: re-measure them (delete the record and re-run the sweep) "
        "on a quieter machine."
    )
    return Table("Timing warnings", with_keys(rows, labelled, keys), note)


def explicit_path(frame: pd.DataFrame) -> Table | None:
    """The series whose kernel ran in explicit matmuls (`kernel_path` explicit): no fused
    attention kernel on that device and dtype, or none at all (linear, performer), while exact
    attention's SDPA runs fused; their times are marked here."""
    if KERNEL_PATH not in frame:
        return None
    labelled, keys = series.with_series(frame)
    explicit = labelled[(labelled[STATUS] == "ok") & (labelled[KERNEL_PATH] == "explicit")]
    if explicit.empty:
        return None
    rows = [
        {
            "series": label,
            "jobs": ", ".join(map(str, group[JOB])),
            DEVICE: distinct(group[DEVICE]),
        }
        for label, group in explicit.groupby("series", sort=False)
    ]
    note = (
        "These kernels ran on the explicit path (`kernel_path`): their times are not those of a "
        "fused kernel, where exact attention's are."
    )
    return Table("Measured on the explicit path", with_keys(rows, labelled, keys), note)


SECTION = Section(
    "Not measured, and timings to re-check",
    tables=(TableSpec(failures), TableSpec(timing_warnings), TableSpec(explicit_path)),
)
