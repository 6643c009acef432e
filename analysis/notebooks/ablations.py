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
# # Ablations: what each variant gives up
#
# Approximation error against length and against each variant's knob, training curves, and the
# quality–speed–memory trade-off, drawn from `RESULTS` as in `python -m analysis.report`.
# The `lsh` and `linformer` presets sweep the knobs; any sweep with training gives curves.

# %%
# %matplotlib inline
from analysis import approximation_error, load, tradeoff, training_curves

# %% tags=["parameters"]
RESULTS = ["../../multirun/lsh", "../../multirun/linformer"]  # relative to this folder
SEQ_LEN = None  # length of the training-curve and trade-off figures; None = most measured

# %%
frame = load.load_results(RESULTS)

# %%
approximation_error.error_vs_seq_len(frame)

# %%
approximation_error.error_vs_knob(frame)

# %%
training_curves.training_curves(frame, seq_len=SEQ_LEN)

# %%
tradeoff.tradeoff(frame, seq_len=SEQ_LEN)
