"""A record's values as one type: the store writing them (JSON's types, as a job recorded them)
and the loader reading them back (from CSV, where a bool is text and an int may be a float)
share these, the difference said by `read_back`."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

_TRUE, _FALSE = ("True", "true"), ("False", "false")  # a bool as CSV or JSON-minded text


def bool_or_none(value: Any, *, read_back: bool = False) -> bool | None:
    """`value` if it is a bool, else None. `read_back` (a value read back from a file): the
    text 'True'/'true' and 'False'/'false' is that bool too."""
    if isinstance(value, bool):
        return value
    if read_back and isinstance(value, str) and value in (*_TRUE, *_FALSE):
        return value in _TRUE
    return None


def text_or_none(value: Any, *, read_back: bool = False) -> str | None:
    """None for a missing value (None, NaN, `pd.NA`), else `value` as text (a str as itself).
    `read_back` (a value read back from a file): a whole float is an int's text (a CSV's number
    column: "3", not "3.0"). The store once wrote `pd.NA` (a nullable column's gap) as the
    text "<NA>", a value no job recorded."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if not read_back:
        return value if isinstance(value, str) else str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
