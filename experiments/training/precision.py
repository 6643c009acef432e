"""What `dtype` means: float32, or mixed precision with float32 master weights.

`dtype=bfloat16` or `float16` keeps every parameter and the optimiser state in float32 and runs
the forward passes (the model's and the kernels') under `torch.autocast` in that type: the
convention of Lightning's `bf16-mixed` and of every training library. Casting the whole model
to half instead makes AdamW's epsilon (1e-8) underflow to zero in float16 and the first step
divide by zero (such jobs ended `diverged` at step 1). float16 also scales the loss
(`torch.amp.GradScaler`, on CPU as on CUDA), so small gradients do not flush to zero, and its
gradients are checked every step (experiments/training/train.py); bfloat16 has float32's range and
needs no scaling. Records say which in `precision`: float32, bf16-mixed or fp16-mixed.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LABELS = {"float32": "float32", "bfloat16": "bf16-mixed", "float16": "fp16-mixed"}


@dataclass(frozen=True)
class Precision:
    """The compute precision of a job on one device."""

    name: str  # the config's dtype: float32 | bfloat16 | float16
    device: torch.device

    @classmethod
    def of(cls, name: str, device: torch.device) -> Precision:
        if name not in DTYPES:
            raise ValueError(f"option 'dtype' must be one of {', '.join(DTYPES)}; got {name!r}")
        return cls(name, device)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The type activations (and the kernels' inputs) have: float32, bfloat16 or float16."""
        return DTYPES[self.name]

    @property
    def label(self) -> str:
        """float32, bf16-mixed or fp16-mixed (the record's `precision`)."""
        return LABELS[self.name]

    def autocast(self) -> AbstractContextManager:
        """The context forward passes run in: autocast for the half types, else nothing."""
        if self.name == "float32":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """A loss scaler for float16 (any device); None where none is needed."""
        if self.name == "float16":
            return torch.amp.GradScaler(self.device.type)
        return None


FLOAT32 = Precision("float32", torch.device("cpu"))
