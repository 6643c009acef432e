"""The report's figures, grouped by what they show; each takes a results frame (`analysis.load`)
and returns a matplotlib Figure.

quality              training curves and final losses; trained accuracy against length
tradeoff             quality against speed against memory at one length
style                the drawing kit they share (and `analysis.capacity`,
                     `analysis.decode_report` use)
"""

from analysis.figures.quality import (
    accuracy_vs_seq_len,
    one_record_per_run,
    training_curves,
    why_no_curves,
)
from analysis.figures.style import nothing_drawn, series_styles, variant_color
from analysis.figures.tradeoff import tradeoff, tradeoff_quality

__all__ = [
    "accuracy_vs_seq_len",
    "nothing_drawn",
    "one_record_per_run",
    "series_styles",
    "tradeoff",
    "tradeoff_quality",
    "training_curves",
    "why_no_curves",
    "variant_color",
]
