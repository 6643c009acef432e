"""The report's table of hybrid stacks on hand-made records of the hybrid preset's shape."""

from __future__ import annotations

import json

import pandas as pd

from analysis import decode_report, hybrid, load, report, series
from tests.analysis.conftest import FIXTURE

# stack -> (model.layers, step ms at L, peak bytes at L, decode ms, state bytes at L, accuracy)
STACKS = {
    "full": (None, lambda L: L / 10, lambda L: 1000 * L, 2.0, lambda L: 512 * L, 1.0),
    "deltanet": (["deltanet"], lambda L: 40.0, lambda L: 100_000, 1.0, lambda L: 8192, 0.3),
    "3×deltanet+full": (
        ["deltanet", "deltanet", "deltanet", "full"],
        lambda L: 30 + L / 40,
        lambda L: 250 * L + 75_000,
        1.25,
        lambda L: 128 * L + 6144,
        0.98,
    ),
}


def records() -> list[dict]:
    rows = []

    def add(stack, **columns):
        layers = STACKS[stack][0]
        rows.append(
            {
                "sweep": "hybrid",
                "config_hash": f"h{len(rows)}",
                "attention": "full",
                "layers": stack,
                "model.layers": None if layers is None else json.dumps(layers),
                "block": "residual",
                "depth": 4,
                "d_model": 64,
                "seed": 0,
                "timestamp": "2026-01-01T00:00:00",
                **columns,
            }
        )

    for number, (stack, (_, step, peak, decode, state, acc)) in enumerate(STACKS.items()):
        for length in (256, 4096):
            add(
                stack,
                job=str(len(rows)),
                status="ok",
                task="random_lm",
                seq_len=length,
                batch_size=1,
                **{"measure.step": True, "measure.memory": True, "measure.decode": True},
                step_ms=step(length),
                peak_memory_bytes=peak(length),
                decode_ms_per_token=decode,
                decode_state_bytes=state(length),
            )
        for length, accuracy in ((64, 1.0), (1024, acc)):
            job = f"{100 + number}" + ("/64" if length == 64 else "")
            add(
                stack,
                job=job,
                status="ok",
                task="long_recall",
                seq_len=length,
                batch_size=1024 // length,
                **{"measure.step": False, "measure.memory": False, "measure.decode": False},
                eval_accuracy=accuracy,
                trained_steps=1000 if length == 64 else 1150,
            )
    # The all-full stack at 16K ran out of memory: said so in its cell.
    add("full", job="99", status="oom", task="random_lm", seq_len=16384, **{"measure.step": True})
    return rows


def frame() -> pd.DataFrame:
    return load.tidy(pd.DataFrame(records()))


def test_the_table_compares_each_stack_with_the_all_full_stack_at_each_length():
    table = hybrid.hybrid_table(frame())
    assert table is not None and table.title == "Hybrid stacks"
    rows = table.frame.set_index("stack")
    assert list(rows.index) == ["full", "deltanet", "3×deltanet+full"]  # all-full first
    assert rows.loc["full", "step L=4096"] == "410 ms (1.00×) · 3.91 MiB (1.00×)"
    assert rows.loc["full", "step L=16384"] == "oom"
    assert rows.loc["deltanet", "step L=16384"] == "—"
    assert rows.loc["3×deltanet+full", "step L=4096"] == "132 ms (0.32×) · 1.05 MiB (0.27×)"
    assert rows.loc["deltanet", "step L=256"] == "40 ms (1.56×) · 0.0954 MiB (0.39×)"
    # The state: flat for the all-deltanet stack, growing with a full layer.
    assert rows.loc["deltanet", "decode L=256"] == "1 ms · 8 KiB"
    assert rows.loc["deltanet", "decode L=4096"] == "1 ms · 8 KiB"
    assert rows.loc["3×deltanet+full", "decode L=4096"] == "1.25 ms · 518 KiB"
    assert rows.loc["3×deltanet+full", "recall L=1024"] == "98.0"
    assert rows.loc["deltanet", "recall L=64"] == "100.0"
    assert rows.loc["deltanet", "learned"] == "yes"
    assert "crossover" in table.note and "decode_state_bytes" in table.note


def test_the_report_has_the_table_only_for_sweeps_of_hybrid_stacks():
    assert "## Hybrid stacks" in report.markdown_tables(frame())
    plain = load.tidy(load.load_results([FIXTURE]))
    assert hybrid.hybrid_table(plain) is None
    assert "## Hybrid stacks" not in report.markdown_tables(plain)
    # A plain model's `layers` is its attention: no series or table column of its own.
    assert "layers" in series.context_columns(frame())
    assert "layers" not in series.context_columns(plain)


def test_a_stacks_unit_and_its_share_of_full_layers():
    assert hybrid.unit("3×deltanet+full(impl=math)") == ["deltanet"] * 3 + ["full"]
    assert hybrid.full_share("sliding_window(window=64)+full") == 0.5
    assert hybrid.full_share("full") == 1.0


def test_records_from_before_layers_read_as_stacks_of_their_attention():
    old = pd.DataFrame([{"sweep": "s", "attention": "lsh", "status": "ok", "seq_len": 64}])
    assert load.tidy(old)["layers"].tolist() == ["lsh"]


def test_the_decode_section_names_each_stack_and_what_decoded():
    hybrid_frame = frame().assign(**{"measure.decode_scope": "model"})
    text = "\n".join(decode_report.headline(hybrid_frame))
    assert "(batch 1, the whole model, every layer's cache)" in text
    assert "**3×deltanet+full** at 4K: 1.25 ms/token, cache 518 KiB vs exact 2 MiB" in text
    assert "the kernel alone" in decode_report.scope_text(load.tidy(pd.DataFrame(records())))
