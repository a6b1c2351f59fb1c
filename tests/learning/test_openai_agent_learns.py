"""An agent we did not write learns: examples/arithmetic_openai_agent.py (the openai package alone, function
calling with its own calculator) trains through the gateway with GRPO, and its success on arithmetic word
problems goes up from the warm start's.

Initial success is the first iteration's (64 episodes sampled by the warm-started tiny model before any
update); final success is pooled over the last 3 iterations. Measured on seed 0 (2026-11-24): 0.34 at the
first iteration, 0.56-0.72 from the third on; again 2026-11-27 (10 iterations): 0.34, 0.44, 0.66, 0.59, 0.67,
0.69, 0.72, 0.56, 0.66, 0.67. It runs 6: iterations 4-6 pooled were 0.65 (0.63 for 8-10).
"""

import pytest
import torch

from horizonrl.config import load_config
from horizonrl.report.metrics import read_metrics
from horizonrl.train.loop import train

torch.set_num_threads(1)


def pooled_success(records):
    episodes = sum(r["env/episodes"] for r in records)
    return sum(r["env/success_rate"] * r["env/episodes"] for r in records) / episodes


@pytest.mark.slow
def test_the_openai_agent_gets_better_at_arithmetic(tmp_path):
    cfg = load_config("configs/arithmetic_openai_agent.yaml", ["iterations=6", "device=cpu", f"output_dir={tmp_path}"])
    records = read_metrics(train(cfg, progress=False) / "metrics.jsonl")
    curve = [(r["iteration"], round(r["env/success_rate"], 2)) for r in records]
    print(f"learning curve (iteration, success): {curve}")
    assert all(r["env/errors"] == 0 and r["env/episodes"] == 64 for r in records), curve
    initial, final = pooled_success(records[:1]), pooled_success(records[-3:])
    assert final >= initial + 0.15 and final >= 0.5, curve
