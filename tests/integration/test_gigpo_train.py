"""GiGPO end to end on the toy recipe, group algorithms over several env ids, and run budgets."""

import json

import pytest
import torch

from horizonrl.cli import main
from horizonrl.config import SOURCE_CONFIGS
from horizonrl.report.metrics import read_metrics

torch.set_num_threads(1)

TOY = str(SOURCE_CONFIGS / "toy.yaml")
SMALL = ["model.warm_start.steps=20", "model.warm_start.iterations=1", "rollout.n_env=4", "group.n_tasks=2",
         "group.group_size=4", "optim.mini_batch_size=8", "optim.micro_batch_size=8"]


def only_run(folder):
    (run_dir,) = folder.iterdir()
    return run_dir


def test_gigpo_trains_the_toy_recipe_with_step_level_advantages(tmp_path):
    """`horizonrl train configs/toy.yaml algorithm=gigpo iterations=2`, on a smaller batch: the turns of an
    episode get different advantages (a group algorithm gives them one), and the anchor groups are logged."""
    assert main(["train", TOY, "algorithm=gigpo", "iterations=2", "env.kwargs={stones: 2, max_steps: 8}",
                 "group.max_turns=8", *SMALL, f"output_dir={tmp_path}", "--quiet"]) == 0
    run_dir = only_run(tmp_path)
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["phase"] for r in records] == ["gigpo", "gigpo"]
    for r in records:
        # every first turn of a group starts in the group's start state: anchors of 4, at least
        assert r["gigpo/anchor_group_size_mean"] >= 4 and 0.5 < r["gigpo/anchored_step_frac"] <= 1
    episodes = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    varied = [len({turn["advantage"] for turn in e["turns"]}) > 1 for e in episodes if len(e["turns"]) > 1]
    assert any(varied)


def test_a_group_algorithm_plays_each_env_id_of_a_list(tmp_path):
    assert main(["train", TOY, "algorithm=grpo", "iterations=1", "env.id=[river, babyai/goto]", "env.kwargs={}",
                 "group.max_turns=4", "model.warm_start.steps=0", *SMALL, f"output_dir={tmp_path}", "--quiet"]) == 0
    (record,) = read_metrics(only_run(tmp_path) / "metrics.jsonl")
    assert record["env/episodes"] == 8
    assert "env/river/success_rate" in record and "env/babyai/goto/success_rate" in record


def test_a_budget_of_env_steps_ends_the_run_and_resume_extends_it(tmp_path, capsys):
    budget = 60
    assert main(["train", TOY, "algorithm=grpo", "iterations=50", f"budget.env_steps={budget}", "group.max_turns=6",
                 *SMALL, f"output_dir={tmp_path}", "--quiet"]) == 0
    run_dir = only_run(tmp_path)
    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [sum(r["env/turns"] for r in records[:k + 1]) for k in range(len(records))]
    assert [r["progress/env_steps"] for r in records] == steps
    assert steps[-1] >= budget > steps[-2] and len(records) < 50          # stopped by the budget, not iterations
    assert (run_dir / "checkpoint" / "model.safetensors").is_file()
    assert main(["train", "--resume", str(run_dir), f"budget.env_steps={steps[-1] + 1}", "--quiet"]) == 0
    resumed = read_metrics(run_dir / "metrics.jsonl")
    assert len(resumed) == len(records) + 1
    assert resumed[-1]["progress/env_steps"] == steps[-1] + resumed[-1]["env/turns"]
    assert resumed[-1]["progress/wall_clock_s"] > records[-1]["progress/wall_clock_s"]


@pytest.mark.parametrize("key", ["budget.env_steps=0", "budget.wall_clock_s=-1"])
def test_a_budget_must_be_positive(tmp_path, capsys, key):
    assert main(["train", TOY, key, f"output_dir={tmp_path}"]) == 2
    assert key.partition("=")[0] in capsys.readouterr().err
