"""torch's CPU thread count (issue 39, defect 8): torch's default of every core collapses beside a busy process
(OpenMP threads spin-wait on a thread that lost its core), so `auto` leaves one core to other work and divides
the rest among the run's processes that compute at once (learner/device.py)."""

import logging

import pytest
import torch

from horizonrl import cli
from horizonrl.config import ConfigError, SOURCE_CONFIGS, load_config
from horizonrl.learner import device
from horizonrl.learner.device import choose_threads, use_run_threads, use_threads

TOY = SOURCE_CONFIGS / "toy.yaml"


@pytest.fixture(autouse=True)
def keep_threads(monkeypatch):
    """Each test starts with no thread variable set and gets back the thread count it found."""
    for name in ("HORIZONRL_THREADS", "OMP_NUM_THREADS", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("setting,device_type,sharers,cores,omp,expected", [
    ("auto", "cpu", 1, 2, None, 1),       # 2 cores: one left to other work, whatever the run
    ("auto", "cpu", 2, 2, None, 1),       # the gateway beside its agents on 2 cores (the case)
    ("auto", "cpu", 1, 16, None, 15),     # alone on 16 cores: all but one
    ("auto", "cpu", 2, 16, None, 7),
    ("auto", "cpu", 4, 16, None, 3),      # 2 ranks, each with a producer
    ("auto", "cpu", 3, 2, None, 1),       # more processes than cores: still 1 each
    ("auto", "cpu", 1, 1, None, 1),
    ("auto", "cpu", 2, 16, "3", None),    # OMP_NUM_THREADS: torch already follows it
    ("auto", "cuda", 2, 16, None, None),  # a GPU: torch's own count, as before
    (3, "cpu", 2, 2, None, 3),            # a count is a count, wherever it runs
    (3, "cuda", 1, 16, "1", 3),
])
def test_the_thread_count_each_setting_chooses(setting, device_type, sharers, cores, omp, expected):
    assert choose_threads(setting, device_type, sharers, cores, omp)[0] == expected


def test_usable_cores_are_at_most_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(device, "TORCH_THREADS", 64)
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert device.usable_cores() == 3
    monkeypatch.setattr(device, "TORCH_THREADS", 2)
    assert device.usable_cores() == 2


def test_use_threads_sets_torch_and_logs_once(monkeypatch, caplog):
    monkeypatch.setattr(device, "usable_cores", lambda: 5)
    with caplog.at_level(logging.INFO, logger="horizonrl.learner.device"):
        assert use_threads("auto", "cpu", 2, "the gateway and the agents that call it") == 2
    assert torch.get_num_threads() == 2
    (record,) = caplog.records
    assert record.getMessage() == ("torch threads: 2 (auto: 5 cores, one left to other work, the rest shared by 2 "
                                   "processes, the gateway and the agents that call it; threads=N, --threads N or "
                                   "HORIZONRL_THREADS=N sets it)")


def test_horizonrl_threads_overrides_the_setting(monkeypatch):
    monkeypatch.setattr(device, "usable_cores", lambda: 4)
    monkeypatch.setenv("HORIZONRL_THREADS", "3")
    assert use_threads("auto", "cpu", 2) == 3
    assert use_threads(1, "cuda") == 3
    monkeypatch.setenv("HORIZONRL_THREADS", "many")
    with pytest.raises(ConfigError, match="HORIZONRL_THREADS: must be auto or a number of threads > 0, got 'many'"):
        use_threads("auto", "cpu")


def test_a_gpu_keeps_torchs_count(monkeypatch):
    torch.set_num_threads(3)
    assert use_threads("auto", "cuda", 2) == 3


@pytest.mark.parametrize("overrides,local_ranks,command,expected", [
    ([], 1, "train", 4),                                                              # one process: 5 - 1
    (["rollout.async_training.max_staleness=1", "actor.tis_cap=2"], 1, "train", 2),   # learner + producer
    (["rollout.async_training.max_staleness=1", "actor.tis_cap=2",
      "rollout.async_training.producer=process"], 1, "train", 2),
    (["rollout.async_training.max_staleness=1", "actor.tis_cap=2"], 2, "train", 1),   # 2 ranks x 2
    ([], 2, "train", 2),
    (["rollout.async_training.max_staleness=1", "actor.tis_cap=2"], 1, "sft", 4),     # sft samples nothing
    (["threads=3"], 2, "train", 3),
])
def test_a_runs_processes_share_the_cores(monkeypatch, overrides, local_ranks, command, expected):
    monkeypatch.setattr(device, "usable_cores", lambda: 5)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
    cfg = load_config(TOY, ["device=cpu", *overrides])
    assert use_run_threads(cfg, command) == expected == torch.get_num_threads()


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "some", "true"])
def test_a_bad_threads_key_names_it(value):
    with pytest.raises(ConfigError, match=r"^threads: must be auto or a number of threads > 0, got"):
        load_config(TOY, [f"threads={value}"])


def test_the_threads_key_defaults_to_auto_and_takes_a_count():
    assert load_config(TOY).threads == "auto"
    assert load_config(TOY, ["threads=2"]).threads == 2


@pytest.mark.parametrize("command", [["gateway", "builtin:babyai-tiny"], ["eval", "builtin:babyai-tiny"]])
def test_a_bad_threads_option_is_refused_where_it_is_parsed(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([*command, "--threads", "0"])
    assert exit_.value.code == 2
    assert "argument --threads: must be auto or a number of threads > 0, got 0" in capsys.readouterr().err
