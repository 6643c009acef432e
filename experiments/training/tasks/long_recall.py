"""Long-range multi-query associative recall: the lookup distance grows with the length.

A sequence of seq_len tokens has two halves. The first half holds `n_pairs` key-value pairs
k v at random, distinct, pair-aligned slots, padding elsewhere. The second half holds only query
keys, each drawn uniformly from the sequence's keys, and every query position is scored on the
value of its key, which never appears in the input (the same task for causal and bidirectional
models). A query's distance to its value is triangular on (0, seq_len), mean seq_len / 2.
Values are distinct unless `distinct_values=false`; chance is 1 / n_values and the key-blind
floor 1 / n_pairs. Token ids: 0 padding, keys 1 .. n_keys, values n_keys + 1 .. n_keys +
n_values. Batches are a pure function of (seed, split, index).

The layout and the distance's derivation: docs/tasks.md, "Long-range recall".
"""

from __future__ import annotations

import torch

from experiments.training.tasks import Batch, SeededTask, generator, place, register_task
from experiments.training.tasks.recall import RecallScoring, check_distinct, check_pairs, draw_pairs

OWNER = "task long_recall"
PAD = 0


@register_task
class LongRecall(RecallScoring, SeededTask):
    """Key-value pairs in the first half, query keys in the second; accuracy on the values."""

    name = "long_recall"
    has_accuracy = True

    def __init__(
        self,
        *,
        seq_len: int,
        batch_size: int,
        seed: int,
        n_pairs: int = 16,
        n_keys: int = 64,
        n_values: int = 64,
        distinct_values: bool = True,
    ):
        super().__init__(seq_len=seq_len, batch_size=batch_size, seed=seed)
        self.n_pairs, self.n_keys, self.n_values = check_pairs(OWNER, n_pairs, n_keys, n_values)
        self.distinct_values = check_distinct(OWNER, distinct_values, n_pairs, n_values)
        if n_pairs > self.pair_slots:
            raise ValueError(
                f"{OWNER}: option 'seq_len'={seq_len} holds {self.pair_slots} pairs in its first "
                f"half; it must be at least 4 * 'n_pairs' = {4 * n_pairs}"
            )
        self.vocab_size = 1 + n_keys + n_values

    @property
    def first_query(self) -> int:
        """Position of the first query key: the start of the second half."""
        return self.seq_len // 2

    @property
    def pair_slots(self) -> int:
        """Pair-aligned slots (2s, 2s + 1) that fit in the first half."""
        return self.first_query // 2

    def batch(self, split: str, index: int) -> Batch:
        g = generator(self.seed, split, index)
        batch, pairs, start = self.batch_size, self.n_pairs, self.first_query
        n_queries = self.seq_len - start
        keys, values = draw_pairs(
            g, batch, pairs, self.n_keys, self.n_values, self.distinct_values
        )  # (B, P) each
        slots = torch.rand(batch, self.pair_slots, generator=g).argsort(dim=-1)[:, :pairs]
        asked = torch.randint(pairs, (batch, n_queries), generator=g)  # (B, Q) pair indices

        query_at = start + torch.arange(n_queries)  # (Q,) the second half
        inputs = place(
            self.seq_len,
            batch,
            (2 * slots, keys),
            (2 * slots + 1, values),
            (query_at, keys.gather(1, asked)),  # (B, Q) query keys
            fill=PAD,
        )  # (B, L)
        # The queries' values, hidden from the inputs, are the targets, and only they are scored.
        targets = place(self.seq_len, batch, (query_at, values.gather(1, asked)), fill=PAD)
        loss_mask = place(self.seq_len, batch, (query_at, True), fill=False)  # (B, L)
        return Batch(inputs, targets, loss_mask)
