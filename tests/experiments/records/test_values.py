"""A record's values as one type: as the store writes them, and as the loader reads them back."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments.records.values import bool_or_none, text_or_none


@pytest.mark.parametrize(
    ("value", "written", "read_back"),
    [
        (True, True, True),
        (False, False, False),
        ("True", None, True),
        ("false", None, False),
        ("TRUE", None, None),
        (1, None, None),
        (None, None, None),
        (math.nan, None, None),
    ],
)
def test_a_bool_is_a_bool_and_read_back_also_its_text(value, written, read_back):
    assert bool_or_none(value) is written
    assert bool_or_none(value, read_back=True) is read_back


@pytest.mark.parametrize(
    ("value", "written", "read_back"),
    [
        (None, None, None),
        (math.nan, None, None),
        (pd.NA, None, None),  # missing when written too, never the text "<NA>"
        ("auto", "auto", "auto"),
        (64, "64", "64"),
        (3.0, "3.0", "3"),  # a CSV's number column reads 3 back as 3.0
        (3.5, "3.5", "3.5"),
    ],
)
def test_text_and_read_back_a_whole_float_as_an_int(value, written, read_back):
    assert text_or_none(value) == written
    assert text_or_none(value, read_back=True) == read_back
