"""Performance target scripts, outside the Hydra app: `python -m benchmarks.targets`."""

from experiments.measurement import allocator

allocator.enable_by_default()  # before benchmarks.targets imports torch
