"""Results at a glance: one Markdown table, a row per variant, for the top of README.md.

    python -m analysis.glance multirun/scaling --quality multirun/long_range_quick \\
        --decode multirun/decode_quick [--capacity multirun/capacity] \\
        [--busy multirun_busy/scaling] [--write README.md]

Per variant, from the same functions the report uses, so the two agree: L* vs SDPA
(`scaling_fits`), kernel memory against the O(L²) form (`headline.memory_factor`), recall at
the longest trained length with floor and chance ("not learned in N steps" where never 90 %),
with `--busy` the L* under load and its ratio, and capacity per head dim and decode cost where
such records exist. A cell with nothing measured says "—". Above the table: the sweeps, the
newest record's date, the machine and the commit. `--write FILE` replaces the text between BEGIN
and END in FILE; without it the table is printed. Each column: docs/internals-analysis.md, "glance".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from analysis import accuracy, capacity, decode_report, fit, headline, load, scaling_fits, series
from analysis.column_names import (
    ATTENTION,
    CAUSAL,
    DEVICE,
    DEVICE_NAME,
    GIT_COMMIT,
    HOSTNAME,
    SEQ_LEN,
    SWEEP,
    THREADS,
    TIMESTAMP,
)
from analysis.load import format_value
from analysis.markdown_table import Table
from analysis.trained_quality import CEILING
from experiments.records import store

BEGIN = "<!-- glance:begin -->"
END = "<!-- glance:end -->"
EMPTY = "—"


def glance(
    cost: pd.DataFrame,
    *,
    quality: pd.DataFrame | None = None,
    decode_records: pd.DataFrame | None = None,
    capacity_records: pd.DataFrame | None = None,
    busy: pd.DataFrame | None = None,
) -> str:
    """The Markdown block: a provenance line, the table, and a note on how to read it.

    `cost`: records of kernel time and memory over seq_len (the scaling sweep); the others:
    records of trained recall over lengths, of decoding, and of a capacity sweep; `busy`: the
    same scaling sweep measured beside a CPU-bound process, for a column of its crossovers and
    their ratio to `cost`'s (how reproducible L* is)."""
    frames = [f for f in (cost, quality, decode_records, capacity_records, busy) if f is not None]
    columns: dict[str, dict[str, str]] = {}
    notes: list[str] = []
    rows = _cost_rows(cost)
    names = list(rows)

    speed, memory_title, memory = _speed_and_memory(cost, rows)
    columns["L* vs SDPA (fwd+bwd)"] = speed
    if busy is not None:
        columns["L* beside a busy core (busy / quiet)"] = _busy(
            _crossovers(cost, rows), _crossovers(busy, _cost_rows(busy))
        )
    columns[memory_title] = memory
    recall_title, recall, note = _recall(quality)
    columns[recall_title] = recall
    notes += [note] if note else []
    columns[f"capacity (pairs within {capacity.WITHIN * 100:.0f} points of exact)"] = _capacity(
        capacity_records
    )
    decode_title, cost_per_token = _decode(decode_records)
    columns[decode_title] = cost_per_token

    for cells in columns.values():  # variants measured only in the other sweeps
        names += [n for n in cells if n not in names]
    table = pd.DataFrame(
        [
            {
                "variant": _label(n, rows.get(n, n)),
                **{t: c.get(n, EMPTY) for t, c in columns.items()},
            }
            for n in names
        ]
    )
    body = Table("", table).markdown().split("\n", 2)[2].rstrip("\n")  # no title
    return "\n".join([provenance(frames), "", body, "", *notes]).rstrip("\n") + "\n"


def _cost_rows(cost: pd.DataFrame) -> dict[str, str]:
    """Variant -> the label of its series in `cost`: per variant the first series in the
    report's order that is not exact attention's O(L²) form, a causal one where there is one
    (exact attention appears both ways, as each series' reference)."""
    labelled, _ = series.with_series(cost, x=SEQ_LEN)
    candidates: dict[str, list[tuple[bool, str]]] = {}
    for name in series.series_order(labelled):
        first = labelled[labelled["series"] == name].iloc[0]
        if first.get("attention.impl") == series.QUADRATIC:
            continue
        causal = first.get(CAUSAL)
        bidirectional = pd.notna(causal) and not bool(causal)
        candidates.setdefault(str(first[ATTENTION]), []).append((bidirectional, name))
    return {variant: min(names)[1] for variant, names in candidates.items()}


def _label(variant: str, name: str) -> str:
    """The row's name: the variant, and whether its series ran bidirectionally."""
    return variant + (" (bidirectional)" if name.endswith("(bidirectional)") else "")


def _crossovers(cost: pd.DataFrame, rows: dict[str, str]) -> dict[str, fit.Crossover]:
    """Variant -> its L* against SDPA from the in-job speed-ups (the headline's)."""
    labelled, keys = series.with_series(cost, x=SEQ_LEN)
    fits = scaling_fits.scaling_fits(labelled, keys, headline.TIME, baseline=series.FUSED)
    found = {v: fits[name].crossover for v, name in rows.items() if name in fits}
    return {v: c for v, c in found.items() if c is not None}


def _busy(quiet: dict[str, fit.Crossover], busy: dict[str, fit.Crossover]) -> dict[str, str]:
    """The busy run's L* per variant, with busy / quiet where both crossed inside the range."""
    cells = {}
    for variant, crossover in busy.items():
        cells[variant] = str(crossover)
        other = quiet.get(variant)
        if other is not None and fit.CROSSED == crossover.kind == other.kind:
            cells[variant] += f" ({crossover.length / other.length:.2f}×)"
    return cells


def _speed_and_memory(
    cost: pd.DataFrame, rows: dict[str, str]
) -> tuple[str, dict[str, str], dict[str, str]]:
    """The L* cells, and the kernel memory factor's title and cells."""
    speed = {v: str(c) for v, c in _crossovers(cost, rows).items()}
    if series.REFERENCE in rows and series.REFERENCE not in speed:
        speed[series.REFERENCE] = "reference"
    labelled, keys = series.with_series(cost, x=SEQ_LEN)
    title = "kernel memory vs O(L²)"
    if headline.MEMORY not in labelled:
        return speed, title, {}
    memory = series.mean_spread(labelled, SEQ_LEN, headline.MEMORY)
    references = series.reference_of(labelled, keys, series.QUADRATIC)
    factors = {
        variant: headline.memory_factor(memory, name, references[name])
        for variant, name in rows.items()
        if name in references
    }
    factors = {v: f for v, f in factors.items() if f is not None}
    lengths = {at for at, _ in factors.values()}
    if len(lengths) == 1:
        title += f" @ L={lengths.pop():,.0f}"
        cells = {v: headline.factor_text(ratio) for v, (_, ratio) in factors.items()}
    else:
        cells = {
            v: f"{headline.factor_text(ratio)} (L={at:,.0f})" for v, (at, ratio) in factors.items()
        }
    return speed, title, cells


def _recall(quality: pd.DataFrame | None) -> tuple[str, dict[str, str], str | None]:
    """Trained accuracy at the longest length of `quality`: the title (length, steps, floor,
    chance), the cells, and a warning when exact attention is below the ceiling there."""
    title = "recall"
    trained = None if quality is None else series.trained_quality(quality, headline.ACCURACY)
    if trained is None or trained.empty:
        return title, {}, None
    trained = accuracy.with_learned(trained)
    length = trained[SEQ_LEN].max()
    at = trained[trained[SEQ_LEN] == length]
    steps = accuracy.steps_behind(at).max()
    chance, floor = accuracy.chance_and_floor(trained)
    title += f" @ L={length:,.0f}"
    if pd.notna(steps):
        title += f", {steps:,.0f} steps"
    read_against = []
    if length in floor.index:
        read_against.append(f"floor {floor[length]:.1%}")
    if chance is not None:
        read_against.append(f"chance {chance:.1%}")
    if read_against:
        title += f" ({', '.join(read_against)})"
    cells = {}
    for variant, records in trained.groupby(ATTENTION, sort=False):
        mine = records[records[SEQ_LEN] == length]
        if not records["job_learned"].any():
            cells[str(variant)] = accuracy.not_learned_text(records)
        elif len(mine):
            cell = f"{mine[headline.ACCURACY].mean():.1%}"
            if not records["job_learned"].all():
                cell += f" ({accuracy.learned_cell(records)} learned)"
            cells[str(variant)] = cell
    exact = at.loc[at[ATTENTION] == series.REFERENCE, headline.ACCURACY]
    note = None
    if exact.empty or exact.mean() < CEILING:
        reached = "was not trained" if exact.empty else f"reached {exact.mean():.1%}"
        note = (
            f"WARNING: exact attention {reached} at L={length:,.0f}, below "
            f"{CEILING:.0%}: the recall column measures nothing there."
        )
    return title, cells, note


def _capacity(frame: pd.DataFrame | None) -> dict[str, str]:
    """Variant -> "head dim 16: 8; head dim 32: 16" from the report's capacity table (a row per
    variant at the sweep's usual depth and width: stacks and other shapes are the capacity
    page's)."""
    if frame is not None:
        frame = capacity.of_usual_shape(frame[~store.is_stack(frame)])
    table = None if frame is None else capacity.capacity(frame)
    if table is None:
        return {}
    cells = {series.REFERENCE: "reference"}
    for row in table.frame.to_dict("records"):
        variant = row.pop("variant")
        # The head dims only: the chosen rates are the report's (a column of its table).
        dims = {column: value for column, value in row.items() if column.startswith("head dim")}
        cells[variant] = "; ".join(f"{dim}: {value}" for dim, value in dims.items())
    return cells


def _decode(frame: pd.DataFrame | None) -> tuple[str, dict[str, str]]:
    """The decode column's title (the longest context, the batch) and its cells."""
    title = "decode: ms/token · cache"
    means, batch = (None, None) if frame is None else decode_report.per_context(frame)
    if means is None or means.empty:
        return title, {}
    longest = decode_report.at_longest(means)
    context = longest[SEQ_LEN].max()
    title = f"decode @ {decode_report.context_text(context)}"
    if batch is not None:
        title += f", batch {format_value(batch)}"
    title += ": ms/token · cache"
    cells = {}
    for _, row in longest.iterrows():
        cache = decode_report.cache_text(row[decode_report.CACHE])
        cell = f"{row[decode_report.TIME]:.3g} ms · {cache}"
        if row[SEQ_LEN] != context:
            cell += f" (at {decode_report.context_text(row[SEQ_LEN])})"
        cells[str(row[ATTENTION])] = cell
    return title, cells


def provenance(frames: Iterable[pd.DataFrame]) -> str:
    """ "Measured by sweeps `scaling`, `decode_quick`; newest record 2026-12-02; machine: vm,
    Intel Xeon (cpu), threads 2 (scaling), 1 (decode_quick); git commit 166d48d." """
    both = pd.concat(list(frames), ignore_index=True)

    def distinct(column: str) -> list[str]:
        if column not in both:
            return []
        return [format_value(v) for v in dict.fromkeys(both[column].dropna())]

    sweeps = distinct(SWEEP)
    text = "Measured by " + (
        ("sweeps " + ", ".join(f"`{s}`" for s in sweeps)) if sweeps else "unnamed sweeps"
    )
    stamps = pd.to_datetime(both.get(TIMESTAMP), utc=True, errors="coerce")
    if stamps is not None and stamps.notna().any():
        text += f"; newest record {stamps.max():%Y-%m-%d}"
    machine = [", ".join(distinct(HOSTNAME))]
    devices = distinct(DEVICE_NAME)
    if devices:
        machine.append(", ".join(devices) + (f" ({', '.join(distinct(DEVICE))})"))
    if THREADS in both and SWEEP in both:
        by_threads: dict[str, list[str]] = {}
        for sweep, threads in both.drop_duplicates([SWEEP, THREADS])[[SWEEP, THREADS]].itertuples(
            index=False
        ):
            if pd.notna(threads):
                by_threads.setdefault(format_value(threads), []).append(str(sweep))
        if len(by_threads) == 1:
            machine.append(f"threads {next(iter(by_threads))}")
        elif by_threads:
            machine.append(
                "threads " + ", ".join(f"{t} ({', '.join(s)})" for t, s in by_threads.items())
            )
    machine = [m for m in machine if m]
    text += f"; machine: {', '.join(machine) if machine else 'unknown'}"
    commits = [c[:7] for c in distinct(GIT_COMMIT)]
    text += f"; git commit {', '.join(commits) if commits else 'unknown'}."
    return text


def write_between_markers(path: Path, block: str) -> None:
    """Replace the text between the BEGIN and END lines of `path` with `block`."""
    text = path.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"--write: {path} must hold the lines {BEGIN} then {END}")
    start += len(BEGIN)
    path.write_text(text[:start] + "\n" + block + text[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.glance",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("results", nargs="+", help="the scaling sweep: time and memory over L")
    parser.add_argument("--quality", nargs="+", help="records of trained recall over lengths")
    parser.add_argument("--decode", nargs="+", help="records of decoding (measure.decode)")
    parser.add_argument("--capacity", nargs="+", help="records of a capacity sweep")
    parser.add_argument(
        "--busy", nargs="+", help="the scaling sweep again, run beside a CPU-bound process"
    )
    parser.add_argument("--write", type=Path, help=f"replace {BEGIN} … {END} in this file")
    args = parser.parse_args(argv)
    frames = {}
    for option in ("results", "quality", "decode", "capacity", "busy"):
        paths = getattr(args, option)
        try:
            frames[option] = load.tidy(load.load_results(paths)) if paths else None
        except (FileNotFoundError, ValueError) as error:
            where = "" if option == "results" else f"--{option}: "
            print(f"error: {where}{error}", file=sys.stderr)
            return 1
    block = glance(
        frames["results"],
        quality=frames["quality"],
        decode_records=frames["decode"],
        capacity_records=frames["capacity"],
        busy=frames["busy"],
    )
    if args.write is None:
        print(block, end="")
        return 0
    try:
        write_between_markers(args.write, block)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"glance: {args.write} updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
