"""A run with validation (train/validation.py): the default job, shortened, validates at iterations 0, 2 and
3 (the last), keeps the best policy as best/, trains exactly as without validation, and `horizonrl eval RUN`
evaluates best/. A group run (no critic warmup, no iteration 0) validates its starting policy too."""

import json

import torch
from safetensors.torch import load_file

from horizonrl.cli import main
from test_resume import assert_same_records

SHORT = ["iterations=3", "rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=16", "critic.warmup_batches=1",
         "critic.warmup_iters=1", "save_every=0"]
TASKS = ["babyai/goto", "babyai/pickup"]


def train(tmp_path, name: str, *overrides: str):
    assert main(["train", *SHORT, *overrides, f"output_dir={tmp_path / name}", "--quiet"]) == 0
    (run,) = (tmp_path / name).iterdir()
    return run


def test_validation_keeps_the_best_policy_without_changing_the_training(tmp_path, capsys):
    plain = train(tmp_path, "plain")
    run = train(tmp_path, "validated", "validation.every=2", "validation.episodes=3")

    lines = [json.loads(line) for line in (run / "validation.jsonl").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [0, 2, 3]
    best_so_far = -1.0
    for line in lines:
        assert list(line["envs"]) == TASKS
        rates = [line["envs"][task]["success_rate"] for task in TASKS]
        assert line["success_rate"] == sum(rates) / 2
        assert all(sum(line["envs"][task]["failures"].values()) == round(3 * (1 - rate))
                   for task, rate in zip(TASKS, rates))
        assert line["best"] == (line["success_rate"] >= best_so_far)   # a tie goes to the later iteration
        best_so_far = max(best_so_far, line["success_rate"])
    best, final = (load_file(run / folder / "model.safetensors") for folder in ("best", "checkpoint"))
    assert all(torch.equal(best[name], final[name]) for name in final) == lines[-1]["best"]

    assert_same_records(run, plain)

    assert main(["eval", str(run), "--episodes", "2", "--max-steps", "3", "--mode", "greedy"]) == 0
    assert json.loads((run / "eval-best.json").read_text())["checkpoint"] == str(run / "best")
    capsys.readouterr()


def test_a_group_run_validates_the_policy_it_starts_from(tmp_path):
    """GRPO starts at iteration 1: the policy it starts from is validated as iteration 0, before the first update,
    so best/ can be the warm start."""
    run = train(tmp_path, "grpo", "algorithm=grpo", "group.n_tasks=2", "group.group_size=2", "optim.mini_batch_size=4",
                "iterations=2", "validation.every=5", "validation.episodes=2")
    lines = [json.loads(line) for line in (run / "validation.jsonl").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [0, 2] and lines[0]["best"]
