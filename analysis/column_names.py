"""Record column names for figures and tables, taken from the one schema
(`experiments.records.record.SCHEMA`): a renamed or removed column fails where it is imported, not
silently as an empty figure or table column.

    from analysis.column_names import ATTN_FWD_BWD_MS, SEQ_LEN  # "attn_fwd_bwd_ms", "seq_len"

Every schema column is importable under its name in capitals, and nothing else is: importing a
name the schema does not hold raises ImportError naming it. `checked(name)` does the same for a
name built as the code runs.
"""

from __future__ import annotations

from experiments.records.record import COLUMNS, column


def __getattr__(attr: str) -> str:
    """`SEQ_LEN` -> "seq_len" for every schema column (PEP 562: also what `from ... import`
    asks, so an unknown name fails the importing module at import)."""
    if attr.isupper() and attr.lower() in COLUMNS:
        return attr.lower()
    raise AttributeError(f"analysis.column_names: no column {attr.lower()!r} in the record schema")


def __dir__() -> list[str]:
    return sorted(name.upper() for name in COLUMNS)


def checked(name: str) -> str:
    """`name` if it is a schema column (or a `<column>@<label>` evaluation column); ValueError
    naming it otherwise."""
    if column(name) is None:
        raise ValueError(f"analysis.column_names: no column {name!r} in the record schema")
    return name
