"""benchmarks/learning.py's data transforms, with golden values worked by hand: a run's training curve from its
metrics records, the aggregate over seeds, the markdown table, the plotted band and a cell's overrides."""

import importlib.util
import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location(
    "learning_benchmark", Path(__file__).resolve().parents[2] / "benchmarks" / "learning.py")
learning = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learning)


def test_curve_falls_back_to_running_sums_of_turns_and_timings():
    records = [{"iteration": 0, "env/turns": 2048, "env/success_rate": 0.15, "timing/warmup_s": 80.0},
               {"iteration": 1, "env/turns": 256, "env/success_rate": None,
                "timing/rollout_s": 1.0, "timing/score_s": 1.5, "timing/update_s": 2.5}]
    assert learning.training_curve(records, ["river"]) == {
        "env_steps": [2048, 2304], "wall_clock_s": [80.0, 85.0], "success_rate": {"river": [0.15, None]}}


def test_curve_reads_progress_keys_and_the_success_of_each_task():
    records = [{"iteration": 1, "env/turns": 256, "progress/env_steps": 1280, "progress/wall_clock_s": 95.0,
                "env/success_rate": 0.5, "env/babyai/goto/success_rate": 0.75, "env/babyai/pickup/success_rate": 0.25},
               {"iteration": 2, "env/turns": 256, "progress/env_steps": 1536, "progress/wall_clock_s": 107.0,
                "env/success_rate": 1.0, "env/babyai/goto/success_rate": 1.0}]
    assert learning.training_curve(records, ["babyai/goto", "babyai/pickup"]) == {
        "env_steps": [1280, 1536], "wall_clock_s": [95.0, 107.0],
        "success_rate": {"babyai/goto": [0.75, 1.0], "babyai/pickup": [0.25, None]}}


def cell(algorithm: str, seed: int, greedy: float, sampled: float, init_greedy: float, wall_clock_s: float) -> dict:
    return {"algorithm": algorithm, "seed": seed, "tasks": ["river"], "env_steps": 7168,
            "wall_clock_s": wall_clock_s, "iterations": 20,
            "final": {"greedy": {"river": greedy}, "sampled": {"river": sampled}},
            "init": {"greedy": {"river": init_greedy}, "sampled": {"river": 0.25}}}


CELLS = [cell("ppo", 0, 0.5, 0.25, 0.0, 200.0), cell("ppo", 1, 0.75, 0.5, 0.25, 220.0),
         cell("ppo", 2, 1.0, 0.75, 0.5, 240.0), cell("grpo", 0, 0.0, 0.4, 0.0, 180.0)]


def test_aggregate_over_seeds():
    result = learning.aggregate(CELLS, ["ppo", "grpo", "gigpo"])
    assert list(result) == ["ppo", "grpo"]   # gigpo has no finished cell
    ppo = result["ppo"]
    assert ppo["seeds"] == [0, 1, 2]
    assert ppo["final"]["greedy"]["river"] == {"mean": 0.75, "min": 0.5, "max": 1.0}
    assert ppo["final"]["sampled"]["river"] == {"mean": 0.5, "min": 0.25, "max": 0.75}
    assert ppo["init"]["greedy"]["river"] == {"mean": 0.25, "min": 0.0, "max": 0.5}
    assert ppo["wall_clock_s"] == {"mean": 220.0, "min": 200.0, "max": 240.0}
    assert ppo["env_steps"] == {"mean": 7168, "min": 7168, "max": 7168}
    assert result["grpo"]["final"]["greedy"]["river"] == {"mean": 0.0, "min": 0.0, "max": 0.0}


def test_markdown_table():
    table = learning.markdown_table(learning.aggregate(CELLS, ["ppo", "grpo"]), episodes=64)
    assert table == (
        "Held-out success (64 episodes per task and mode): init -> final [min, max over seeds].\n\n"
        "| algorithm | seeds | river greedy | river sampled | env steps | wall-clock s | iterations |\n"
        "|---|---|---|---|---|---|---|\n"
        "| ppo | 3 | 0.25 -> 0.75 [0.50, 1.00] | 0.25 -> 0.50 [0.25, 0.75] | 7168 [7168, 7168] | 220 [200, 240] "
        "| 20 [20, 20] |\n"
        "| grpo | 1 | 0.00 -> 0.00 [0.00, 0.00] | 0.25 -> 0.40 [0.40, 0.40] | 7168 [7168, 7168] | 180 [180, 180] "
        "| 20 [20, 20] |\n")


def test_band_interpolates_each_seed_over_the_range_all_cover():
    curves = [{"env_steps": [0, 10, 20], "success_rate": {"river": [0.0, None, 1.0]}},
              {"env_steps": [0, 10, 30], "success_rate": {"river": [0.5, 0.5, 0.5]}},
              {"env_steps": [0, 10], "success_rate": {"river": [None, None]}}]   # no episode finished: left out
    grid, mean, low, high = learning.band(curves, "river", points=3)
    np.testing.assert_allclose(grid, [0, 10, 20])
    np.testing.assert_allclose(mean, [0.25, 0.5, 0.75])
    np.testing.assert_allclose(low, [0.0, 0.5, 0.5])
    np.testing.assert_allclose(high, [0.5, 0.5, 1.0])


@pytest.mark.parametrize("algorithm, extra", [
    ("ppo", ["iterations=28"]),   # 7168 env steps / (32 streams x 8 turns)
    ("grpo", ["group.n_tasks=8", "group.group_size=8", "group.max_turns=14", "iterations=112"]),   # / (8 x 8)
])
def test_cell_overrides_under_the_budget(algorithm, extra):
    args = Namespace(set=[], iterations=None, env_steps=7168, wall_clock_s=360.0)
    overrides = learning.cell_overrides("toy", algorithm, 2, args)
    group, last = extra[:-1], extra[-1]
    assert overrides == ["seed=2", f"algorithm={algorithm}", f"name=toy-{algorithm}-seed2", *group,
                         "budget.env_steps=7168", "budget.wall_clock_s=360.0", last]
    smoke = learning.cell_overrides("toy", algorithm, 2, Namespace(set=[], iterations=2))
    assert smoke == ["seed=2", f"algorithm={algorithm}", f"name=toy-{algorithm}-seed2", *group, "iterations=2"]


def test_group_cells_of_babyai_take_mini_batches_of_256():
    """~1100 turns a group batch: ~9 optimiser steps per iteration as ppo's 8, not ~35 (which drift)."""
    overrides = learning.cell_overrides("babyai", "gigpo", 0, Namespace(set=[], iterations=2))
    assert overrides == ["seed=0", "algorithm=gigpo", "name=babyai-gigpo-seed0", "group.n_tasks=8",
                         "group.group_size=8", "group.max_turns=24", "optim.mini_batch_size=256", "iterations=2"]
    ppo = learning.cell_overrides("babyai", "ppo", 0, Namespace(set=[], iterations=2))
    assert "optim.mini_batch_size=256" not in ppo


def test_set_overrides_every_cell():
    """`--set` (the asynchronous-training learning runs) goes into every cell's run, before the budget."""
    args = Namespace(set=["rollout.async_training.max_staleness=1", "actor.tis_cap=2"], iterations=2)
    assert learning.cell_overrides("toy", "ppo", 1, args) == [
        "seed=1", "algorithm=ppo", "name=toy-ppo-seed1", "rollout.async_training.max_staleness=1", "actor.tis_cap=2",
        "iterations=2"]


@pytest.mark.parametrize("text, seeds", [("0,1,2", [0, 1, 2]), ("0-7", list(range(8))), ("0-2,5", [0, 1, 2, 5]),
                                         ("4", [4])])
def test_seeds_are_lists_and_inclusive_ranges(text, seeds):
    assert learning.parse_seeds(text) == seeds


def test_diagnostic_curves_keep_missing_values_as_none():
    records = [{"iteration": 0, "env/episodes": 9, "env/babyai/goto/episodes": 5, "env/babyai/pickup/episodes": 4,
                "train/critic/explained_variance": 0.1},
               {"iteration": 1, "env/episodes": 3, "env/babyai/goto/episodes": 3, "train/actor/entropy": 0.5,
                "train/actor/approx_kl": 0.01, "train/kl_ref": 0.02, "train/critic/explained_variance": 0.4}]
    assert learning.diagnostic_curves(records, ["babyai/goto", "babyai/pickup"]) == {
        "train/actor/entropy": [None, 0.5], "train/actor/approx_kl": [None, 0.01], "train/kl_ref": [None, 0.02],
        "train/critic/explained_variance": [0.1, 0.4],
        "episodes/babyai/goto": [5, 3], "episodes/babyai/pickup": [4, None]}
    assert learning.diagnostic_curves(records, ["river"])["episodes/river"] == [9, 3]


def test_seed_table_gives_each_seed_its_success_and_greedy_failures():
    failures = {"greedy": {"river": {"invalid_output": 0, "loop": 3, "time_out": 1, "other": 0}}}
    cells = [{**cell("ppo", 1, 0.75, 0.5, 0.0, 1.0), "failures": {"final": failures},
              "best": {"greedy": {"river": 0.875}}},
             {**cell("ppo", 0, 1.0, 0.25, 0.0, 1.0), "best": None,
              "failures": {"final": {"greedy": {"river": dict.fromkeys(failures["greedy"]["river"], 0)}}}}]
    assert learning.seed_table(cells).splitlines()[2:] == [
        "| algorithm | seed | river greedy | river sampled | river greedy failures | river greedy, best/ |",
        "|---|---|---|---|---|---|",
        "| ppo | 0 | 1.000 | 0.250 | 0 / 0 / 0 / 0 | - |", "| ppo | 1 | 0.750 | 0.500 | 0 / 3 / 1 / 0 | 0.875 |"]


def test_validations_of_a_run(tmp_path):
    assert learning.validations(tmp_path) == []
    line = {"iteration": 5, "success_rate": 0.5, "best": True,
            "envs": {"river": {"success_rate": 0.5, "failures": {"loop": 1}}}}
    (tmp_path / "validation.jsonl").write_text(json.dumps(line) + "\n")
    assert learning.validations(tmp_path) == [{"iteration": 5, "success_rate": 0.5, "best": True,
                                                "envs": {"river": 0.5}}]


def test_diagnostics_table_weighs_success_by_episodes_and_skips_the_warmup():
    c = {"algorithm": "ppo", "seed": 3, "tasks": ["goto", "pickup"],
         "curve": {"success_rate": {"goto": [0.5, 1.0, 0.5, None], "pickup": [0.0, 0.25, None, 1.0]}},
         "diagnostics": {"episodes/goto": [9, 2, 6, None], "episodes/pickup": [9, 4, None, 1],
                         "train/actor/entropy": [None, 0.4, 0.2, 0.3],
                         "train/actor/approx_kl": [None, 0.01, None, None], "train/kl_ref": [None, None, None, None],
                         "train/critic/explained_variance": [0.9, 0.1, 0.2, 0.3]},
         "validation": [{"iteration": 0, "best": True}, {"iteration": 2, "best": True},
                        {"iteration": 3, "best": False}]}
    row = learning.diagnostics_table([c], last=3).splitlines()[-1]   # the last 3 after iteration 0: 1-3
    # goto over iterations 1-3: (1.0 x 2 + 0.5 x 6) / 8; pickup: (0.25 x 4 + 1.0 x 1) / 5; episodes after
    # iteration 0; entropy (0.4 + 0.2 + 0.3) / 3; explained variance without iteration 0's 0.9
    assert row == "| ppo | 3 | 0.62 | 0.40 | 8 | 5 | 0.3 | 0.01 | - | 0.2 | 2 |"
