"""A run whose engine misses a weight sync, or part of one, stops at that sync, naming the engine, the version and
the gap (assembly/sync_check.py), at every max_staleness and with a producer thread or process; one whose syncs
arrive whole trains on. The toy: the hf engine samples from a copy of the actor (asynchronous training, LoRA),
refreshed by each sync as a vLLM engine's weights are. benchmarks/sync_check.py runs the whole detection table
(30 iterations a run)."""

import json

import pytest

from horizonrl.cli import main
from horizonrl.train import phases

TOY = ["configs/toy.yaml", "rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=8", "optim.epochs=1",
       "critic.warmup_batches=1", "critic.warmup_iters=1", "model.warm_start.steps=20",
       "model.warm_start.iterations=1", "actor.lr=1e-3", "save_every=2"]
ASYNC = ["rollout.async_training.max_staleness=1", "actor.tis_cap=2.0"]
LORA = ["model.lora={r: 4, alpha: 8}"]


def broken_from(first_broken: int, kept=lambda name: False):
    """merged_parameters with only the tensors `kept` says of the `first_broken`-th sync and those after it."""
    merged, syncs = phases.merged_parameters, [0]

    def sync(actor):
        syncs[0] += 1
        return [(name, tensor) for name, tensor in merged(actor) if syncs[0] < first_broken or kept(name)]
    return sync


def records_of(folder) -> list[dict]:
    (run,) = folder.iterdir()
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("options, first_broken, kept", [
    (ASYNC, 1, lambda name: False),                                            # no weight from the first sync on
    ([*ASYNC, "rollout.async_training.producer=process"], 1, lambda name: False),
    (LORA, 3, lambda name: ".mlp." not in name),                               # the MLPs from the third sync on
], ids=["thread-K1-none", "process-K1-none", "lora-K0-no-mlp"])
def test_an_engine_that_misses_a_sync_stops_the_run_at_that_sync(options, first_broken, kept, tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.setattr(phases, "merged_parameters", broken_from(first_broken, kept))
    assert main(["train", *TOY, *options, "iterations=12", f"output_dir={tmp_path}", "--quiet"]) == 1
    error = capsys.readouterr().err
    assert (f"horizonrl: the hf engine serves other weights than the learner sent it at weights version "
            f"{first_broken}: on 4 probe rows of the first batch") in error
    assert ("--resume" in error) == (first_broken > 2)      # a checkpoint every 2 iterations (save_every=2)
    records = records_of(tmp_path)
    assert records[-1]["iteration"] == first_broken - 1          # iteration `first_broken` ended at its sync
    assert all(r["rollout/sync_probe_gap"] < 1e-5 for r in records[1:])


@pytest.mark.parametrize("options", [ASYNC, LORA], ids=["thread-K1", "lora-K0"])
def test_whole_syncs_train_on(options, tmp_path):
    assert main(["train", *TOY, *options, "iterations=6", f"output_dir={tmp_path}", "--quiet"]) == 0
    records = records_of(tmp_path)[1:]
    assert len(records) == 6
    assert max(r["rollout/sync_probe_gap"] for r in records) < 1e-5
    assert min(r["rollout/sync_probe_drift"] for r in records) > 1e-3      # each update moved the probe rows
