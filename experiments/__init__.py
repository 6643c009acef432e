"""The Hydra app: one job measures one configuration and records it."""
