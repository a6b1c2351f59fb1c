"""Metrics sinks: TensorBoard and W&B get the jsonl record's numbers, same keys, the iteration as the step."""

import importlib.util
import json
import math
import os
import struct
from pathlib import Path

import pytest

from horizonrl.config import SINKS, ConfigError
from horizonrl.report.metrics import read_metrics
from horizonrl.report.sinks import MetricsSinks, check_sinks
from tensorboard_events import numbers, tensorboard_scalars


def record(iteration: int, shift: float = 0.0) -> dict:
    return {"iteration": iteration, "phase": "critic_warmup" if iteration == 0 else "ppo",
            "env/success_rate": iteration / 3 + shift, "env/turns": 7 * iteration + 3,
            "env/episode_return": float("nan") if iteration == 1 else 1234.5678 * iteration + shift,
            "train/actor/clipped": iteration % 2 == 0, "env/invalid_output_examples": ["go north", "x"],
            "timing/rollout_s": 1e-3 * (iteration + 1) + shift}


def test_tensorboard_gets_the_numbers_of_the_jsonl_records(tmp_path):
    pytest.importorskip("tensorboard")
    with MetricsSinks(tmp_path, ["jsonl", "tensorboard"], config={}) as sinks:
        for iteration in range(4):
            sinks.write(record(iteration))
    sinks.close()                                    # a second close does nothing
    expected = numbers(read_metrics(tmp_path / "metrics.jsonl"))
    assert "env/episode_return" in expected and 1 not in expected["env/episode_return"]   # NaN: null
    scalars = tensorboard_scalars(tmp_path)
    assert set(scalars) == set(expected)             # no "phase", no lists, no "iteration"
    for key, values in expected.items():
        assert [step for step, _ in scalars[key]] == sorted(values)
        assert [value for _, value in scalars[key]] == [pytest.approx(values[s], rel=1e-6) for s in sorted(values)]


def test_a_resumed_run_replaces_the_iterations_it_writes_again(tmp_path):
    pytest.importorskip("tensorboard")
    with MetricsSinks(tmp_path, ["tensorboard"], config={}) as sinks:
        for iteration in range(4):
            sinks.write(record(iteration))
    with MetricsSinks(tmp_path, ["tensorboard"], config={}, first_iteration=2) as sinks:
        for iteration in (2, 3):
            sinks.write(record(iteration, shift=100.0))
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    expected = numbers([record(0), record(1), record(2, shift=100.0), record(3, shift=100.0)])
    scalars = tensorboard_scalars(tmp_path)
    assert set(scalars) == set(expected)
    for key, values in expected.items():
        assert [step for step, _ in scalars[key]] == sorted(values)      # one value per step
        assert [value for _, value in scalars[key]] == [pytest.approx(values[s], rel=1e-6) for s in sorted(values)]


def wandb_children() -> list[int]:
    """Processes started by this one whose name says wandb (its wandb-core service)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, rest = stat.read_text().rsplit(")", 1)
        except OSError:
            continue
        if int(rest.split()[1]) == os.getpid() and "wandb" in name:
            pids.append(int(stat.parent.name))
    return pids


def wandb_records(path: Path):
    """The protobuf records of an offline run's .wandb file: a 7-byte header, then (crc32, length, type)
    + data chunks, leveldb log format; a file under one 32 KiB block holds each record in one chunk."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B" and len(data) < 32768
    pos = 7
    while pos + 7 <= len(data):
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        assert kind == 1                             # a full record
        yield wandb_internal_pb2.Record.FromString(data[pos + 7:pos + 7 + length])
        pos += 7 + length


@pytest.fixture
def offline_wandb(monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    yield wandb
    wandb.teardown()                                 # stops the wandb-core service
    assert not wandb_children()


def test_wandb_offline_run_in_the_run_folder(tmp_path, offline_wandb):
    run_dir = tmp_path / "babyai-20250101-000000"
    run_dir.mkdir()
    with MetricsSinks(run_dir, ["wandb"], config={"seed": 7}) as sinks:
        for iteration in range(3):
            sinks.write(record(iteration))
    offline_wandb.teardown()     # finish() can return before wandb-core writes the .wandb file; this waits
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    records = list(wandb_records(run_file))
    (run,) = [r.run for r in records if r.HasField("run")]
    run_id = (run_dir / "wandb_id").read_text()
    assert (run.display_name, run.project, run.run_id) == (run_dir.name, "horizonrl", run_id)
    assert {u.key: u.value_json for u in run.config.update}["seed"] == "7"
    logged: dict[str, dict[int, float]] = {}
    for h in (r.history for r in records if r.HasField("history")):
        items = {"/".join(i.nested_key): float(json.loads(i.value_json)) for i in h.item}
        for key, value in items.items():
            if not key.startswith("_"):              # wandb's own _step, _runtime, _timestamp
                logged.setdefault(key, {})[int(items["_step"])] = value
    expected = numbers(read_metrics(run_dir / "metrics.jsonl"))
    assert logged.keys() == expected.keys()
    for key, values in expected.items():
        assert logged[key] == pytest.approx(values)


def test_wandb_resume_continues_the_same_run(tmp_path, offline_wandb):
    MetricsSinks(tmp_path, ["wandb"], config={}).close()
    run_id = (tmp_path / "wandb_id").read_text()
    MetricsSinks(tmp_path, ["wandb"], config={}, first_iteration=2).close()
    assert [p.name for p in tmp_path.glob("wandb/offline-run-*/run-*.wandb")] == [f"run-{run_id}.wandb"] * 2


@pytest.fixture
def hide(monkeypatch):
    """hide(*names): importlib.util.find_spec finds none of these packages."""
    find_spec = importlib.util.find_spec

    def hide(*names):
        monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in names else find_spec(n, *a))
    return hide


@pytest.mark.parametrize("sink", ["tensorboard", "wandb"])
def test_check_sinks_says_what_to_install(sink, hide):
    hide(sink)
    with pytest.raises(ConfigError) as error:
        check_sinks(["jsonl", "tensorboard", "wandb"])
    assert str(error.value) == f'report_to: {sink} needs the {sink} package: pip install "horizonrl[{sink}]"'


def test_check_sinks(hide):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    check_sinks(list(SINKS))
    check_sinks([])
    hide("tensorboard", "wandb")
    check_sinks(["jsonl"])


def test_nan_and_infinity_are_no_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    with MetricsSinks(tmp_path, ["tensorboard"], config={}) as sinks:
        sinks.write({"iteration": 0, "a": math.inf, "b": math.nan, "c": None, "d": 1})
    assert tensorboard_scalars(tmp_path) == {"d": [(0, 1.0)]}
