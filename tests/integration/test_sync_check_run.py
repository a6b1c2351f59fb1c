"""A run whose engine misses part of a weight sync stops, naming the engine and the gap (train/sync_check.py);
one whose syncs arrive whole trains on. The toy with LoRA: the hf engine samples from a merged copy of the actor,
refreshed by each sync, as a vLLM engine's weights are."""

import json

import pytest

from horizonrl.cli import main
from horizonrl.train import loop

LORA_TOY = ["configs/toy.yaml", "rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=8", "optim.epochs=1",
            "critic.warmup_batches=1", "critic.warmup_iters=1", "model.warm_start.steps=20",
            "model.warm_start.iterations=1", "actor.lr=1e-3", "model.lora={r: 4, alpha: 8}"]


def test_an_engine_that_misses_part_of_a_sync_stops_the_run_naming_it(tmp_path, monkeypatch, capsys):
    """From the third sync on, the engine's copy gets no MLP weight (as a name it does not know, or an adapter that
    never reaches it): iterations 1-3 sample with whole syncs (float rounding, ~1e-7 per token), then the MLPs the
    learner trains drift from the engine's."""
    merged, syncs = loop.merged_parameters, [0]

    def partial(actor):
        syncs[0] += 1
        return [(name, tensor) for name, tensor in merged(actor) if syncs[0] < 3 or ".mlp." not in name]

    monkeypatch.setattr(loop, "merged_parameters", partial)
    assert main(["train", *LORA_TOY, "iterations=30", "save_every=2", f"output_dir={tmp_path}", "--quiet"]) == 1
    error = capsys.readouterr().err
    assert "horizonrl: the hf engine sampled iteration" in error and "from other weights than the learner's" in error
    assert "against at most" in error and "in iterations 1-3" in error and "--resume" in error
    (run,) = tmp_path.iterdir()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last["rollout/logprob_abs_diff_current"] > 0.05 and last["iteration"] < 30
    assert max(r["rollout/logprob_abs_diff_current"] for r in records[1:4]) < 1e-4


def test_whole_syncs_train_on(tmp_path):
    assert main(["train", *LORA_TOY, "iterations=6", f"output_dir={tmp_path}", "--quiet"]) == 0
    (run,) = tmp_path.iterdir()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["rollout/current_weights_frac"] == 1.0 for r in records[1:])
    assert max(r["rollout/logprob_abs_diff_current"] for r in records[1:]) < 1e-4
