"""The crossovers command: the in-job speed-up table of a results dir, printed."""

from __future__ import annotations

import json

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


def test_prints_each_variants_crossover_and_speedups(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    job = 0
    for length, speedup, spread in ((256, 0.5, 0.1), (1024, 0.8, 0.3), (4096, 1.25, 0.1)):
        for attention, value in (("full", 1.0), ("blockwise", speedup)):
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
    assert crossovers.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("| blockwise")]
    # 0.8 at 1024 with an IQR of 0.3: the crossing at 2,048 is uncertain.
    assert row.startswith("| blockwise | ≈2,048 (uncertain) |")
    assert "| 0.50 (0.10) | 0.80 (0.30) | 1.25 (0.10) |" in row
    assert not [line for line in out.splitlines() if line.startswith("| full")]


def test_results_without_speedups_are_an_error(tmp_path, capsys):
    _write(tmp_path / "sweep", 0, attention="full", seq_len=256, attn_fwd_bwd_ms=1.0)
    assert crossovers.main([str(tmp_path / "sweep")]) == 1
    assert "no speedup_vs_sdpa" in capsys.readouterr().err
