"""MAD's six synthetic tasks (Poli et al. 2024, arXiv 2403.17844; `athms/mad-lab`), one task
`mad` whose `kind` option picks one of them. Written from the paper's and the repo's task
definitions; token ids are laid out as MAD lays them out, so `vocab_size` means what MAD's does.

Kinds: `in_context_recall`, `noisy_recall`, `fuzzy_recall`, `selective_copying`, `compression`
(read with the model's `pooled` readout) and `memorization`. Training draws its rows from a
fixed pool of `train_examples` sequences; evaluation and validation are fresh draws; everything
is a pure function of (seed, split, index). Defaults are MAD's baseline settings (`BASELINE`);
an option that does not belong to the kind is an error. Scoring: accuracy on the scored
positions, with chance and a key-blind floor (`floor_hits`).

Each kind's layout, the data and the scoring in full: docs/tasks.md, "MAD's six tasks".
"""

from __future__ import annotations

import hashlib
import itertools
import random
from typing import Any

import torch

from experiments.training.tasks import Batch, SeededTask, generator, register_task
from variants.checks import require_positive_int

OWNER = "task mad"
KINDS = (
    "in_context_recall",
    "fuzzy_recall",
    "noisy_recall",
    "selective_copying",
    "compression",
    "memorization",
)
# MAD's baseline setting of each kind (configs/tasks/*.yml `baseline`): the option defaults.
# seq_len, a job key, is listed for the presets; the others are this task's options.
BASELINE: dict[str, dict[str, Any]] = {
    "in_context_recall": {"seq_len": 128, "vocab_size": 16, "train_examples": 12_800},
    "fuzzy_recall": {
        "seq_len": 128,
        "vocab_size": 16,
        "train_examples": 12_800,
        "key_motif": 3,
        "value_motif": 3,
    },
    "noisy_recall": {
        "seq_len": 128,
        "vocab_size": 32,
        "train_examples": 12_800,
        "noise_vocab_size": 16,
        "frac_noise": 0.2,
    },
    "selective_copying": {
        "seq_len": 256,
        "vocab_size": 16,
        "train_examples": 12_800,
        "copy_tokens": 16,
    },
    "compression": {"seq_len": 32, "vocab_size": 16, "train_examples": 12_800},
    "memorization": {"seq_len": 32, "vocab_size": 256, "train_examples": 256},
}
# MAD's difficulty settings of each kind (configs/tasks/*.yml `changes`), each varied alone
# from the baseline; a task's MAD score averages them all. For the report's notes.
CHANGES: dict[str, dict[str, list]] = {
    "in_context_recall": {
        "vocab_size": [32, 64, 128],
        "seq_len": [256, 512, 1024],
        "train_examples": [6400, 3200, 1600, 800],
    },
    "fuzzy_recall": {
        "vocab_size": [32, 64, 128],
        "seq_len": [256, 512, 1024],
        "train_examples": [6400, 3200, 1600, 800],
    },
    "noisy_recall": {
        "vocab_size": [48, 80, 144],
        "seq_len": [256, 512, 1024],
        "train_examples": [6400, 3200, 1600, 800],
        "frac_noise": [0.4, 0.6, 0.8],
    },
    "selective_copying": {
        "vocab_size": [32, 64, 128],
        "seq_len": [512, 1024],
        "train_examples": [6400, 3200, 1600, 800],
        "copy_tokens": [32, 64, 96],
    },
    "compression": {
        "vocab_size": [32, 64, 128],
        "seq_len": [64, 128, 256],
        "train_examples": [6400, 3200, 1600, 800],
    },
    "memorization": {"vocab_size": [512, 1024, 2048, 4096, 8192]},
}
# The options each kind takes besides `vocab_size` and `train_examples`.
OWN_OPTIONS = {
    "in_context_recall": (),
    "fuzzy_recall": ("key_motif", "value_motif"),
    "noisy_recall": ("noise_vocab_size", "frac_noise"),
    "selective_copying": ("copy_tokens",),
    "compression": (),
    "memorization": (),
}
POOL_CHUNK = 128  # training sequences are built this many at a time (the pool's own unit)


def labelled_generator(seed: int, label: str) -> torch.Generator:
    """A CPU generator whose stream depends only on (seed, label): for what is not a batch of a
    split (the training pool's chunks, memorization's map). `generator`'s digests are of
    "seed/split/index"; a label names no split, so no stream is shared."""
    digest = hashlib.sha256(f"{seed}/mad:{label}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def _python_rng(g: torch.Generator) -> random.Random:
    """A `random.Random` seeded from `g` (fuzzy recall's runs are drawn in Python)."""
    return random.Random(int(torch.randint(2**62, (1,), generator=g)))


@register_task
class MAD(SeededTask):
    """One of MAD's six tasks (`kind`), accuracy on MAD's scored positions; see the module doc."""

    name = "mad"
    has_accuracy = True

    def __init__(
        self,
        *,
        seq_len: int,
        batch_size: int,
        seed: int,
        kind: str = "in_context_recall",
        vocab_size: int | None = None,
        train_examples: int | None = None,
        noise_vocab_size: int | None = None,
        frac_noise: float | None = None,
        key_motif: int | None = None,
        value_motif: int | None = None,
        copy_tokens: int | None = None,
    ):
        super().__init__(seq_len=seq_len, batch_size=batch_size, seed=seed)
        if kind not in KINDS:
            raise ValueError(
                f"{OWNER}: option 'kind' must be one of {', '.join(KINDS)}, got {kind!r}"
            )
        self.kind = kind
        given = {
            "noise_vocab_size": noise_vocab_size,
            "frac_noise": frac_noise,
            "key_motif": key_motif,
            "value_motif": value_motif,
            "copy_tokens": copy_tokens,
        }
        stray = [k for k, v in given.items() if v is not None and k not in OWN_OPTIONS[kind]]
        if stray:
            raise ValueError(
                f"{OWNER}: option {stray[0]!r} does not apply to kind={kind!r} "
                f"(its options: {', '.join(('vocab_size', 'train_examples', *OWN_OPTIONS[kind]))})"
            )
        baseline = BASELINE[kind]

        def pick(option: str, value: Any) -> Any:  # null: MAD's baseline for the kind
            return baseline[option] if value is None else value

        self.vocab_size = require_positive_int(OWNER, "vocab_size", pick("vocab_size", vocab_size))
        self.train_examples = require_positive_int(
            OWNER, "train_examples", pick("train_examples", train_examples)
        )
        for option in OWN_OPTIONS[kind]:
            setattr(self, option, pick(option, given[option]))
        self._pool: dict[int, Batch] = {}
        getattr(self, f"_check_{kind}")()
        self.readout = "pooled" if kind == "compression" else "tokens"

    # --- options, per kind -------------------------------------------------------------------

    def _need(self, condition: bool, message: str) -> None:
        if not condition:
            raise ValueError(f"{OWNER}: kind={self.kind!r}: {message}")

    def _check_recall(self, noise: int) -> None:
        self._need(self.seq_len % 2 == 0, f"option 'seq_len'={self.seq_len} must be even (pairs)")
        self._need(self.seq_len >= 4, f"option 'seq_len'={self.seq_len} must be at least 4")
        data = self.vocab_size - noise
        self._need(
            data >= 4,
            f"option 'vocab_size'={self.vocab_size} must leave at least 4 ids for keys and "
            f"values{f' besides the {noise} noise ids' if noise else ''}",
        )
        self.n_keys = data // 2
        self.first_answer, self.n_answers = self.n_keys, data - self.n_keys  # the values

    def _check_in_context_recall(self) -> None:
        self._check_recall(0)

    def _check_noisy_recall(self) -> None:
        require_positive_int(OWNER, "noise_vocab_size", self.noise_vocab_size)
        frac = self.frac_noise
        self._need(
            isinstance(frac, (int, float)) and not isinstance(frac, bool) and 0 <= frac < 1,
            f"option 'frac_noise'={frac!r} must be in [0, 1)",
        )
        self._check_recall(self.noise_vocab_size)

    def _check_fuzzy_recall(self) -> None:
        require_positive_int(OWNER, "key_motif", self.key_motif)
        require_positive_int(OWNER, "value_motif", self.value_motif)
        self.pad = self.vocab_size - 1
        self.n_keys = (self.vocab_size - 1) // 2
        self.first_answer = self.n_keys
        self.n_answers = self.vocab_size - 1 - self.n_keys
        self._need(
            self.n_keys >= self.key_motif and self.n_answers >= self.value_motif,
            f"option 'vocab_size'={self.vocab_size} must hold key_motif={self.key_motif} "
            f"distinct key ids and value_motif={self.value_motif} distinct value ids "
            "(a run's tokens are distinct)",
        )
        longest = self.key_motif + self.value_motif
        self._need(
            self.seq_len >= 4 * longest,
            f"option 'seq_len'={self.seq_len} must be at least 4 * (key_motif + value_motif) "
            f"= {4 * longest} (the probe pair twice and room for more)",
        )

    def _check_selective_copying(self) -> None:
        require_positive_int(OWNER, "copy_tokens", self.copy_tokens)
        self._need(
            self.seq_len > 2 * self.copy_tokens + 1,
            f"option 'seq_len'={self.seq_len} must be more than 2 * copy_tokens + 1 "
            f"= {2 * self.copy_tokens + 1} (the tokens, their output slots, the copy token)",
        )
        self._need(self.vocab_size >= 3, f"option 'vocab_size'={self.vocab_size} must be >= 3")
        self.copy, self.blank = self.vocab_size - 1, self.vocab_size - 2
        self.first_answer, self.n_answers = 0, self.vocab_size - 2  # the data tokens

    def _check_compression(self) -> None:
        self._need(self.seq_len >= 2, f"option 'seq_len'={self.seq_len} must be at least 2")
        self._need(self.vocab_size >= 2, f"option 'vocab_size'={self.vocab_size} must be >= 2")
        self.compress = self.vocab_size - 1
        self.first_answer, self.n_answers = 0, self.vocab_size - 1

    def _check_memorization(self) -> None:
        self._need(self.seq_len % 2 == 0, f"option 'seq_len'={self.seq_len} must be even (pairs)")
        self._need(self.vocab_size >= 3, f"option 'vocab_size'={self.vocab_size} must be >= 3")
        self.insert = self.vocab_size - 1
        self.n_keys = (self.vocab_size - 1) // 2
        self.first_answer, self.n_answers = self.n_keys, self.vocab_size - 1 - self.n_keys
        # The map, fixed by the seed: key i -> value table[i], distinct values (MAD zips a
        # permutation of the keys with one of the values).
        g = labelled_generator(self.seed, "map")
        self.table = torch.randperm(self.n_answers, generator=g)[: self.n_keys] + self.n_keys

    # --- batches -----------------------------------------------------------------------------

    def batch(self, split: str, index: int) -> Batch:
        g = generator(self.seed, split, index)
        if split != "train":
            return self._rows(g, self.batch_size, training=False)
        picks = torch.randint(self.train_examples, (self.batch_size,), generator=g)  # (B,)
        chunks = [self._pool_chunk(int(c)) for c in (picks // POOL_CHUNK).tolist()]
        rows = (picks % POOL_CHUNK).tolist()
        return Batch(
            *(
                torch.stack(
                    [getattr(chunk, part)[row] for chunk, row in zip(chunks, rows, strict=True)]
                )
                for part in ("inputs", "targets", "loss_mask")
            )
        )

    def _pool_chunk(self, chunk: int) -> Batch:
        """Training sequences chunk * POOL_CHUNK ... of the fixed training set (built once)."""
        if chunk not in self._pool:
            rows = min(POOL_CHUNK, self.train_examples - chunk * POOL_CHUNK)
            g = labelled_generator(self.seed, f"pool/{chunk}")
            self._pool[chunk] = self._rows(g, rows, training=True)
        return self._pool[chunk]

    def _rows(self, g: torch.Generator, rows: int, *, training: bool) -> Batch:
        if self.kind in ("in_context_recall", "noisy_recall"):
            return self._recall_rows(g, rows)
        if self.kind == "fuzzy_recall":
            return self._fuzzy_rows(g, rows, training)
        return getattr(self, f"_{self.kind}_rows")(g, rows)

    def _recall_rows(self, g: torch.Generator, rows: int) -> Batch:
        """Pairs (and noise pairs) as a stream of seq_len + 2 tokens whose first token is
        dropped: seq_len inputs and their next-token targets. Slot 0's key is that token, so
        slot 0 shows no key (a later pair with its key is that key's first showing)."""
        slots = self.seq_len // 2 + 1  # the last one: the final query
        n_keys, n_values = self.n_keys, self.n_answers
        keys = torch.randint(n_keys, (rows, slots), generator=g)  # (R, S)
        table = torch.randint(n_values, (rows, n_keys), generator=g) + n_keys  # (R, K)
        noisy = torch.zeros(rows, slots, dtype=torch.bool)  # (R, S)
        noise = torch.zeros(rows, slots, 2, dtype=torch.long)  # (R, S, 2)
        if self.kind == "noisy_recall" and self.frac_noise > 0:
            noisy[:, :-1] = torch.rand(rows, slots - 1, generator=g) < self.frac_noise
            kept = torch.randint(1, slots - 1, (rows,), generator=g)  # a shown pair at least
            noisy[torch.arange(rows), kept] = False
            first_noise = self.vocab_size - self.noise_vocab_size
            noise = (
                torch.randint(self.noise_vocab_size, (rows, slots, 2), generator=g) + first_noise
            )
        shown = (keys[:, :-1, None] == torch.arange(n_keys)) & ~noisy[:, :-1, None]  # (R, S-1, K)
        shown[:, 0] = False  # slot 0's key is the dropped first token: its value alone shows
        # The final query: a key shown before, uniformly among the distinct ones.
        keys[:, -1] = torch.multinomial(shown.amax(dim=1).float(), 1, generator=g)[:, 0]
        shown = torch.cat([shown, torch.zeros(rows, 1, n_keys, dtype=torch.bool)], dim=1).int()
        before = (shown.cumsum(dim=1) - shown).gather(2, keys[..., None])[..., 0] > 0  # (R, S)
        scored = before & ~noisy  # (R, S): a value after a key shown before
        pairs = torch.stack([keys, table.gather(1, keys)], dim=-1)  # (R, S, 2)
        stream = torch.where(noisy[..., None], noise, pairs).reshape(rows, 2 * slots)[:, 1:]
        # stream[t + 1] is target t; slot s's value is stream index 2s, target 2s - 1.
        loss_mask = torch.zeros(rows, self.seq_len, dtype=torch.bool)
        loss_mask[:, 1::2] = scored[:, 1:]
        return Batch(stream[:, :-1].contiguous(), stream[:, 1:].contiguous(), loss_mask)

    def _fuzzy_rows(self, g: torch.Generator, rows: int, training: bool) -> Batch:
        rng = _python_rng(g)
        drawn = [self._fuzzy_row(rng, training) for _ in range(rows)]
        tokens = torch.tensor([stream for stream, _ in drawn])  # (R, L + 1)
        scored = torch.tensor([flags for _, flags in drawn])  # (R, L + 1)
        # Token t + 1 is target t.
        return Batch(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), scored[:, 1:])

    def _runs(self, first: int, count: int, size: int) -> list[tuple[int, ...]]:
        """Every run of `size` distinct ids among first .. first + count - 1 (MAD draws a key
        or value uniformly among these), listed once per task."""
        cache = self.__dict__.setdefault("_run_lists", {})
        if (first, count, size) not in cache:
            cache[first, count, size] = list(
                itertools.permutations(range(first, first + count), size)
            )
        return cache[first, count, size]

    def _fuzzy_row(self, rng: random.Random, training: bool) -> tuple[list[int], list[bool]]:
        """One sequence of seq_len + 1 tokens and, per token, whether it is scored."""
        key_sizes = range(1, self.key_motif + 1) if training else (self.key_motif,)
        keys = {size: self._runs(0, self.n_keys, size) for size in key_sizes}
        values = {
            size: self._runs(self.n_keys, self.n_answers, size)
            for size in range(1, self.value_motif + 1)
        }
        key_sizes, value_sizes = list(keys), list(values)
        longest = self.key_motif + self.value_motif
        probe = (
            rng.choice(keys[rng.choice(key_sizes)]),
            rng.choice(values[rng.choice(value_sizes)]),
        )
        total = self.seq_len + 1  # inputs and the last target
        fill = total - len(probe[0]) - len(probe[1]) - longest  # pairs start below it
        probe_at = rng.randrange(fill - longest + 1)  # reached before the filling ends
        stream: list[int] = []
        scored: list[bool] = []
        table = {probe[0]: probe[1]}  # a key's value within the sequence
        shown: set[tuple[int, ...]] = set()
        placed = False
        while len(stream) < fill:
            if not placed and len(stream) >= probe_at:
                key, placed = probe[0], True
            else:
                key = rng.choice(keys[rng.choice(key_sizes)])
                placed |= key == probe[0]
                if key not in table:
                    table[key] = rng.choice(values[rng.choice(value_sizes)])
            stream += key + table[key]
            scored += [False] * len(key) + [key in shown] * len(table[key])
            shown.add(key)
        stream += probe[0] + probe[1]  # the final query: its key was shown (placed above)
        scored += [False] * len(probe[0]) + [True] * len(probe[1])
        pad = total - len(stream)
        return [self.pad] * pad + stream, [False] * pad + scored

    def _selective_copying_rows(self, g: torch.Generator, rows: int) -> Batch:
        n, length = self.copy_tokens, self.seq_len
        region = length - n - 1  # data and blanks before the copy token
        at = torch.rand(rows, region, generator=g).argsort(dim=1)[:, :n].sort(dim=1).values
        data = torch.randint(self.n_answers, (rows, n), generator=g)  # (R, n)
        inputs = torch.full((rows, length), self.blank)
        inputs.scatter_(1, at, data)
        inputs[:, region] = self.copy
        targets = torch.full((rows, length), self.blank)
        targets[:, region + 1 :] = data
        loss_mask = torch.zeros(rows, length, dtype=torch.bool)
        loss_mask[:, region + 1 :] = True
        return Batch(inputs, targets, loss_mask)

    def _compression_rows(self, g: torch.Generator, rows: int) -> Batch:
        data = torch.randint(self.n_answers, (rows, self.seq_len - 1), generator=g)
        inputs = torch.cat([data, torch.full((rows, 1), self.compress)], dim=1)
        loss_mask = torch.ones(rows, self.seq_len, dtype=torch.bool)
        loss_mask[:, -1] = False  # the compression token itself: constant, not scored
        return Batch(inputs, inputs.clone(), loss_mask)

    def _memorization_rows(self, g: torch.Generator, rows: int) -> Batch:
        keys = torch.randint(self.n_keys, (rows, self.seq_len // 2), generator=g)
        inputs = torch.stack([keys, torch.full_like(keys, self.insert)], dim=-1)
        targets = torch.stack([keys, self.table[keys]], dim=-1)
        loss_mask = torch.zeros(rows, self.seq_len // 2, 2, dtype=torch.bool)
        loss_mask[..., 1] = True
        return Batch(
            inputs.reshape(rows, -1), targets.reshape(rows, -1), loss_mask.reshape(rows, -1)
        )

    # --- scoring -----------------------------------------------------------------------------

    @property
    def chance_accuracy(self) -> float:
        """A uniform guess among the tokens an answer can be: 1 / (values or data tokens)."""
        return 1 / self.n_answers

    def floor_hits(self, batch: Batch) -> int:
        """Hits of the best guess blind to what is asked on `batch`'s scored positions: the most
        frequent answer token among the inputs the position sees (up to and including it; the
        whole sequence for compression, whose state sees it all), the lowest id on ties."""
        first, n = self.first_answer, self.n_answers
        is_answer = (batch.inputs >= first) & (batch.inputs < first + n)  # (B, L)
        index = (batch.inputs - first).clamp(0, n - 1)
        seen = ((index[..., None] == torch.arange(n)) & is_answer[..., None]).int()  # (B, L, n)
        if self.kind == "compression":
            counts = seen.sum(dim=1, keepdim=True).expand_as(seen)
        else:
            counts = seen.cumsum(dim=1)
        guess = counts.argmax(dim=-1) + first  # (B, L)
        return int(((guess == batch.targets) & batch.loss_mask).sum())

    def distinct_queries(self, batch: Batch) -> int:
        """The answers of `batch` that are not repeats, what an interval rests on: distinct
        (sequence, key) queries for the recall kinds (a key asked again is not a new lookup),
        each scored position for selective copying and compression, distinct keys for
        memorization (one map for every sequence: a key is one fact however often asked)."""
        mask = batch.loss_mask
        if self.kind in ("selective_copying", "compression"):
            return int(mask.sum())
        if self.kind == "memorization":
            keys = batch.inputs.roll(1, dims=1)[mask]  # the token before each insert
            return int(keys.unique().numel())
        if self.kind == "fuzzy_recall":
            return sum(
                len(self._fuzzy_queries(i, m)) for i, m in zip(batch.inputs, mask, strict=True)
            )
        rows = torch.arange(mask.shape[0])[:, None].expand_as(mask)
        asked = rows[mask] * self.vocab_size + batch.inputs[mask]
        return int(asked.unique().numel())

    def _fuzzy_queries(self, inputs: torch.Tensor, mask: torch.Tensor) -> set[tuple[int, ...]]:
        """The keys one row asks: for each run of scored positions, the key run ending at its
        first position (the position that predicts the value's first token)."""
        tokens, scored = inputs.tolist(), mask.tolist()
        keys = set()
        for t, on in enumerate(scored):
            if on and (t == 0 or not scored[t - 1]):
                start = t
                while start > 0 and tokens[start - 1] < self.n_keys:
                    start -= 1
                keys.add(tuple(tokens[start : t + 1]))
        return keys
