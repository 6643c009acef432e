"""The configuration columns that set records apart (`context_columns`): a series' identity
(analysis.series) and a tuning family's (analysis.tuning), below both. The grid axes (`TUNED`)
are tuning, not a configuration, so they are left out."""

from __future__ import annotations

import pandas as pd

from experiments.records.record import config_keys
from experiments.records.store import has_hybrid

LR = "train.lr"
WD = "train.weight_decay"
# The axes a grid may sweep: tuning, not a configuration (`context_columns` leaves them out of a
# series' identity).
TUNED = (LR, WD)


def context_columns(frame: pd.DataFrame) -> list[str]:
    """The configuration columns that set series apart: every hashed config key of the frame
    (`experiments.records.record.config_keys`: the model, block, task, training, threads, ...) but
    the attention's own (in `variant`), the seed, and `measure.*`, which decides which quantities
    are taken and for how long the clock runs, not the configuration they are taken of. The
    learning rate (and weight decay) is left out too: a grid of it is tuning, not a
    configuration (quality rows are each variant's chosen point, `trained_quality`), and it
    changes no time or memory, so a variant's jobs at every point of its grid are one series of
    speed and memory. The stack (`layers`) sets series apart only where one mixes variants: a
    plain model's is its attention, already the variant."""
    return [
        c
        for c in config_keys(frame.columns, hashed_only=True)
        if c not in ("attention", "seed", *TUNED)
        and not c.startswith(("attention.", "measure."))
        and (c != "layers" or has_hybrid(frame))  # else each record's attention again
    ]
