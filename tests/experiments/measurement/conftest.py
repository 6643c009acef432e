"""What the measurement tests share: a small corpus and a reference config trained on it in
seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.measurement import measure
from experiments.measurement.reference_model import ReferenceConfig


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A small text file: the project's own sources, so training on it takes seconds."""
    sources = sorted(Path(measure.__file__).parents[1].glob("**/*.py"))  # experiments/
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"".join(p.read_bytes() for p in sources))
    return path


def reference_config(corpus: Path, **options) -> ReferenceConfig:
    tiny = {
        "depth": 2,
        "seq_len": 32,
        "batch_size": 4,
        "steps": 40,
        "long_seq_len": 128,
        "long_steps": 4,
        "lr": 3e-3,
        "fit_steps": 60,
    }
    return ReferenceConfig(d_model=32, n_heads=2, text_path=str(corpus), **{**tiny, **options})
