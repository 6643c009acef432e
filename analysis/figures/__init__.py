"""The drawing kit every report figure shares; the figures themselves live in the report's
sections, with the tables of their topic (`analysis.report.SECTIONS`, analysis/section.py).

style                colours, markers and line styles per series, panels, legends below them,
                     labels placed without overlap, and `nothing_drawn`
"""

from analysis.figures.style import nothing_drawn, series_styles, variant_color

__all__ = ["nothing_drawn", "series_styles", "variant_color"]
