"""The Hydra app: one job measures one configuration and records it.

Importing the package changes nothing in the process: the allocator setting
(experiments/measurement/allocator.py) is applied by the entry points, `experiments.run` and
`benchmarks`.
"""
