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

from analysis import figures, load, measured, memory_depth, report

# %% tags=["parameters"]
RESULTS = ["../../multirun/depth"]  # paths relative to this notebook's folder

# %%
frame = load.load_results(RESULTS)
Markdown(report.markdown_tables(frame, [memory_depth.depth_table, measured.failures]))

# %%
figures.depth(frame)
