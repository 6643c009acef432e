"""`python -m variants` prints the registry table that README.md embeds."""

from variants.registry import registry_table

print(registry_table())
