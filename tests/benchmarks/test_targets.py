"""The target table's arithmetic, its kernels, and a run of the script at toy lengths."""

from __future__ import annotations

import math
import types

import pytest

from benchmarks.targets import __main__ as cli
from benchmarks.targets import call_timing, decode, flex_compare, kernels, million, steps
from variants.registry import MILLION_FLOPS, attention_spec, forward_flops, million_flops, select


def test_kernels_are_the_layers_of_the_targets_model():
    for name in kernels.kernel_settings():
        kernel = kernels.kernel(name, 512)
        layer_kernel = next(kernels.model(name, 512).kernels())
        assert type(kernel) is type(layer_kernel) and kernel.causal == (name != "linformer")
        assert kernel.extra_repr() == layer_kernel.extra_repr(), name
    assert kernels.kernel("blockwise-6x64", 512).look_backward == 5


def test_toy_run_prints_a_row_per_target(monkeypatch, capsys):
    # Decoding at toy contexts too (64K by default): the rows, not the machine, are tested.
    monkeypatch.setattr(decode, "DECODE_SHORT", 256)
    monkeypatch.setattr(decode, "DECODE_WINDOWED", 256)
    # One call per timing, not 0.3 s of them: the table's arithmetic is what is tested.
    timed = call_timing.seconds_per_call
    monkeypatch.setattr(call_timing, "seconds_per_call", lambda fn: timed(fn, min_time_s=0))
    # Compiled FlexAttention at the first length only, for one pattern: each length and pattern
    # compiles anew (on a fresh machine 60 s for five patterns, most of this test's time); one
    # length and one pattern show the rows and the length filter. Each pattern's flex path is
    # tested against its own kernel in tests/variants/attention.
    monkeypatch.setattr(flex_compare, "FLEX_KERNELS", ("strided",))
    cli.main(
        ["--lengths", "256,512", "--rounds", "1", "--min-seconds", "0", "--threads", "1"]
        + ["--skip-memory", "--skip-depth"]
        + ["--decode-len", "512", "--flex-max-len", "256"]
    )
    table = capsys.readouterr().out.split("| target")[1]
    cells = [line.split("|") for line in table.splitlines()[2:]]
    rows = {cell[1].strip(): cell[2].strip() for cell in cells}
    assert "lsh speed-up, L=512" in rows and "full time / SDPA time, L=256" in rows
    assert "blockwise scaling exponent 256->512" in rows
    assert "bigbird time / blockwise-6x64 time, L=512" in rows
    assert "longformer scaling exponent 256->512" in rows
    assert "full decode bandwidth fraction, L=512" in rows
    flex_rows = [row for row in rows if row.startswith("compiled flex fwd / ")]
    assert sorted(flex_rows) == sorted(
        f"compiled flex fwd / {name} fwd, L=256" for name in flex_compare.FLEX_KERNELS
    )
    assert all(math.isfinite(float(value)) for value in rows.values())
    # The 32K targets are not judged at toy lengths: those rows carry no bound.
    bounds = {cell[1].strip(): cell[3].strip() for cell in cells}
    for row in (
        "blockwise speed-up, L=512",
        "lsh FLOP/s / matmul rate, L=512",
        "bigbird speed-up, L=512",
    ):
        assert bounds[row] == ""


def test_each_contender_is_measured_against_the_yardstick_timed_around_it(monkeypatch):
    # Scripted seconds per call: the yardstick slows down by 2x after every contender.
    clock = iter([1.0, 10.0, 2.0, 20.0, 4.0, 1.0, 11.0, 2.0, 21.0, 4.0])
    monkeypatch.setattr(call_timing, "seconds_per_call", lambda fn: next(clock))
    calls = {"a": lambda: None, "b": lambda: None}
    times, yardsticks = call_timing.time_in_rounds(calls, 2, lambda: None)
    assert times == {"a": [10.0, 11.0], "b": [20.0, 21.0]}
    # Geometric means of the yardstick just before and just after each contender's call.
    assert yardsticks["a"] == pytest.approx([math.sqrt(2), math.sqrt(2)])
    assert yardsticks["b"] == pytest.approx([math.sqrt(8), math.sqrt(8)])


def test_rounds_continue_until_the_minimum_time_is_spent(monkeypatch):
    now = [0.0]

    def one_second_call(fn):
        now[0] += 1.0
        return 1.0

    monkeypatch.setattr(call_timing, "seconds_per_call", one_second_call)
    monkeypatch.setattr(call_timing, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    calls = {"a": lambda: None}
    # A round is the yardstick, the contender and the yardstick again: 3 s.
    times, _ = call_timing.time_in_rounds(calls, 2, lambda: None, min_seconds=10)
    assert len(times["a"]) == 4  # 3, 6, 9 s: still under 10 after the third round
    times, _ = call_timing.time_in_rounds(calls, 2, lambda: None)
    assert len(times["a"]) == 2


def test_million_rows_run_each_step_in_its_own_process(capsys):
    rows = million.million_rows(256, "blockwise,sparse_fixed")
    ran, left_out = rows
    assert ran.seconds > 0 and ran.peak_rss_bytes > 2**20
    assert 0 < ran.cpu_seconds  # the step's process time, every thread
    assert ran.bound_bytes == million.MILLION_LIMIT_BYTES
    assert left_out.seconds is None and "FLOP per forward at 2^20 tokens" in left_out.note
    failed = steps.run_step_row("broken", "no-such-variant", 256, 1, "residual", 256)
    assert failed.seconds is None and "no-such-variant" in failed.note
    steps.print_step_table([*rows, failed])
    table = capsys.readouterr().out
    assert "| blockwise, 1 layer, L=256 |" in table and "| < 16 GB | yes |" in table
    assert "| broken | | | | | failed (exit 1)" in table


def test_a_million_tokens_run_the_variants_their_flop_models_let():
    chosen = million.million_kernels()
    skipped = million.not_run()
    assert not set(chosen) & set(skipped)
    assert set(chosen) | set(skipped) == set(select("causal", "published"))
    for name in chosen:  # within the budget, by the variant's own FLOP model
        assert million_flops(attention_spec(name)) <= MILLION_FLOPS
    assert {"full", "compressed", "sparse_fixed"} <= set(skipped)  # quadratic: >= 1.2e14
    # every variant whose cost is linear in the length is in, the families of 2025 too
    for name in select("causal", "published"):
        spec = attention_spec(name)
        if forward_flops(spec, 2**14) == 2 * forward_flops(spec, 2**13):
            assert name in chosen
    assert {"gated_deltanet", "mamba2", "sliding_window", "nsa", "moba"} <= set(chosen)


def test_the_memory_bound_is_16_gb_to_a_million_tokens_and_20_beyond():
    assert million.million_bound(2**20) == 16 * 10**9
    assert million.million_bound(2**21) == 20 * 10**9


def test_a_step_row_trains_the_switched_model_once(monkeypatch):
    built = []
    real = steps.TransformerLM
    monkeypatch.setattr(steps, "TransformerLM", lambda config: built.append(config) or real(config))
    row = steps.step_row("lsh", "128", "2", "reversible", "64")
    assert row["seconds"] > 0 and row["peak_rss_bytes"] > 0
    (config,) = built
    assert (config.depth, config.block, config.d_model, config.max_seq_len) == (
        2,
        "reversible",
        64,
        128,
    )
    assert {k: getattr(config, k) for k in steps.MILLION_SWITCHES} == steps.MILLION_SWITCHES
