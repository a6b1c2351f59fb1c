"""The toy recipe learns with asynchronous training (rollout.async_training.max_staleness=1): PPO's batches are
collected one update ahead, with every turn's weight version at most one behind the policy it trains, and the
success rate goes from under 0.2 to at least 0.9 (pooled over 5 consecutive iterations) and holds at 0.8 or
more over the last 5.

With the recipe's clip (0.2) a K = 1 run of the toy dips late where K = 0's does not: a CI run (2026-11-27) was
at 1.00 in iterations 11-14 and fell to 0.23 at 16 (0.71 at 22), and 5 of 9 local runs fell below 0.9 after
reaching 1.00 (to 0.41-0.86; one stayed near 0.5). With clip 0.1 none of 4 did
(benchmarks/results/history-async.md, "Learning with K = 1"; benchmarks/results/learning-toy-async-k1-late-dips.md),
so this test runs with clip 0.1.

It runs the plain forward (optim.shared_prefix=false), as those runs did: with the recipe's shared prefixes, whose
float rounding differs, two runs learned later (2026-11-28: 0.85-1.00 at iterations 15-20 on the 2-core EPYC alone;
in a CI-equivalent run 0.73-0.93 at 15-20, its best 5 iterations pooled 0.88), while PPO at K = 0 learned as
before (1.00 at 11).

Unlike K = 0, a K = 1 run is not bit-reproducible, although every batch here is exactly one version old with no
turn in flight at a sync: which requests the engine decodes together depends on timing, which moves float
rounding, and runs of the same seed part (at iteration 8-9 here).
"""

import pytest

from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.report.metrics import read_metrics
from horizonrl.train.loop import train
from test_toy_learns import pooled_success

TOY = str(SOURCE_CONFIGS / "toy.yaml")


@pytest.mark.slow   # 20 iterations: with K = 1, tis_cap 1 and clip 0.1, 4 runs of seed 1 were at 1.00 from iteration 14
def test_toy_recipe_reaches_90_percent_success_one_update_behind(tmp_path, toy_start):
    run_dir = train(load_config(TOY, ["iterations=20", "rollout.async_training.max_staleness=1", "actor.tis_cap=1.0",
                                      "actor.clip_low=0.1", "actor.clip_high=0.1", "optim.shared_prefix=false",
                                      *toy_start,
                                      f"output_dir={tmp_path}"]),
                    progress=False)
    records = read_metrics(run_dir / "metrics.jsonl")
    curve = [(r["iteration"], round(r["env/success_rate"] or 0, 2)) for r in records]
    print(f"learning curve (iteration, success): {curve}")
    assert pooled_success(records[:1]) < 0.2, curve
    assert max(pooled_success(records[i:i + 5]) for i in range(1, len(records) - 4)) >= 0.9, curve
    assert pooled_success(records[-5:]) >= 0.8, curve
    assert max(r["async/staleness_max"] for r in records[1:]) == 1
