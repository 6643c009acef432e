"""docs/ reads as reference: every page is short, every relative link and #anchor resolves, and
every generated block is what its generator writes.

Which test checks which generated block (each exactly one):
- README's registry table: tests/variants/test_registry.py (`python -m variants --write`);
- docs/measurements.md's columns: tests/experiments/records/test_docs.py;
- docs/variants.md's conformance table: here (`python -m variants.conformance --table`);
- README's glance table: here, its markers only (its generator reads sweeps that are not
  committed; tests/analysis/test_glance.py checks what it writes between them)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MAX_PAGE_LINES = 300
MAX_README_LINES = 250
PAGES = sorted(DOCS.rglob("*.md"))
MARKDOWN = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *PAGES]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def prose_lines(text: str) -> list[str]:
    """`text`'s lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: links to their text, lowercase, punctuation
    dropped (letters, digits, '_', '-' and spaces kept), each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in `path`, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        if m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of `path` whose file or #anchor does not exist."""
    broken = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{rel(path)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{rel(path)}: {target} (no such anchor)")
    return broken


def test_the_slug_is_githubs():
    assert slug("The main job (`make run`)") == "the-main-job-make-run"
    assert slug("Results and W&B") == "results-and-wb"
    assert slug("`long_range` tuned (2026-12-04, 48 + 16 jobs)") == (
        "long_range-tuned-2026-12-04-48--16-jobs"
    )


def test_the_link_check_sees_a_missing_file_and_anchor(tmp_path):
    page = tmp_path / "a.md"
    page.write_text(
        "# Top\n## Two words\n[ok](#two-words) [ok](a.md#top) [web](https://x.org/#y)\n"
        "[bad](#three) [bad](b.md)\n```\n[code](nowhere.md)\n```\n"
    )
    assert [b.split(": ", 1)[1] for b in broken_links(page)] == [
        "#three (no such anchor)",
        "b.md (no such file)",
    ]


def test_every_docs_page_is_short():
    long = {rel(p): n for p in PAGES if (n := len(p.read_text().splitlines())) > MAX_PAGE_LINES}
    assert not long, f"docs pages over {MAX_PAGE_LINES} lines (split; git keeps history): {long}"


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= MAX_README_LINES


def test_every_relative_link_resolves():
    broken = [b for path in MARKDOWN for b in broken_links(path)]
    assert not broken, "links to files or anchors that do not exist:\n" + "\n".join(broken)


CODE_REF = re.compile(r"docs/([\w/.-]+\.md)")


def code_files() -> list[Path]:
    dirs = ["variants", "experiments", "analysis", "benchmarks", "conf"]
    files = [p for d in dirs for p in (ROOT / d).rglob("*") if p.suffix in {".py", ".yaml"}]
    return [*files, ROOT / "Makefile", ROOT / "pyproject.toml"]


def test_every_docs_page_the_code_names_exists():
    missing = sorted(
        f"{rel(p)}: docs/{m}"
        for p in code_files()
        for m in CODE_REF.findall(p.read_text(encoding="utf-8"))
        if not (DOCS / m).exists()
    )
    assert not missing, "code names docs pages that do not exist:\n" + "\n".join(missing)


def test_the_glance_markers_are_in_the_readme_once():
    from analysis import glance

    text = (ROOT / "README.md").read_text()
    assert text.count(glance.BEGIN) == text.count(glance.END) == 1
    assert text.index(glance.BEGIN) < text.index(glance.END)


def test_the_glance_table_is_its_snapshots():
    from analysis import glance
    from analysis.load import load_results

    def snapshot(name):
        return load_results([str(ROOT / "docs" / "results" / f"{name}.csv")])

    block = glance.glance(
        snapshot("scaling"),
        quality=snapshot("long_range_quick"),
        decode_records=snapshot("decode_quick"),
        capacity_records=snapshot("capacity"),
    )
    text = (ROOT / "README.md").read_text()
    written = text[text.index(glance.BEGIN) + len(glance.BEGIN) : text.index(glance.END)]
    assert written == "\n" + block, (
        "README.md's glance table is not its snapshots': run the command above it "
        "(python -m analysis.glance docs/results/scaling.csv ... --write README.md)"
    )


@pytest.mark.slow
def test_the_conformance_table_is_generated():
    from variants import conformance, registry

    table = conformance.table(registry.attention_names())
    assert table in (DOCS / "variants.md").read_text(), (
        "docs/variants.md's conformance table is stale: run python -m variants.conformance --table"
    )


def test_the_hf_generate_table_is_its_snapshots():
    from benchmarks import hf_generate

    with open(ROOT / "docs" / "results" / "hf_generate.csv", newline="") as f:
        table = hf_generate.table(list(csv.DictReader(f)))
    assert table in (DOCS / "variants" / "hf.md").read_text(), (
        "docs/variants/hf.md's generate table is not its snapshot's: run "
        "python -m benchmarks.hf_generate --table-from docs/results/hf_generate.csv"
    )


def test_the_listops_table_is_its_snapshots():
    from analysis import suites
    from analysis.load import load_results

    frame = load_results([str(ROOT / "docs" / "results" / "listops.csv")])
    assert (
        suites.listops_table(frame).markdown() in (DOCS / "quality" / "listops.md").read_text()
    ), (
        "docs/quality/listops.md's table is not its snapshot's: run "
        "python -m analysis.suites docs/results/listops.csv"
    )


def test_the_hybrid_table_is_its_snapshots():
    from analysis import hybrid
    from analysis.load import load_results

    table = hybrid.hybrid_table(load_results([str(ROOT / "docs" / "results" / "hybrid.csv")]))
    assert table is not None and table.markdown() in (DOCS / "hybrid.md").read_text(), (
        "docs/hybrid.md's table is not its snapshot's: run "
        "python -m analysis.hybrid docs/results/hybrid.csv"
    )


def test_the_decode_table_is_its_snapshots():
    from analysis import decode_report
    from analysis.load import load_results

    frame = load_results([str(ROOT / "docs" / "results" / "decode.csv")])
    assert decode_report.decode_table(frame).markdown() in (DOCS / "decode.md").read_text(), (
        "docs/decode.md's table is not its snapshot's: run "
        "python -m analysis.decode_report docs/results/decode.csv"
    )


def test_the_sinks_row_is_its_snapshots():
    from analysis import published
    from analysis.load import load_results

    frame = load_results([str(ROOT / "docs" / "results" / "sliding_window_sinks.csv")])
    rows = published.published(frame).markdown().split("\n")
    [row] = [r for r in rows if r.startswith("| Attention sinks")]
    assert row in (DOCS / "quality" / "long_range.md").read_text(), (
        "docs/quality/long_range.md's sinks row is not its snapshot's: run "
        "python -m analysis.published docs/results/sliding_window_sinks.csv"
    )


def test_the_long_range_families_table_is_its_snapshots():
    from analysis import trained_quality
    from analysis.load import load_results

    frame = load_results([str(ROOT / "docs" / "results" / "long_range_families.csv")])
    table = trained_quality.quality_by_length(frame).markdown()
    assert table in (DOCS / "quality" / "long_range.md").read_text(), (
        "docs/quality/long_range.md's families table is not its snapshot's: regenerate it from "
        "docs/results/long_range_families.csv (trained_quality.quality_by_length)"
    )


def test_the_listops_checks_are_their_snapshots():
    from analysis import published
    from analysis.load import load_results

    frame = load_results([str(ROOT / "docs" / "results" / "listops.csv")])
    assert published.published(frame).markdown() in (DOCS / "quality" / "listops.md").read_text(), (
        "docs/quality/listops.md's published checks are not its snapshot's: run "
        "python -m analysis.published docs/results/listops.csv"
    )


def test_the_coverage_table_is_its_snapshots():
    from analysis import coverage
    from analysis.load import load_results

    table = coverage.probe_table(load_results([str(coverage.SNAPSHOT)]))
    rows = table.markdown().split("\n")[2 : 4 + len(table.frame)]  # header, rule and rows
    assert "\n".join(rows) in (DOCS / "quality.md").read_text(), (
        "docs/quality.md's covering-pattern table is not its snapshot's: run "
        "python -m analysis.not_learned"
    )


def test_the_performer_lookup_rows_are_the_commands():
    from benchmarks import lookup_weight

    # exact softmax and the default Performer: the rows a test can afford (the others draw
    # 2048 and 16384 features per seed: 20 s)
    rows = lookup_weight.table(["performer"]).split("\n")
    page = (DOCS / "variants" / "performer.md").read_text()
    assert all(row in page for row in rows), (
        "docs/variants/performer.md's lookup table is not the command's: run "
        "python -m benchmarks.lookup_weight"
    )


def test_the_mad_table_and_checks_are_their_snapshots():
    from analysis import published, suites
    from analysis.load import load_results

    frame = load_results([str(ROOT / "docs" / "results" / "mad.csv")])
    page = (DOCS / "quality" / "mad.md").read_text()
    assert suites.mad_table(frame).markdown() in page, (
        "docs/quality/mad.md's table is not its snapshot's: run "
        "python -m analysis.suites docs/results/mad.csv"
    )
    assert published.published(frame).markdown() in page, (
        "docs/quality/mad.md's published checks are not its snapshot's: run "
        "python -m analysis.published docs/results/mad.csv"
    )


def test_the_knob_table_is_its_snapshots():
    from analysis import approximation_error
    from analysis.load import load_results

    frame = load_results([str(ROOT / "docs" / "results" / "knobs.csv")])
    table = approximation_error.error_by_knob(frame).markdown().replace("## ", "### ")
    assert table in (DOCS / "quality" / "approximation.md").read_text(), (
        "docs/quality/approximation.md's knob table is not its snapshot's: run "
        "python -m analysis.approximation_error docs/results/knobs.csv"
    )


def test_the_capacity_tables_and_checks_are_their_snapshots():
    from analysis import capacity, frontier, published
    from analysis.load import load_results

    frame = load_results([str(ROOT / "docs" / "results" / "capacity.csv")])
    page = (DOCS / "quality" / "capacity.md").read_text()
    for table in (capacity.capacity(frame), capacity.accuracy_by_pairs(frame)):
        assert table.markdown().replace("## ", "### ") in page, (
            "docs/quality/capacity.md's tables are not its snapshot's: run "
            "python -m analysis.capacity docs/results/capacity.csv"
        )
    assert frontier.frontier_table(frame).markdown().replace("## ", "### ") in page, (
        "docs/quality/capacity.md's frontier is not its snapshot's: run "
        "python -m analysis.frontier docs/results/capacity.csv"
    )
    both = load_results(
        [str(ROOT / "docs" / "results" / name) for name in ("capacity.csv", "long_range_quick.csv")]
    )
    rows = published.published(both).markdown().split("\n", 2)[2]  # without its heading
    assert rows in (DOCS / "quality.md").read_text(), (
        "docs/quality.md's published checks are not the snapshots': run python -m "
        "analysis.published docs/results/capacity.csv docs/results/long_range_quick.csv"
    )


def test_the_heads_tables_are_their_snapshots():
    from analysis import head_dims
    from analysis.load import load_results

    frame = load_results([str(ROOT / "docs" / "results" / "heads.csv")])
    page = (DOCS / "heads.md").read_text()
    for table in (head_dims.crossovers_by_head_dim(frame), head_dims.grouped_kv_heads(frame)):
        assert table.markdown().replace("## ", "### ") in page, (
            "docs/heads.md's tables are not its snapshot's: run "
            "python -m analysis.head_dims docs/results/heads.csv"
        )


def test_the_masks_table_is_its_snapshot():
    from benchmarks import mask_cost

    rows, settings = mask_cost.read_csv(ROOT / "docs" / "results" / "mask_cost.csv")
    page = (DOCS / "masks.md").read_text()
    for block in (mask_cost.header(settings), mask_cost.table(rows)):
        assert block in page, (
            "docs/masks.md's table is not its snapshot's: run "
            "python -m benchmarks.mask_cost --table docs/results/mask_cost.csv"
        )


@pytest.mark.parametrize(
    "page, snapshot",
    [("selection.md", "selection_targets.csv"), ("million.md", "million.csv")],
)
def test_the_targets_tables_are_their_snapshots(page, snapshot):
    from benchmarks.targets.__main__ import saved_table

    table = saved_table(ROOT / "docs" / "results" / snapshot)
    assert table in (DOCS / page).read_text(), (
        f"docs/{page}'s table is not its snapshot's: run "
        f"python -m benchmarks.targets --table docs/results/{snapshot}"
    )


def test_the_swap_table_is_its_snapshot():
    from analysis import trained_quality
    from analysis.load import load_results

    frame = load_results([str(ROOT / "docs" / "results" / "swap.csv")])
    table = trained_quality.quality(frame).markdown().replace("## ", "### ")
    assert table in (DOCS / "swap.md").read_text(), (
        "docs/swap.md's table is not its snapshot's: run "
        "python -m analysis.trained_quality docs/results/swap.csv"
    )


def test_the_main_jobs_time_table_is_its_snapshots():
    from analysis import job_phases
    from analysis.load import load_results

    names = ("scaling", "decode_quick", "long_range_quick")
    frame = load_results([str(ROOT / "docs" / "results" / f"{n}.csv") for n in names])
    table = job_phases.phases(frame).markdown().replace("## ", "### ")
    assert table in (DOCS / "running.md").read_text(), (
        "docs/running.md's time table is not its snapshots': run python -m analysis.job_phases "
        "docs/results/scaling.csv docs/results/decode_quick.csv docs/results/long_range_quick.csv"
    )


@pytest.mark.parametrize(
    "preset", ["reformer_table2", "shared_qk", "reversible_quality", "quality_speed"]
)
def test_the_reproductions_tables_are_their_snapshots(preset):
    from analysis import trained_quality
    from analysis.load import load_results

    frame = load_results([str(ROOT / "docs" / "results" / f"{preset}.csv")])
    built = (
        trained_quality.cross_evaluation if preset == "reformer_table2" else trained_quality.quality
    )
    table = built(frame).markdown().replace("## ", "### ")
    assert table in (DOCS / "reproductions.md").read_text(), (
        f"docs/reproductions.md's {preset} table is not its snapshot's: run "
        f"python -m analysis.trained_quality docs/results/{preset}.csv"
    )


def test_the_quiet_and_busy_crossovers_are_their_snapshots():
    from analysis import crossovers
    from analysis.load import load_results, tidy

    quiet, busy = (
        tidy(load_results([str(ROOT / "docs" / "results" / f"{name}.csv")]))
        for name in ("scaling", "scaling_busy")
    )
    table = crossovers.side_by_side(quiet, busy, ("quiet", "busy")).markdown()
    assert table.replace("## ", "### ") in (DOCS / "report.md").read_text(), (
        "docs/report.md's quiet and busy table is not its snapshots': run python -m "
        "analysis.crossovers docs/results/scaling.csv --beside docs/results/scaling_busy.csv "
        "--labels quiet busy"
    )


def test_the_decay_profile_table_is_the_commands():
    from experiments.measurement import decay_profile

    assert decay_profile.table() in (DOCS / "variants" / "common.md").read_text(), (
        "docs/variants/common.md's decay table is not the command's: run "
        "python -m experiments.measurement.decay_profile"
    )
