"""Peak memory on CPU: the profiler's chatter stays off the console, its numbers stay right."""

from __future__ import annotations

import sys

import torch

from experiments.measurement.memory import peak_memory_bytes


def test_profiler_chatter_is_kept_off_the_console_and_other_output_is_not(capfd):
    x = torch.randn(64, 64)
    before = [torch.randn(256)]  # allocated before profiling: freed inside it ("unknown size")

    def step():
        before.clear()
        print("a line of the measured code", file=sys.stderr)
        (x @ x).sum()

    peak = peak_memory_bytes(step)
    err = capfd.readouterr().err
    assert "USDT" not in err and "Memory block of unknown size" not in err, err
    assert err.splitlines() == ["a line of the measured code"]
    assert peak >= 64 * 64 * 4  # the product's bytes
