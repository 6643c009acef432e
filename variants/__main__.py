"""`python -m variants` prints the registry table that README.md embeds."""

import argparse

from variants.registry import registry_table

argparse.ArgumentParser(
    prog="python -m variants",
    description=(
        "Print the attention registry table (variant, options and defaults, time and memory "
        "complexity, causal, exact) as Markdown: the table of README.md's 'The registry' "
        "section, generated from the variants' specs. Paste it there after adding or changing "
        "a variant; tests/variants/test_registry.py checks that README holds it."
    ),
).parse_args()
print(registry_table())
