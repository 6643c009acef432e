"""attnbench analysis: sweep records (local or W&B) -> one DataFrame -> figures and report.md.

    from analysis import kernel_time, load
    frame = load.load_results(["multirun/scaling"])
    kernel_time.time_vs_seq_len(frame).savefig("time.png")

`python -m analysis.report multirun/scaling --out report/` writes every figure and the tables.
"""
