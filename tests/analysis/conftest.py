"""Shared fixtures: the committed sweep of real records, and W&B kept inside tmp dirs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from matplotlib.figure import Figure

FIXTURE = Path(__file__).parent / "fixtures" / "results"


def fixture_records() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(FIXTURE.glob("*/result.json"))]


@pytest.fixture
def sweep_copy(tmp_path) -> Path:
    """A writable copy of the committed fixture sweep dir."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "sweep"))


@pytest.fixture
def small_sweep(tmp_path) -> Path:
    """A sweep dir of a few fixture records (full and lsh, seed 0, and the timeouts): enough to
    draw every figure, cheaper to draw than the whole fixture."""
    sweep = tmp_path / "small_sweep"
    for path in sorted(FIXTURE.glob("*/result.json")):
        rec = json.loads(path.read_text())
        if (
            rec["sweep"] in ("scaling", "timeout")
            and rec["attention"] in ("full", "lsh")
            and rec["seed"] == 0
        ):
            shutil.copytree(path.parent, sweep / path.parent.name)
    return sweep


def synthetic_records() -> list[dict]:
    """Exact attention costs 1e-5·L² ms and lsh 1e-2·L ms (equal at L = 1000), two seeds 1 %
    either side of that; exact attention runs out of memory at 8192; linformer is skipped."""
    records = []
    for seed, wobble in ((0, 0.99), (1, 1.01)):
        for length in (256, 512, 1024, 2048, 4096, 8192):
            for attention, cost in (("full", 1e-5 * length**2), ("lsh", 1e-2 * length)):
                rec = {
                    "sweep": "synthetic",
                    "job": str(len(records)),
                    "config_hash": f"h{len(records)}",
                    "status": "ok",
                    "error": None,
                    "attention": attention,
                    "block": "residual",
                    "task": "random_lm",
                    "seq_len": length,
                    "batch_size": 1,
                    "d_model": 64,
                    "n_heads": 4,
                    "depth": 1,
                    "causal": True,
                    "dtype": "float32",
                    "seed": seed,
                    "device": "cpu",
                    "attn_fwd_ms": cost * wobble,
                    "attn_fwd_bwd_ms": 3 * cost * wobble,
                    "peak_memory_bytes": 2**20 * length / 256,
                    "approx_rel_error": 0.0 if attention == "full" else 0.1,
                    "approx_reference_digest": "abc123",  # measured on trained activations
                    "step_ms": 10 * cost,
                    "train_loss": 5.0,
                    "eval_loss": 5.1,
                    "attn_fwd_gflops_per_s": 10.0,
                    "attn_fwd_bwd_gflops_per_s": 20.0,
                    "matmul_peak_gflops_per_s": 100.0,
                    "timestamp": "2026-01-01T00:00:00",
                }
                if attention == "full" and length == 8192:
                    measured = [
                        k for k in rec if k.endswith(("_ms", "_bytes", "_s", "_loss", "_error"))
                    ]
                    rec.update(
                        {k: None for k in measured}, status="oom", error="OutOfMemoryError: cap"
                    )
                records.append(rec)
        records.append(
            {
                **records[-1],
                "config_hash": f"h{len(records)}",
                "attention": "linformer",
                "status": "skipped",
                "error": "cannot be causal",
                "seq_len": 1024,
                "attn_fwd_ms": None,
                "attn_fwd_bwd_ms": None,
                "step_ms": None,
                "peak_memory_bytes": None,
                "approx_rel_error": None,
                "train_loss": None,
                "eval_loss": None,
            }
        )
    return records


def texts(figure: Figure) -> list[str]:
    """Every text drawn in the figure: titles, annotations, legend entries."""
    found = [t.get_text() for t in figure.findobj(lambda a: hasattr(a, "get_text"))]
    return [t for t in found if t]
