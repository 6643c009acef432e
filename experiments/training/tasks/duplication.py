"""The Reformer's duplication task: sequences 0 w 0 w, where the second copy of w is predicted.

w is a string of n = seq_len / 2 - 1 symbols drawn uniformly from 1..n_symbols (the paper:
n_symbols = 127, seq_len = 1024); 0 separates the copies. The first copy is random and cannot be
predicted, so the loss and the accuracy count only the second copy: a model that solves the task
has learned to attend n + 1 positions back. Accuracy is the fraction of second-copy symbols
whose argmax prediction is right (chance is 1 / n_symbols).

Two forms:
- `masked=False` (default, the paper's): causal language modelling. Input position i predicts
  token i + 1; the targets of positions n + 1 .. 2n (the second 0 and w_1 .. w_{n-1} as inputs)
  are the second copy w_1 .. w_n. The last position has no next token and does not count.
- `masked=True`: the second copy is hidden behind a mask token (id n_symbols + 1) and every
  position predicts its own token, so bidirectional attention (Linformer) can be trained on it
  without seeing the answers. Only the masked positions count.
"""

from __future__ import annotations

import torch

from experiments.training.tasks import Batch, SeededTask, generator, place, register_task
from variants.checks import require_positive_int

OWNER = "task duplication"
SEPARATOR = 0


@register_task
class Duplication(SeededTask):
    """0 w 0 w with the loss and accuracy on the second copy of w; see the module docstring."""

    name = "duplication"
    has_accuracy = True

    def __init__(
        self,
        *,
        seq_len: int,
        batch_size: int,
        seed: int,
        n_symbols: int = 127,
        masked: bool = False,
    ):
        super().__init__(seq_len=seq_len, batch_size=batch_size, seed=seed)
        if seq_len < 4 or seq_len % 2:
            raise ValueError(
                f"{OWNER}: option 'seq_len' must be even and at least 4 (0 w 0 w), got {seq_len}"
            )
        self.n_symbols = require_positive_int(OWNER, "n_symbols", n_symbols)
        if not isinstance(masked, bool):
            raise ValueError(f"{OWNER}: option 'masked' must be true or false, got {masked!r}")
        self.masked = masked
        self.copy_len = seq_len // 2 - 1  # n, the length of w
        # ids: 0 separator, 1..n_symbols symbols, n_symbols + 1 the mask token (masked form only)
        self.vocab_size = n_symbols + 1 + int(masked)

    def batch(self, split: str, index: int) -> Batch:
        g = generator(self.seed, split, index)
        batch, n = self.batch_size, self.copy_len
        words = torch.randint(1, self.n_symbols + 1, (batch, n), generator=g)  # (B, n)
        first, second = 1 + torch.arange(n), n + 2 + torch.arange(n)  # (n,) w's two copies
        # 0 w 0 w: (B, L), L = 2n + 2
        tokens = place(self.seq_len, batch, (first, words), (second, words), fill=SEPARATOR)
        if self.masked:
            hidden = (second, self.n_symbols + 1)  # the second copy behind the mask token
            inputs = place(self.seq_len, batch, (first, words), hidden, fill=SEPARATOR)  # (B, L)
            return Batch(inputs, tokens, place(self.seq_len, batch, (second, True), fill=False))
        # Next-token targets: position i predicts token i + 1; the last target is a placeholder.
        targets = torch.cat([tokens[:, 1:], torch.full((batch, 1), SEPARATOR)], dim=1)  # (B, L)
        # The inputs whose next token is in the second copy: n + 1 .. 2n.
        loss_mask = place(self.seq_len, batch, (second - 1, True), fill=False)  # (B, L)
        return Batch(tokens, targets, loss_mask)
