"""Multi-query associative recall: key-value pairs, then queries whose values must be recalled.

A sequence is `n_pairs` pairs k_1 v_1 .. k_P v_P with distinct keys, then as many query pairs
k v as fit, each query key drawn uniformly from the P keys and followed by its value:

    k_1 v_1 k_2 v_2 ... k_P v_P | k_a v_a k_b v_b ...  (0-padded to seq_len if one short)

Causal next-token prediction; only the values after a query key count (the loss mask), so the
metric is recall accuracy: chance is 1 / n_values, a perfect model looks each key up. The value
can be anywhere up to seq_len positions back, so this is long-range retrieval by content,
unlike the duplication task's fixed offset.

Token ids: 0 padding, keys 1 .. n_keys, values n_keys + 1 .. n_keys + n_values.
"""

from __future__ import annotations

import torch

from experiments.tasks import Batch, SeededTask, generator, register_task
from variants.checks import require_positive_int

OWNER = "task recall"
PAD = 0


def check_pairs(owner: str, n_pairs: int, n_keys: int, n_values: int) -> tuple[int, int, int]:
    """A recall task's (n_pairs, n_keys, n_values): positive, and no more pairs than keys (the
    keys of a sequence are distinct); `ValueError` naming the option otherwise."""
    for option, value in (("n_pairs", n_pairs), ("n_keys", n_keys), ("n_values", n_values)):
        require_positive_int(owner, option, value)
    if n_pairs > n_keys:
        raise ValueError(
            f"{owner}: option 'n_pairs'={n_pairs} must be at most 'n_keys'={n_keys} "
            f"(the keys of a sequence are distinct)"
        )
    return n_pairs, n_keys, n_values


@register_task
class Recall(SeededTask):
    """Multi-query associative recall, accuracy on the queried values; see the module docstring."""

    name = "recall"
    has_accuracy = True

    def __init__(
        self,
        *,
        seq_len: int,
        batch_size: int,
        seed: int,
        n_pairs: int = 16,
        n_keys: int = 128,
        n_values: int = 128,
    ):
        super().__init__(seq_len=seq_len, batch_size=batch_size, seed=seed)
        self.n_pairs, self.n_keys, self.n_values = check_pairs(OWNER, n_pairs, n_keys, n_values)
        if 2 * n_pairs + 2 > seq_len:
            raise ValueError(
                f"{OWNER}: option 'seq_len'={seq_len} must be at least 2 * 'n_pairs' + 2 = "
                f"{2 * n_pairs + 2} (the pairs and one query)"
            )
        self.n_queries = (seq_len - 2 * n_pairs) // 2
        self.vocab_size = 1 + n_keys + n_values

    def batch(self, split: str, index: int) -> Batch:
        g = generator(self.seed, split, index)
        batch, pairs, queries = self.batch_size, self.n_pairs, self.n_queries
        # Distinct keys per row: the first P of a random permutation of 1..n_keys.
        keys = torch.rand(batch, self.n_keys, generator=g).argsort(dim=-1)[:, :pairs] + 1  # (B, P)
        values = torch.randint(self.n_values, (batch, pairs), generator=g) + 1 + self.n_keys
        asked = torch.randint(pairs, (batch, queries), generator=g)  # (B, Q) pair indices
        query_keys, answers = keys.gather(1, asked), values.gather(1, asked)  # (B, Q) each

        context = torch.stack([keys, values], dim=-1).flatten(1)  # (B, 2P) k v k v ...
        questions = torch.stack([query_keys, answers], dim=-1).flatten(1)  # (B, 2Q)
        used = 2 * (pairs + queries)
        # One extra token: the target of the last position.
        padding = torch.full((batch, self.seq_len + 1 - used), PAD)  # (B, 1 or 2)
        tokens = torch.cat([context, questions, padding], dim=1)  # (B, L + 1)

        # Input position i predicts token i + 1; answers sit at 2P + 1, 2P + 3, ... so the
        # positions that predict them (the query keys) are 2P, 2P + 2, ...
        loss_mask = torch.zeros(self.seq_len, dtype=torch.bool)  # (L,)
        loss_mask[2 * pairs : used : 2] = True
        return Batch(tokens[:, :-1], tokens[:, 1:], loss_mask.expand(batch, -1).clone())
