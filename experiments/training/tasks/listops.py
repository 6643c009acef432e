"""ListOps (Long Range Arena): evaluate a nested list expression, one of 10 answers per sequence.

An expression is a tree of operators (MAX, MIN, MED, SM) over digits, written in prefix form
with brackets:

    [MAX 2 9 [MIN 4 7 ] 0 ]   -> 9

Trees are drawn as in the LRA generator, reimplemented (`max_depth`, `max_args`), and redrawn
until their token count is in [min_length, seq_len]; batches are reproducible from
`generator(seed, split, index)`. Tokens: 0 padding, 1..10 the digits, 11..14 the opening
operators, 15 the closing bracket. Only the expression's last token has a target, the answer
digit; the metric is accuracy, chance 1/10, and the floor (`floor_hits`) the training split's
most frequent answer.

The draw, the tokens and the floor in full: docs/tasks.md, "ListOps".
"""

from __future__ import annotations

import random
import statistics

import torch

from experiments.training.tasks import Batch, SeededTask, generator, register_task
from variants.checks import require_positive_int

OWNER = "task listops"
PAD, DIGIT0, OPEN0, CLOSE = 0, 1, 11, 15
OPERATORS = ("MAX", "MIN", "MED", "SM")
LEAF_PROBABILITY = 0.75  # LRA's VALUE_P = 0.25 is the probability of an operator node
PRIOR_BATCHES = 8  # training batches the floor's most frequent answer is read from


def apply_operator(operator: str, args: list[int]) -> int:
    """The value of `operator` over the digit `args`."""
    if operator == "MAX":
        return max(args)
    if operator == "MIN":
        return min(args)
    if operator == "MED":
        return int(statistics.median(args))
    return sum(args) % 10


def draw_expression(rng: random.Random, depth: int, max_depth: int, max_args: int, limit: int):
    """One random tree as (tokens, value), tokens as in the module docstring; or None as soon
    as it has more than `limit` tokens (trees are heavy-tailed, and a rejected one need not be
    finished)."""
    if depth >= max_depth or rng.random() < LEAF_PROBABILITY:
        digit = rng.randrange(10)
        return [DIGIT0 + digit], digit
    operator = rng.randrange(len(OPERATORS))
    tokens, values = [OPEN0 + operator], []
    for _ in range(rng.randint(2, max_args)):
        drawn = draw_expression(rng, depth + 1, max_depth, max_args, limit - len(tokens) - 1)
        if drawn is None:
            return None
        tokens += drawn[0]
        values.append(drawn[1])
        if len(tokens) + 1 > limit:
            return None
    return tokens + [CLOSE], apply_operator(OPERATORS[operator], values)


@register_task
class ListOps(SeededTask):
    """LRA ListOps as a sequence task, accuracy on the answer; see the module docstring."""

    name = "listops"
    has_accuracy = True
    vocab_size = CLOSE + 1

    def __init__(
        self,
        *,
        seq_len: int,
        batch_size: int,
        seed: int,
        max_depth: int = 10,
        max_args: int = 10,
        min_length: int | None = None,
    ):
        super().__init__(seq_len=seq_len, batch_size=batch_size, seed=seed)
        self.max_depth = require_positive_int(OWNER, "max_depth", max_depth)
        self.max_args = require_positive_int(OWNER, "max_args", max_args)
        if max_args < 2:
            raise ValueError(f"{OWNER}: option 'max_args' must be at least 2, got {max_args}")
        self.min_length = seq_len // 4 if min_length is None else min_length
        require_positive_int(OWNER, "min_length", self.min_length)
        if self.min_length > seq_len:
            raise ValueError(
                f"{OWNER}: option 'min_length'={self.min_length} must be at most "
                f"'seq_len'={seq_len}"
            )

    def batch(self, split: str, index: int) -> Batch:
        seed = int(torch.randint(2**62, (1,), generator=generator(self.seed, split, index)))
        rng = random.Random(seed)
        shape = (self.batch_size, self.seq_len)
        inputs = torch.full(shape, PAD)  # (B, L)
        targets = torch.full(shape, PAD)  # (B, L)
        loss_mask = torch.zeros(shape, dtype=torch.bool)  # (B, L)
        for row in range(self.batch_size):
            tokens, value = self._draw(rng)
            last = len(tokens) - 1
            inputs[row, : len(tokens)] = torch.tensor(tokens)
            targets[row, last] = DIGIT0 + value
            loss_mask[row, last] = True
        return Batch(inputs, targets, loss_mask)

    chance_accuracy = 0.1  # a uniform guess among the ten digits

    def floor_hits(self, batch: Batch) -> int:
        """Hits on `batch` of the best guess blind to the expression: the answer most frequent
        in the training split's first `PRIOR_BATCHES` batches (read once; ties: the lowest)."""
        if not hasattr(self, "_majority"):
            prior = [self.batch("train", index) for index in range(PRIOR_BATCHES)]
            answers = torch.cat([b.targets[b.loss_mask] for b in prior])
            self._majority = int(torch.bincount(answers, minlength=CLOSE).argmax())
        return int((batch.targets[batch.loss_mask] == self._majority).sum())

    def distinct_queries(self, batch: Batch) -> int:
        """Every expression is its own answer: the scored positions."""
        return int(batch.loss_mask.sum())

    def _draw(self, rng: random.Random) -> tuple[list[int], int]:
        # Rejection sampling, as the LRA generator: most trees are short, so this can take
        # many draws when min_length is large.
        while True:
            drawn = draw_expression(rng, 1, self.max_depth, self.max_args, self.seq_len)
            if drawn is not None and len(drawn[0]) >= self.min_length:
                return drawn
