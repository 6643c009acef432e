"""The heads sweep's tables: crossovers by head dim, and what grouped KV heads change."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import fit, head_dims, load, report
from tests.analysis.conftest import FIXTURE, synthetic_records

LENGTHS = (4096, 16384)  # the heads preset's
D_MODEL = 256
HEADS = (8, 4, 2)  # head dim 32, 64, 128
# Each variant's crossover against exact attention (cost 1e-5·L² ms at every head dim, since
# H·d is fixed) as a function of head dim d: its cost is linear in L, 1e-5·L*(d)·L ms.
CROSSOVER = {
    "blockwise": lambda d: 3000 * d / 32,  # 3,000 (≤4,096), 6,000, 12,000: up
    "performer": lambda d: 6000 * (d / 32) ** 2,  # 6,000, 24,000 (>16,384), 96,000: up
    "linear": lambda d: 8000,  # the same at every head dim
}


def _time_ratio(kv: int, heads: int, length: int) -> float:
    """Kernel time with kv key/value heads over with all `heads`, per length."""
    if kv == heads:
        return 1.0
    return {(1, 4096): 0.7, (1, 16384): 0.6, (2, 4096): 0.8, (2, 16384): 0.75}[kv, length]


def _memory_ratio(kv: int, heads: int) -> float:
    return (kv + 3 * heads) / (4 * heads)


def heads_records(*, drop=(), speedups: bool = False) -> list[dict]:
    """Records as `+experiment=heads` writes them, for full and CROSSOVER's variants at every
    head dim and n_kv_heads 1, 2 and H, two seeds; lsh is skipped at n_kv_heads 1 and 2 and
    at head dim 128. `drop`: (attention, head dim) pairs left out. `speedups`: with the
    in-job `speedup_vs_sdpa` as the preset records it."""
    base = synthetic_records()[0]
    records = []
    for seed in (0, 1):
        for heads in HEADS:
            d = D_MODEL // heads
            for kv in sorted({1, 2, heads}):
                for length in LENGTHS:
                    exact = 1e-5 * length**2
                    costs = {"full": exact, "lsh": 10 * exact}
                    costs.update({n: 1e-5 * f(d) * length for n, f in CROSSOVER.items()})
                    for attention, cost in costs.items():
                        if (attention, d) in drop:
                            continue
                        cost *= _time_ratio(kv, heads, length) * (1 + 0.01 * seed)
                        rec = {
                            **base,
                            "sweep": "heads",
                            "job": str(len(records)),
                            "config_hash": f"h{len(records)}",
                            "attention": attention,
                            "seq_len": length,
                            "d_model": D_MODEL,
                            "n_heads": heads,
                            "head_dim": d,
                            "n_kv_heads": kv,
                            "shared_qk": attention == "lsh",  # as the app records it
                            "seed": seed,
                            "attn_fwd_ms": cost / 3,
                            "attn_fwd_bwd_ms": cost,
                            "attn_fwd_bwd_peak_bytes": 2**20 * _memory_ratio(kv, heads),
                        }
                        if speedups and attention != "full":
                            # SDPA timed in the same rounds, with the same seed's wobble
                            in_job = exact * _time_ratio(kv, heads, length) * (1 + 0.01 * seed)
                            rec["speedup_vs_sdpa"] = in_job / cost
                        if attention == "lsh" and (kv < heads or d == 128):
                            measured = [k for k in rec if k.endswith(("_ms", "_bytes", "_sdpa"))]
                            rec.update(
                                {k: None for k in measured},
                                status="skipped",
                                error="keys are the queries",
                            )
                        records.append(rec)
    return records


def frame_of(records: list[dict]) -> pd.DataFrame:
    return load.tidy(pd.DataFrame(records))


def rows_of(table) -> dict[str, dict]:
    return {row["variant"]: row for row in table.frame.to_dict("records")}


@pytest.mark.parametrize("speedups", [False, True], ids=["vs exact jobs", "in-job speed-ups"])
def test_a_variant_whose_cost_grows_with_head_dim_crosses_later(speedups):
    table = head_dims.crossovers_by_head_dim(frame_of(heads_records(speedups=speedups)))
    rows = rows_of(table)
    assert "full" not in rows  # the reference itself
    blockwise = rows["blockwise"]
    assert blockwise["L* @ head dim 32"] == "≤4,096"
    assert blockwise["L* @ head dim 64"] == "6,000"
    assert blockwise["L* @ head dim 128"] == "12,000"
    assert blockwise["moves"] == "up: ≤4,096 → 12,000 from head dim 32 to 128"
    performer = rows["performer"]
    assert performer["L* @ head dim 32"] == "6,000"
    assert performer["L* @ head dim 128"] == ">16,384"
    assert performer["moves"] == "up: 6,000 → >16,384 from head dim 32 to 128"
    assert rows["linear"]["moves"] == "stays 8,000 from head dim 32 to 128"
    assert list(table.frame.columns) == [
        "variant",
        "L* @ head dim 32",
        "L* @ head dim 64",
        "L* @ head dim 128",
        "moves",
    ]


def test_the_crossovers_are_the_reports_own_at_plain_multi_head():
    """Each cell is `scaling_fits`'s crossover of the n_kv_heads = n_heads series alone: the
    grouped-KV records (faster) do not move it."""
    records = heads_records()
    plain = [r for r in records if r["n_kv_heads"] == r["n_heads"]]
    assert head_dims.crossovers_by_head_dim(frame_of(records)).frame.equals(
        head_dims.crossovers_by_head_dim(frame_of(plain)).frame
    )
    at_64 = [r for r in plain if r["head_dim"] == 64]
    one = load.tidy(pd.DataFrame(at_64))
    exact = one[one["attention"] == "full"]
    mine = one[one["attention"] == "blockwise"]
    crossover = fit.crossover_length(
        mine["seq_len"], mine["attn_fwd_bwd_ms"], exact["seq_len"], exact["attn_fwd_bwd_ms"]
    )
    cell = rows_of(head_dims.crossovers_by_head_dim(frame_of(records)))["blockwise"]
    assert cell["L* @ head dim 64"] == str(crossover)


def test_missing_and_skipped_combinations_say_so():
    records = heads_records(drop={("blockwise", 64), ("performer", 32), ("performer", 64)})
    rows = rows_of(head_dims.crossovers_by_head_dim(frame_of(records)))
    assert rows["blockwise"]["L* @ head dim 64"] == "not run"
    assert rows["blockwise"]["moves"].startswith("up: ≤4,096 → 12,000")  # 32 and 128 still
    assert rows["lsh"]["L* @ head dim 128"] == "skipped"
    assert rows["lsh"]["L* @ head dim 32"] == ">16,384"  # 10× exact attention: never
    assert rows["lsh"]["moves"] == "stays >16,384 from head dim 32 to 64"
    assert rows["performer"]["L* @ head dim 32"] == "not run"
    assert rows["performer"]["moves"] == "—"  # one head dim with an L*: no direction


def test_no_exact_attention_at_a_head_dim_is_said():
    rows = rows_of(head_dims.crossovers_by_head_dim(frame_of(heads_records(drop={("full", 64)}))))
    assert rows["blockwise"]["L* @ head dim 64"] == "no exact attention"
    assert rows["blockwise"]["L* @ head dim 32"] == "≤4,096"


def test_grouped_kv_ratios_read_the_right_rows():
    table = head_dims.grouped_kv_heads(frame_of(heads_records()))
    frame = table.frame
    assert list(frame.columns) == [
        "variant",
        "heads",
        "head dim",
        "H_kv=1 @ L=4,096",
        "H_kv=2 @ L=4,096",
        "H_kv=1 @ L=16,384",
        "H_kv=2 @ L=16,384",
    ]

    def cell(variant, heads, column):
        rows = frame[(frame["variant"] == variant) & (frame["heads"] == heads)]
        assert len(rows) == 1
        return rows.iloc[0][column]

    # time / kernel memory against n_kv_heads = n_heads, same length and head count
    assert cell("full", 8, "H_kv=1 @ L=16,384") == "0.60 / 0.78"
    assert cell("full", 8, "H_kv=2 @ L=4,096") == "0.80 / 0.81"
    assert cell("blockwise", 4, "H_kv=1 @ L=4,096") == "0.70 / 0.81"
    assert cell("blockwise", 4, "H_kv=2 @ L=16,384") == "0.75 / 0.88"
    assert cell("full", 8, "head dim") == "32"
    assert cell("full", 2, "H_kv=2 @ L=4,096") == "= H"  # plain multi-head at 2 heads
    assert cell("lsh", 8, "H_kv=1 @ L=4,096") == "skipped"
    assert list(frame.loc[frame["variant"] == "full", "head dim"]) == ["32", "64", "128"]


def test_grouped_kv_without_its_plain_or_grouped_records_says_so():
    records = [
        r
        for r in heads_records()
        if not (r["attention"] == "linear" and r["n_heads"] == 8 and r["n_kv_heads"] == 8)
        and not (r["attention"] == "performer" and r["n_heads"] == 4 and r["n_kv_heads"] == 1)
    ]
    frame = head_dims.grouped_kv_heads(frame_of(records)).frame
    linear = frame[(frame["variant"] == "linear") & (frame["heads"] == 8)].iloc[0]
    assert linear["H_kv=1 @ L=4,096"] == "no H_kv=8 (not run)"
    performer = frame[(frame["variant"] == "performer") & (frame["heads"] == 4)].iloc[0]
    assert performer["H_kv=1 @ L=4,096"] == "not run"
    assert performer["H_kv=2 @ L=4,096"] == "0.80 / 0.88"


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(lambda: load.tidy(load.load_results([FIXTURE])), id="fixture"),
        pytest.param(lambda: frame_of(synthetic_records()), id="synthetic"),
        pytest.param(
            lambda: frame_of([r for r in heads_records() if r["n_heads"] == 4]), id="one head dim"
        ),
    ],
)
def test_other_sweeps_get_neither_table(frame):
    records = frame()
    assert head_dims.crossovers_by_head_dim(records) is None
    assert head_dims.grouped_kv_heads(records) is None


def test_the_report_shows_both_tables_for_a_heads_sweep():
    text = report.markdown(frame_of(heads_records()))
    assert "## Crossover against exact attention by head dim" in text
    assert "## Grouped KV heads: cost against H_kv = H" in text
    assert "| blockwise | ≤4,096 | 6,000 | 12,000 | up: ≤4,096 → 12,000 from head dim" in text
    # after the speed-up table it belongs with, before what was not measured
    assert text.index("## Per variant") < text.index("## Crossover against exact attention by")
    assert text.index("## Grouped KV heads") < text.index("## Not measured")


def test_the_direction_says_when_the_lengths_do_not_order_the_crossovers():
    crossed, faster, never = (
        lambda x: fit.Crossover(fit.CROSSED, x),
        lambda x: fit.Crossover(fit.ALWAYS_FASTER, x),
        lambda x: fit.Crossover(fit.NEVER, x),
    )
    assert head_dims.direction({32: faster(4096), 128: crossed(3000)}) == (
        "unresolved: ≤4,096 → 3,000 from head dim 32 to 128"
    )
    assert head_dims.direction({32: crossed(9000), 128: faster(4096)}).startswith("down: ")
    assert head_dims.direction({32: faster(4096), 128: faster(4096)}) == (
        "stays ≤4,096 from head dim 32 to 128"
    )
    assert head_dims.direction({32: crossed(5000), 64: crossed(4500), 128: never(16384)}) == (
        "up: 5,000 → >16,384 from head dim 32 to 128 (not monotone)"
    )
    assert head_dims.direction({32: crossed(2000), 128: crossed(5000)}) == (
        "up: 2,000 → 5,000 from head dim 32 to 128 (×2.5)"
    )
    uncertain = fit.Crossover(fit.CROSSED, 5000, uncertain=True)
    assert head_dims.direction({32: crossed(2000), 128: uncertain}) == (
        "up: 2,000 → 5,000 from head dim 32 to 128 (×2.5) (uncertain)"
    )
    assert head_dims.direction({32: crossed(2000)}) == "—"


def test_the_command_prints_both_tables_of_a_results_file(tmp_path, capsys):
    path = tmp_path / "results.csv"
    pd.DataFrame(heads_records()).to_csv(path, index=False)
    head_dims.main([str(path)])
    text = capsys.readouterr().out
    records = frame_of(heads_records())
    assert head_dims.crossovers_by_head_dim(records).markdown() in text
    assert head_dims.grouped_kv_heads(records).markdown() in text
