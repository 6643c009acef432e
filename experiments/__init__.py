"""The Hydra app: one job measures one configuration and records it."""

from experiments import allocator

allocator.enable_by_default()  # before any module of the package imports torch
