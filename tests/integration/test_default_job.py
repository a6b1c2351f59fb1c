"""The default job (`horizonrl train`, configs/babyai_tiny.yaml), shortened: PPO on BabyAI goto and
pickup from the shipped warm-start checkpoint, validated at both iterations, then `horizonrl eval` of the run's
start and of the policy its validation kept, on held-out seeds of both tasks. (Its full length and what it learns:
BENCHMARKS.md, Default job.)"""

import json

import pytest

from horizonrl.cli import main
from horizonrl.config import load_config
from horizonrl.learner.models import resolve_model_path
from horizonrl.report.metrics import read_metrics

SHORT = ["iterations=1", "rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=16", "critic.warmup_batches=1",
         "critic.warmup_iters=1", "save_every=0", "validation.episodes=2"]
TASKS = ["babyai/goto", "babyai/pickup"]


def test_default_job_trains_from_the_shipped_checkpoint_and_evaluates_both_tasks(tmp_path, capsys):
    cfg = load_config()
    assert cfg.model.path.startswith("builtin:") and cfg.env.ids == TASKS
    assert main(["train", *SHORT, f"output_dir={tmp_path}", "--quiet"]) == 0
    (run,) = tmp_path.iterdir()
    records = read_metrics(run / "metrics.jsonl")
    assert [r["phase"] for r in records] == ["critic_warmup", "ppo"]
    assert all(r["env/turns"] == 16 and r["env/valid_action_ratio"] > 0.5 for r in records)
    assert (run / "report.html").exists() and (run / "checkpoint" / "critic/model.safetensors").exists()
    assert [json.loads(line)["iteration"] for line in (run / "validation.jsonl").read_text().splitlines()] == [0, 1]

    for target, name in ((run / "init", "eval-init.json"), (run, "eval-best.json")):
        assert main(["eval", str(target), "--episodes", "2", "--max-steps", "3"]) == 0
        results = json.loads((run / name).read_text())
        for mode in ("greedy", "sampled"):
            assert list(results["modes"][mode]["envs"]) == TASKS
            assert all(s["episodes"] == 2 for s in results["modes"][mode]["envs"].values())
    assert results["checkpoint"] == str(run / "best")   # the policy the run's validation kept
    assert json.loads((run / "eval-init.json").read_text())["checkpoint"] == cfg.model.path
    capsys.readouterr()


def test_an_unknown_builtin_checkpoint_lists_the_shipped_ones():
    with pytest.raises(ValueError, match="no built-in checkpoint 'builtin:nope'; shipped: builtin:babyai-tiny"):
        resolve_model_path("builtin:nope")
