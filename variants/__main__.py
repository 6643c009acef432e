"""`python -m variants [--write README.md]` prints the registry table that README.md embeds,
or writes it in place there (between its header row and the first blank line after it)."""

import argparse
import sys
from pathlib import Path

from variants.registry import registry_table

parser = argparse.ArgumentParser(
    prog="python -m variants",
    description=(
        "Print the attention registry table (variant, options and defaults, time and memory "
        "complexity, causal, exact, masks, GQA, Hugging Face) as Markdown, generated from the "
        "variants' specs; --write FILE replaces the table in FILE (README.md's 'The registry' "
        "section). tests/variants/test_registry.py checks that README holds it."
    ),
)
parser.add_argument("--write", metavar="FILE", help="replace the table in FILE")
args = parser.parse_args()
table = registry_table()
if args.write is None:
    print(table)
    sys.exit(0)
path = Path(args.write)
text = path.read_text() if path.is_file() else ""
start = text.find(table.splitlines()[0])  # its header row, the same in every version
if start < 0:
    print(f"error: --write {path}: no registry table in it to replace", file=sys.stderr)
    sys.exit(1)
end = text.find("\n\n", start)
path.write_text(text[:start] + table + (text[end:] if end >= 0 else "\n"))
print(f"wrote the registry table into {path}")
