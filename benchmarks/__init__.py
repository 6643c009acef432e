"""Performance target scripts, outside the Hydra app: `python -m benchmarks.targets`."""
