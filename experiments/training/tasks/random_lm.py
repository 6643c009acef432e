"""Uniformly random tokens: a task whose only purpose is to cost what a real LM step costs."""

from __future__ import annotations

import torch

from experiments.training.tasks import Batch, SeededTask, generator, register_task
from variants.checks import require_positive_int


@register_task
class RandomLM(SeededTask):
    """Next-token prediction on uniform random tokens; the best loss is ln(vocab_size)."""

    name = "random_lm"

    def __init__(self, *, seq_len: int, batch_size: int, seed: int, vocab_size: int = 256):
        super().__init__(seq_len=seq_len, batch_size=batch_size, seed=seed)
        self.vocab_size = require_positive_int(self.owner, "vocab_size", vocab_size)

    def batch(self, split: str, index: int) -> Batch:
        g = generator(self.seed, split, index)
        tokens = torch.randint(
            self.vocab_size, (self.batch_size, self.seq_len + 1), generator=g
        )  # (B, L + 1)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (B, L) each
        return Batch(inputs, targets, torch.ones_like(targets, dtype=torch.bool))
