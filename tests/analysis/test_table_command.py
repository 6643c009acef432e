"""A section's command (`python -m analysis.<section> PATH...`) on a path with no results."""

from __future__ import annotations

import pytest

from analysis import capacity


def test_a_path_without_results_is_one_line_naming_it(tmp_path, capsys):
    missing = tmp_path / "nothing"
    with pytest.raises(SystemExit) as exit_:
        capacity.main([str(missing)])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("python -m analysis.capacity: error:") and str(missing) in error
