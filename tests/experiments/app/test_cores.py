"""Free cores from /proc/stat, and the timing sweep's one job per free core on one thread."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from experiments.app import cores, resolvers
from tests.experiments.conftest import CONF

STAT = "cpu  {user} 0 {system} {idle} {iowait} 0 0 0 0 0\ncpu0 1 0 1 1 0 0 0 0 0 0\nintr 12345\n"


def _readings(*pairs):
    """A `read` that returns the given (idle, total) pairs in turn."""
    it = iter(pairs)
    return lambda: next(it)


def test_cpu_times_counts_idle_and_iowait_out_of_the_eight_first_fields(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT.format(user=100, system=50, idle=800, iowait=50))
    assert cores.cpu_times(str(stat)) == (850, 1000)


def test_cpu_times_is_none_without_a_readable_cpu_line(tmp_path):
    assert cores.cpu_times(str(tmp_path / "missing")) is None
    (tmp_path / "odd").write_text("intr 1\n")
    assert cores.cpu_times(str(tmp_path / "odd")) is None


@pytest.mark.parametrize(
    "idle_delta, total_delta, n_cpus, usable, expected",
    [
        (200, 200, 2, 2, 2),  # quiet: both free
        (100, 200, 2, 2, 1),  # one core busy
        (10, 200, 2, 2, 1),  # both busy: still one job
        (390, 400, 4, 2, 2),  # four idle cores, two usable (affinity)
        (290, 400, 4, 4, 3),  # 2.9 idle cores round to 3
    ],
)
def test_free_cores_rounds_the_idle_share_of_every_cpu(
    monkeypatch, idle_delta, total_delta, n_cpus, usable, expected
):
    monkeypatch.setattr(cores.os, "cpu_count", lambda: n_cpus)
    read = _readings((1000, 5000), (1000 + idle_delta, 5000 + total_delta))
    assert cores.free_cores(0, read=read, cores=usable) == expected


def test_free_cores_without_proc_stat_counts_every_usable_core():
    assert cores.free_cores(0, read=lambda: None, cores=3) == 3


def test_timing_workers_measures_once_and_hands_the_figure_on(monkeypatch):
    monkeypatch.delenv(cores.ENV, raising=False)
    calls = []
    monkeypatch.setattr(cores, "free_cores", lambda: calls.append(1) or 2)
    assert cores.timing_workers("cpu") == 2
    assert cores.timing_workers("cpu") == 2  # a worker process sees the launcher's figure
    assert len(calls) == 1
    assert cores.os.environ[cores.ENV] == "2"


def test_timing_workers_on_cuda_is_one_job_at_a_time(monkeypatch):
    monkeypatch.setenv(cores.ENV, "2")
    assert cores.timing_workers("cuda") == 1


def test_scaling_preset_times_on_one_thread_with_a_job_per_free_core(monkeypatch):
    monkeypatch.setenv(cores.ENV, "2")
    resolvers.register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=["+experiment=scaling", "device=cpu"],
            return_hydra_config=True,
        )
    GlobalHydra.instance().clear()
    assert cfg.threads == 1
    assert "joblib" in cfg.hydra.launcher._target_
    assert OmegaConf.select(cfg, "hydra.launcher.n_jobs") == 2
