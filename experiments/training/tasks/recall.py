"""Multi-query associative recall: key-value pairs, then queries whose values must be recalled.

A sequence is `n_pairs` pairs k_1 v_1 .. k_P v_P with distinct keys, then as many query pairs
k v as fit, each query key drawn uniformly from the P keys and followed by its value:

    k_1 v_1 k_2 v_2 ... k_P v_P | k_a v_a k_b v_b ...  (0-padded to seq_len if one short)

Only the values after a query key count (the loss mask): the metric is recall accuracy, with
chance 1 / n_values and the key-blind floor (`floor_hits`) 1 / n_pairs when values are distinct
(`distinct_values`). Options: mixtures of pair counts (`train_pairs`) and of lengths
(`train_lengths`) in training, and Zoology's query format (`query_format=zoology`: each key
queried once, the answer never shown). Token ids: 0 padding, keys 1 .. n_keys, values
n_keys + 1 .. n_keys + n_values.

The floor, the mixtures and the query formats: docs/tasks.md, "Multi-query associative recall".
"""

from __future__ import annotations

import torch

from experiments.training.tasks import Batch, SeededTask, generator, place, register_task
from variants.checks import require_positive_int

OWNER = "task recall"
PAD = 0
QUERY_FORMATS = ("repeated", "zoology")
# Zoology's `power_a`: query slot s (0-based) is drawn with weight (s + 1)^(POWER_A - 1).
POWER_A = 0.01


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


def check_distinct(owner: str, distinct_values: bool, n_pairs: int, n_values: int) -> bool:
    """`distinct_values`, checked: with it, a sequence's n_pairs values need n_values >= n_pairs."""
    if not isinstance(distinct_values, bool):
        raise ValueError(f"{owner}: option 'distinct_values' must be true or false")
    if distinct_values and n_values < n_pairs:
        raise ValueError(
            f"{owner}: option 'n_values'={n_values} must be at least 'n_pairs'={n_pairs} "
            f"with distinct_values=true (a sequence's values are distinct)"
        )
    return distinct_values


def draw_pairs(
    g: torch.Generator, batch: int, n_pairs: int, n_keys: int, n_values: int, distinct: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of key-value pairs, (B, P) token ids each: distinct keys 1 .. n_keys per row,
    values n_keys + 1 .. n_keys + n_values, distinct per row when `distinct`."""
    # Distinct: the first P of a random permutation per row.
    keys = torch.rand(batch, n_keys, generator=g).argsort(dim=-1)[:, :n_pairs] + 1  # (B, P)
    if distinct:
        values = torch.rand(batch, n_values, generator=g).argsort(dim=-1)[:, :n_pairs]
    else:
        values = torch.randint(n_values, (batch, n_pairs), generator=g)
    return keys, values + 1 + n_keys  # (B, P) each


class RecallScoring:
    """What recall tasks share: chance and the key-blind floor on the task's own batches.

    Needs `n_keys`, `n_values` and `n_pairs`; a scored position's input is its query key and its
    target the key's value.
    """

    n_keys: int
    n_values: int
    n_pairs: int

    @property
    def chance_accuracy(self) -> float:
        """A uniform guess among the values: 1 / n_values."""
        return 1 / self.n_values

    def floor_hits(self, batch: Batch) -> int:
        """Hits of the best predictor blind to the query key on `batch`'s scored positions: the
        most frequent value among the inputs up to and including the position (ties: the
        lowest id)."""
        first = 1 + self.n_keys
        is_value = (batch.inputs >= first) & (batch.inputs < first + self.n_values)  # (B, L)
        index = (batch.inputs - first).clamp(0, self.n_values - 1)
        seen = torch.nn.functional.one_hot(index, self.n_values) * is_value[..., None]
        counts = seen.cumsum(dim=1)  # (B, L, n_values): each value's count so far
        guess = counts.argmax(dim=-1) + first  # (B, L); argmax takes the first of ties
        return int(((guess == batch.targets) & batch.loss_mask).sum())

    def distinct_queries(self, batch: Batch) -> int:
        """Distinct (sequence, queried key) pairs among `batch`'s scored positions: the answers
        that are not repeats, what an interval on the accuracy rests on."""
        rows = torch.arange(batch.inputs.shape[0])[:, None].expand_as(batch.inputs)  # (B, L)
        asked = rows[batch.loss_mask] * (self.n_keys + 1) + batch.inputs[batch.loss_mask]
        return int(asked.unique().numel())


@register_task
class Recall(RecallScoring, SeededTask):
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
        distinct_values: bool = True,
        train_pairs: list[int] | None = None,
        query_format: str = "repeated",
        train_lengths: list[int] | None = None,
    ):
        super().__init__(seq_len=seq_len, batch_size=batch_size, seed=seed)
        self.n_pairs, self.n_keys, self.n_values = check_pairs(OWNER, n_pairs, n_keys, n_values)
        self.distinct_values = check_distinct(OWNER, distinct_values, n_pairs, n_values)
        if query_format not in QUERY_FORMATS:
            raise ValueError(
                f"{OWNER}: option 'query_format' must be one of {', '.join(QUERY_FORMATS)}, "
                f"got {query_format!r}"
            )
        self.query_format = query_format
        self._check_fits("n_pairs", n_pairs)
        self.train_pairs = self._checked_mixture(train_pairs)
        self.train_lengths = self._checked_lengths(train_lengths)
        self.n_queries = (seq_len - 2 * n_pairs) // 2
        self.vocab_size = 1 + n_keys + n_values

    def _check_fits(self, option: str, n_pairs: int, length: int | None = None) -> None:
        length, named = (self.seq_len, "'seq_len'") if length is None else (length, "the length")
        if self.query_format == "zoology" and 4 * n_pairs > length:
            raise ValueError(
                f"{OWNER}: option {named}={length} must be at least 4 * '{option}' "
                f"= {4 * n_pairs} with query_format=zoology (the pairs and a query slot per key)"
            )
        if 2 * n_pairs + 2 > length:
            raise ValueError(
                f"{OWNER}: option {named}={length} must be at least 2 * '{option}' + 2 "
                f"= {2 * n_pairs + 2} (the pairs and one query)"
            )

    def _checked_mixture(self, train_pairs) -> tuple[int, ...] | None:
        """`train_pairs` as a tuple of distinct counts, each a valid n_pairs; None: no mixture."""
        if train_pairs is None:
            return None
        if isinstance(train_pairs, (str, bytes)) or not hasattr(train_pairs, "__iter__"):
            raise ValueError(f"{OWNER}: option 'train_pairs' must be a list of pair counts or null")
        counts = tuple(train_pairs)
        if not counts or len(set(counts)) != len(counts):
            raise ValueError(
                f"{OWNER}: option 'train_pairs'={list(counts)} must be a non-empty list of "
                "distinct pair counts"
            )
        for count in counts:
            try:  # each count must be a valid n_pairs
                check_pairs(OWNER, count, self.n_keys, self.n_values)
                check_distinct(OWNER, self.distinct_values, count, self.n_values)
                self._check_fits("n_pairs", count)
            except ValueError as error:
                reason = str(error).removeprefix(f"{OWNER}: ")
                raise ValueError(
                    f"{OWNER}: option 'train_pairs'={list(counts)}: each count is an n_pairs, "
                    f"and {reason}"
                ) from None
        return counts

    def _checked_lengths(self, train_lengths) -> tuple[int, ...] | None:
        """`train_lengths` as a tuple, one length per count of `train_pairs`, each at most
        `seq_len` and long enough for its count; None: every count at `seq_len`."""
        if train_lengths is None:
            return None
        if self.train_pairs is None:
            raise ValueError(
                f"{OWNER}: option 'train_lengths' needs 'train_pairs' (a length per count)"
            )
        if isinstance(train_lengths, (str, bytes)) or not hasattr(train_lengths, "__iter__"):
            raise ValueError(f"{OWNER}: option 'train_lengths' must be a list of lengths or null")
        lengths = tuple(train_lengths)
        if len(lengths) != len(self.train_pairs):
            raise ValueError(
                f"{OWNER}: option 'train_lengths'={list(lengths)} must have one length per count "
                f"of 'train_pairs'={list(self.train_pairs)}"
            )
        for count, length in zip(self.train_pairs, lengths, strict=True):
            require_positive_int(OWNER, "train_lengths", length)
            if length > self.seq_len:
                raise ValueError(
                    f"{OWNER}: option 'train_lengths'={list(lengths)}: each length must be at most "
                    f"'seq_len'={self.seq_len}"
                )
            try:
                self._check_fits("n_pairs", count, length)
            except ValueError as error:
                reason = str(error).removeprefix(f"{OWNER}: option ")
                raise ValueError(
                    f"{OWNER}: option 'train_lengths'={list(lengths)}: at {count} pairs, {reason}"
                ) from None
        return lengths

    def at_pairs(self, n_pairs: int) -> Recall:
        """The same task (mixture included) evaluated at `n_pairs`."""
        return Recall(
            seq_len=self.seq_len,
            batch_size=self.batch_size,
            seed=self.seed,
            n_pairs=n_pairs,
            n_keys=self.n_keys,
            n_values=self.n_values,
            distinct_values=self.distinct_values,
            train_pairs=None if self.train_pairs is None else list(self.train_pairs),
            query_format=self.query_format,
            train_lengths=None if self.train_lengths is None else list(self.train_lengths),
        )

    def batch(self, split: str, index: int) -> Batch:
        g = generator(self.seed, split, index)
        if split != "train" or self.train_pairs is None:  # evaluated at n_pairs
            return self._rows(g, self.batch_size, self.n_pairs, self.seq_len)
        if self.train_lengths is not None:  # one count, at its own length, for the whole batch
            which = int(torch.randint(len(self.train_pairs), (), generator=g))
            pairs, length = self.train_pairs[which], self.train_lengths[which]
            return self._rows(g, self.batch_size, pairs, length)
        # A mixture: each sequence's count drawn from train_pairs, rows of one count built
        # together (in the list's order, so the batch depends only on the generator).
        which = torch.randint(len(self.train_pairs), (self.batch_size,), generator=g)  # (B,)
        shape = (self.batch_size, self.seq_len)
        inputs, targets = (torch.empty(shape, dtype=torch.long) for _ in range(2))  # (B, L)
        loss_mask = torch.empty(shape, dtype=torch.bool)  # (B, L)
        for i, count in enumerate(self.train_pairs):
            rows = (which == i).nonzero().flatten()
            if len(rows):
                part = self._rows(g, len(rows), count, self.seq_len)
                inputs[rows], targets[rows], loss_mask[rows] = (
                    part.inputs,
                    part.targets,
                    part.loss_mask,
                )
        return Batch(inputs, targets, loss_mask)

    def _rows(self, g: torch.Generator, batch: int, pairs: int, length: int) -> Batch:
        """`batch` sequences of `pairs` pairs and `length` tokens in the task's query format."""
        if self.query_format == "zoology":
            return self._zoology_rows(g, batch, pairs, length)
        queries = (length - 2 * pairs) // 2
        keys, values = draw_pairs(
            g, batch, pairs, self.n_keys, self.n_values, self.distinct_values
        )  # (B, P) each
        asked = torch.randint(pairs, (batch, queries), generator=g)  # (B, Q) pair indices
        query_keys, answers = keys.gather(1, asked), values.gather(1, asked)  # (B, Q) each

        # k v k v ... then the queries' k v, padded; one extra token: the last position's target.
        # Input position i predicts token i + 1, so the positions that predict the answers (at
        # 2P + 1, 2P + 3, ...) are the query keys' (2P, 2P + 2, ...): those are scored.
        pair_at = 2 * torch.arange(pairs)  # (P,) each pair's key; its value follows
        query_at = 2 * (pairs + torch.arange(queries))  # (Q,) each query's key; its answer next
        tokens = place(
            length + 1,
            batch,
            (pair_at, keys),
            (pair_at + 1, values),
            (query_at, query_keys),
            (query_at + 1, answers),
            fill=PAD,
        )  # (B, L + 1)
        loss_mask = place(length, batch, (query_at, True), fill=False)  # (B, L)
        return Batch(tokens[:, :-1], tokens[:, 1:], loss_mask)

    def _zoology_rows(self, g: torch.Generator, batch: int, pairs: int, length: int) -> Batch:
        """Each key queried once at power-law slots, its answer only in the targets."""
        keys, values = draw_pairs(
            g, batch, pairs, self.n_keys, self.n_values, self.distinct_values
        )  # (B, P) each
        slots = (length - 2 * pairs) // 2  # query slots after the pairs
        weights = torch.arange(1, slots + 1, dtype=torch.float64) ** (POWER_A - 1)  # (S,)
        chosen = torch.multinomial(weights.expand(batch, slots), pairs, generator=g)  # (B, P)
        query_at = 2 * pairs + 2 * chosen  # (B, P) key i's query position, in key order
        pair_at = 2 * torch.arange(pairs)  # (P,)
        inputs = place(
            length, batch, (pair_at, keys), (pair_at + 1, values), (query_at, keys), fill=PAD
        )  # (B, L): the answers are not in the input
        targets = place(length, batch, (query_at, values), fill=PAD)  # (B, L)
        loss_mask = place(length, batch, (query_at, True), fill=False)  # (B, L)
        return Batch(inputs, targets, loss_mask)
