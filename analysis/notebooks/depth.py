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
# # Depth: memory and time of residual, reversible and checkpointed blocks
#
# The depth figure and table of `python -m analysis.report`, drawn from `RESULTS`.
# `python -m experiments.run -m +experiment=depth` writes `multirun/depth`.

# %%
# %matplotlib inline
from IPython.display import Markdown

from analysis import load, measured, peak_memory, report

# %% tags=["parameters"]
RESULTS = ["../../multirun/depth"]  # paths relative to this notebook's folder

# %%
frame = load.load_results(RESULTS)
Markdown(report.markdown_tables(frame, [peak_memory.depth_table, measured.failures]))

# %%
peak_memory.depth(frame)
