"""attnbench analysis: sweep records (local or W&B) -> one DataFrame -> figures and report.md.

    from analysis import figures, load
    frame = load.load_results(["multirun/scaling"])
    figures.time_vs_seq_len(frame).savefig("time.png")

`python -m analysis.report multirun/scaling --out report/` writes every figure and the tables.
"""


def __getattr__(name: str):
    """`analysis.scaling`, the old name of `analysis.scaling_fits` (issue 39: three scaling.py),
    for analysis/figures/memory.py and scaling.py until they import the new name; then this goes."""
    if name == "scaling":
        from analysis import scaling_fits

        return scaling_fits
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
