# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Scaling: time, memory and FLOP/s against sequence length
#
# The same figures and table as `python -m analysis.report`, drawn from `RESULTS`: sweep dirs,
# `results.csv`/`.parquet` files; training curves come from each job's history.parquet.
# `python -m experiments.run -m +experiment=scaling` writes `multirun/scaling`.

# %%
# %matplotlib inline
from IPython.display import Markdown

from analysis import flop_rate, kernel_time, load, measured, peak_memory, report

# %% tags=["parameters"]
RESULTS = ["../../multirun/scaling"]  # paths relative to this notebook's folder

# %%
frame = load.load_results(RESULTS)
Markdown(report.markdown_tables(frame, [kernel_time.variant_summary, measured.failures]))

# %%
kernel_time.time_vs_seq_len(frame)

# %%
peak_memory.memory_vs_seq_len(frame)

# %%
flop_rate.flops_fraction(frame)
