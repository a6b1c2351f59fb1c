"""Runs whose iterations skip the scoring passes no term reads (train/phases.needed_scores) still log the
statistics of the learner's old log-probs, now measured in the update, and still write their report.

grpo, one optimizer step per iteration, no KL: no reference pass and no old-log-prob pass; the update's
own forward is the old policy, so the engine (sampling from the actor's own weights) and it agree.
ppo with kl_coef 0 and kl_loss_coef 0: no reference pass; there is no KL to the reference to report.
"""

import pytest

from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.report.metrics import read_metrics
from horizonrl.train.loop import train

SMALL = ["iterations=2", "rollout.n_env=4", "ppo.e_len=4", "critic.warmup_batches=1", "critic.warmup_iters=1",
         "model.warm_start.steps=20", "model.warm_start.iterations=1", "optim.micro_batch_size=8", "actor.tis_cap=2.0",
         "env.kwargs={stones: 2, max_steps: 8}"]
RUNS = {"grpo": ["algorithm=grpo", "group.n_tasks=2", "group.group_size=2", "group.max_turns=4", "optim.epochs=1",
                 "optim.mini_batch_size=64"],
        "ppo": ["ppo.kl_coef=0.0", "optim.mini_batch_size=8"]}


@pytest.mark.parametrize("algorithm", RUNS)
def test_a_run_without_the_skipped_passes_logs_the_sampler_statistics_and_no_fake_kl(tmp_path, algorithm):
    cfg = load_config(str(SOURCE_CONFIGS / "toy.yaml"), [*SMALL, *RUNS[algorithm], f"output_dir={tmp_path}"])
    run = train(cfg, progress=False)
    records = [r for r in read_metrics(run / "metrics.jsonl") if r["phase"] == algorithm]
    assert len(records) == 2
    for record in records:
        assert record["rollout/logprob_abs_diff"] < 1e-4
        assert record["rollout/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
        assert "train/kl_ref" not in record and "train/actor/kl_loss" not in record
        assert record["train/actor/entropy"] > 0
    assert 'data-key="train/kl_ref"' in (run / "report.html").read_text()     # its plot says "no data"
