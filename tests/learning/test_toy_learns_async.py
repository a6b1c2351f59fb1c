"""The toy recipe learns with asynchronous training (rollout.async_training.max_staleness=1): PPO's batches are
collected one update ahead, with every turn's weight version at most one behind the policy it trains, and the
success rate goes from under 0.2 to at least 0.9 (pooled over 5 consecutive iterations), and holds at 0.8 or
more over the last 5.

Unlike K = 0, a K = 1 run is not bit-reproducible, although every batch here is exactly one version old with no
turn in flight at a sync: two runs of the same seed side by side (2026-11-26) parted at iteration 9 (0.80 and
0.81), and late iterations wobble by up to ~0.1 (0.89 at iteration 21 in one, 1.00 in the other; a CI run pooled
0.887 over its last 5). Hence the two thresholds.
"""

import pytest

from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.report.metrics import read_metrics
from horizonrl.train.loop import train
from test_toy_learns import pooled_success

TOY = str(SOURCE_CONFIGS / "toy.yaml")


@pytest.mark.slow   # 22 iterations: with K = 1 and tis_cap 1, seed 1 is at 0.98 from iteration 13 (BENCHMARKS.md)
def test_toy_recipe_reaches_90_percent_success_one_update_behind(tmp_path):
    run_dir = train(load_config(TOY, ["iterations=22", "rollout.async_training.max_staleness=1", "actor.tis_cap=1.0",
                                      f"output_dir={tmp_path}"]), progress=False)
    records = read_metrics(run_dir / "metrics.jsonl")
    curve = [(r["iteration"], round(r["env/success_rate"] or 0, 2)) for r in records]
    print(f"learning curve (iteration, success): {curve}")
    assert pooled_success(records[:1]) < 0.2, curve
    assert max(pooled_success(records[i:i + 5]) for i in range(1, len(records) - 4)) >= 0.9, curve
    assert pooled_success(records[-5:]) >= 0.8, curve
    assert max(r["async/staleness_max"] for r in records[1:]) == 1
