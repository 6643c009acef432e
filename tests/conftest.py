"""Shared test setup."""

import torch

# Correctness tests use tiny tensors: one thread avoids oversubscribing the 2-core CI machine
# (and a 10x slowdown when another process is busy). Subprocess sweeps set their own threads.
torch.set_num_threads(1)
