"""The crossovers command: the in-job speed-up table of a results dir, printed."""

from __future__ import annotations

import json

import pytest

from analysis import crossovers


def _write(sweep, job, **record):
    base = {
        "sweep": "s",
        "status": "ok",
        "task": "random_lm",
        "block": "residual",
        "seed": 0,
        "causal": True,
        "model.causal": True,
        "config_hash": f"h{job}",
        "job": str(job),
        "timestamp": f"2026-01-01T00:00:{job:02d}",
        "offline_run_dir": None,
    }
    (sweep / str(job)).mkdir(parents=True)
    (sweep / str(job) / "result.json").write_text(json.dumps({**base, **record}))


def _power_law_sweep(sweep, factor=1.0, spreads=(0.01, 0.01, 0.01)):
    """blockwise's speed-up, a power law crossing 1 at 2,048 (x1.5625 per quadrupling), times
    `factor`, with the rounds' IQRs `spreads` at 256, 1024 and 4096."""
    job = 0
    lengths = ((256, 0.512), (1024, 0.8), (4096, 1.25))
    for (length, speedup), spread in zip(lengths, spreads, strict=True):
        for attention, value in (("full", 1.0), ("blockwise", speedup * factor)):
            _write(
                sweep,
                job,
                attention=attention,
                seq_len=length,
                attn_fwd_bwd_ms=1.0,
                speedup_vs_sdpa=value,
                speedup_vs_sdpa_iqr=spread,
            )
            job += 1


def test_prints_each_variants_crossover_and_speedups(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _power_law_sweep(sweep, spreads=(0.1, 0.3, 0.1))
    assert crossovers.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("| blockwise")]
    # A power law (x1.5625 per quadrupling) crossing 1 at 2,048; 0.8 at 1024 with an IQR of
    # 0.3 makes it uncertain.
    assert row.startswith("| blockwise | ≈2,048 (uncertain) |")
    assert "| 0.51 (0.10) | 0.80 (0.30) | 1.25 (0.10) |" in row
    assert not [line for line in out.splitlines() if line.startswith("| full")]


def test_results_without_speedups_are_an_error(tmp_path, capsys):
    _write(tmp_path / "sweep", 0, attention="full", seq_len=256, attn_fwd_bwd_ms=1.0)
    assert crossovers.main([str(tmp_path / "sweep")]) == 1
    assert "no efficient variant with speedup_vs_sdpa" in capsys.readouterr().err


def test_speedups_over_the_quadratic_form_chain_through_its_own_job(tmp_path, capsys):
    """The main job times the O(L²) form in one job per length (impl=math, against SDPA): a
    variant timed against SDPA only gets t_math / t_X =
    speedup_vs_sdpa(X) / speedup_vs_sdpa(math)."""
    sweep = tmp_path / "sweep"
    rows = [  # (attention, impl, length, speedup_vs_sdpa, its IQR)
        ("full", "sdpa", 256, 1.0, 0.0),
        ("full", "sdpa", 1024, 1.0, 0.0),
        ("full", "math", 256, 0.5, 0.0),  # the O(L²) form: 2× slower than SDPA at 256
        ("full", "math", 1024, 0.2, 0.02),  # 5× at 1024
        ("blockwise", "sdpa", 256, 0.25, 0.0),  # vs O(L²): 0.5 at 256
        ("blockwise", "sdpa", 1024, 0.4, 0.04),  # vs O(L²): 2.0 at 1024, IQR 2 × (0.1 + 0.1)
    ]
    for job, (attention, impl, length, value, spread) in enumerate(rows):
        _write(
            sweep,
            job,
            attention=attention,
            seq_len=length,
            **{"attention.impl": impl} if attention == "full" else {},
            attn_fwd_bwd_ms=1.0,
            speedup_vs_sdpa=value,
            speedup_vs_sdpa_iqr=spread,
        )
    assert crossovers.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| variant"))
    (row,) = [line for line in out.splitlines() if line.startswith("| blockwise")]
    cells = dict(zip(header.split("|"), row.split("|"), strict=True))
    # 0.5 at 256 and 2.0 at 1024 cross 1 halfway in log L: 512; the spread at 1024 (0.4) is
    # narrower than its distance from 1, so the crossing is certain.
    assert cells[" L* vs O(L²) "].strip() == "512"
    assert cells[" L* vs SDPA "].strip() == ">1,024"
    from analysis import load, scaling_fits, series

    labelled, keys = series.with_series(load.tidy(load.load_results([sweep])), x="seq_len")
    chained = scaling_fits.with_chained_speedups(labelled, keys)
    mine = chained[chained["attention"] == "blockwise"].set_index("seq_len")
    assert mine["speedup_vs_math"].tolist() == pytest.approx([0.5, 2.0])
    assert mine["speedup_vs_math_iqr"].tolist() == pytest.approx([0.0, 2.0 * (0.1 + 0.1)])
    # A value the job measured itself is kept, and the O(L²) series gets none.
    labelled.loc[labelled["attention"] == "blockwise", "speedup_vs_math"] = 3.0
    kept = scaling_fits.with_chained_speedups(labelled, keys)
    assert (kept.loc[kept["attention"] == "blockwise", "speedup_vs_math"] == 3.0).all()
    math_rows = chained[chained.get("attention.impl") == "math"]
    assert math_rows["speedup_vs_math"].isna().all()


def test_two_runs_side_by_side_say_how_far_apart_their_crossovers_are(tmp_path, capsys):
    # The busy run's speed-ups 0.8x the quiet one's: x1.5625 per quadrupling puts its
    # crossing a factor 4^(log 1.25 / log 1.5625) = 2 later.
    _power_law_sweep(tmp_path / "quiet", 1.0)
    _power_law_sweep(tmp_path / "busy", 0.8)
    assert crossovers.main([str(tmp_path / "quiet"), "--beside", str(tmp_path / "busy")]) == 0
    out = capsys.readouterr().out
    assert "| variant | L* vs SDPA, quiet | L* vs SDPA, busy | apart |" in out
    (row,) = [line for line in out.splitlines() if line.startswith("| blockwise")]
    # (uncertain: the busy run's speed-up at 4,096 is 1.00, within its spread of 1)
    assert row == "| blockwise | 2,048 | ≈4,096 (uncertain) | 2.00× | 1.25 / 1.00 at 4,096 |"


def test_the_two_runs_can_be_named(tmp_path, capsys):
    _power_law_sweep(tmp_path / "a")
    _power_law_sweep(tmp_path / "b", 0.8)
    argv = [str(tmp_path / "a"), "--beside", str(tmp_path / "b"), "--labels", "quiet", "busy"]
    assert crossovers.main(argv) == 0
    assert "| variant | L* vs SDPA, quiet | L* vs SDPA, busy | apart |" in capsys.readouterr().out


def test_labels_without_a_second_run_are_one_line(tmp_path, capsys):
    _power_law_sweep(tmp_path / "a")
    with pytest.raises(SystemExit) as ended:
        crossovers.main([str(tmp_path / "a"), "--labels", "quiet", "busy"])
    assert ended.value.code == 2
    assert "argument --labels" in capsys.readouterr().err
