"""`horizonrl train` end to end on a small budget: run folder, metric keys, checkpoint, config errors."""

import json
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from horizonrl.cli import main
from horizonrl.config import ALGORITHMS, SOURCE_CONFIGS
from horizonrl.learner.models import is_local_path
from horizonrl.report.metrics import read_metrics
from tensorboard_events import numbers, tensorboard_scalars

TOY = str(SOURCE_CONFIGS / "toy.yaml")   # the river recipe: small, fast runs

REQUIRED_KEYS = [
    "iteration", "env/success_rate", "env/episode_return", "env/episode_length", "env/valid_action_ratio",
    "train/actor/pg_loss", "train/actor/clipfrac", "train/actor/approx_kl", "train/actor/entropy",
    "train/critic/value_loss", "train/critic/explained_variance", "data/mask_ones_ratio",
    "perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "timing/rollout_s", "timing/update_s",
]
SMALL = ["iterations=2", "rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=8", "optim.micro_batch_size=8",
         "critic.warmup_batches=1", "critic.warmup_iters=1", "model.warm_start.steps=20",
         "model.warm_start.iterations=1"]


def test_train_writes_run_folder_metrics_and_checkpoint(tmp_path, capsys):
    assert main(["train", TOY, *SMALL, f"output_dir={tmp_path}", "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    assert f"run folder: {run_dir}" in capsys.readouterr().out
    assert "iterations: 2" in (run_dir / "config.yaml").read_text()

    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert records[0]["phase"] == "critic_warmup"
    for record in records[1:]:
        missing = [k for k in REQUIRED_KEYS if k not in record]
        assert not missing, missing
        assert record["data/mask_ones_ratio"] > 0 and record["perf/rollout_tokens_per_s"] > 0

    checkpoint = run_dir / "checkpoint"
    assert (checkpoint / "critic/model.safetensors").exists()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert model.config.vocab_size >= len(tokenizer)


@pytest.mark.parametrize("quiet", [False, True])
def test_the_critic_warmup_shows_its_progress_unless_quiet(tmp_path, capsys, quiet):
    """Before, the run's bar sat at 0/N through the whole critic warmup (minutes on a real model). Now a second bar
    counts its 2 x (1 + 2) = 6 batches: the 2 collected (warmup_batches), then those fitted in 2 passes
    (warmup_iters); it is first drawn at 0/6 and renamed at 2/6, when the fitting starts. --quiet: no bar."""
    args = ["train", TOY, *SMALL, "iterations=0", "critic.warmup_batches=2", "critic.warmup_iters=2",
            f"output_dir={tmp_path}", *(["--quiet"] if quiet else [])]
    assert main(args) == 0
    error = capsys.readouterr().err
    states = [line for line in re.split(r"[\r\n]", error) if line.startswith("critic warmup")]
    if quiet:
        assert not states and "%|" not in error, error
    else:
        assert states[0].startswith("critic warmup: collect:   0%|") and " 0/6 [" in states[0], error
        fit = next(state for state in states if state.startswith("critic warmup: fit"))
        assert fit.startswith("critic warmup: fit:  33%|") and " 2/6 [" in fit, error


def test_each_update_logs_its_linearly_decayed_entropy_bonus(tmp_path):
    assert main(["train", TOY, *SMALL, "actor.entropy_coef=0.01", "actor.entropy_decay=linear",
                 f"output_dir={tmp_path}", "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    records = read_metrics(run_dir / "metrics.jsonl")[1:]    # updates 1 and 2 of 2: 0.01 x (1, 1/2)
    assert [r["train/actor/entropy_coef"] for r in records] == pytest.approx([0.01, 0.005])


def test_checkpoint_loads_back_as_model_path(tmp_path):
    assert main(["train", TOY, *SMALL, "iterations=0", f"output_dir={tmp_path / 'a'}", "--quiet"]) == 0
    (run_dir,) = (tmp_path / "a").iterdir()
    assert main(["train", TOY, *SMALL, "iterations=1", "model.warm_start=null", f"model.path={run_dir / 'checkpoint'}",
                 f"output_dir={tmp_path / 'b'}", "--quiet"]) == 0
    (resumed,) = (tmp_path / "b").iterdir()
    assert [r["iteration"] for r in read_metrics(resumed / "metrics.jsonl")] == [0, 1]


def test_train_with_a_token_budget_per_micro_batch(tmp_path):
    assert main(["train", TOY, *SMALL, "iterations=1", "optim.max_tokens_per_micro_batch=256", f"output_dir={tmp_path}",
                 "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    (warmup, record) = read_metrics(run_dir / "metrics.jsonl")
    assert warmup["train/critic/oom_retries"] == 0
    assert record["train/actor/oom_retries"] == record["train/critic/oom_retries"] == 0
    assert record["train/actor/skipped_updates"] == 0


def vocab_mismatch(folder, river_tiny):
    """A checkpoint whose tokenizer has 3 more tokens than its model embeds."""
    tokenizer, model = river_tiny
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    grown = AutoTokenizer.from_pretrained(folder)
    grown.add_tokens([f"<extra_{i}>" for i in range(model.get_input_embeddings().num_embeddings - len(grown) + 3)])
    grown.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("model_path,message", [
    (lambda tmp, tiny: tmp / "nowhere", "model.path: no such folder: {tmp}/nowhere"),
    (lambda tmp, tiny: tmp, "model.path: {tmp} is not a model folder (no config.json)"),
    (lambda tmp, tiny: vocab_mismatch(tmp / "grown", tiny),
     "model.path: {tmp}/grown: tokenizer has 715 tokens but the model embeds only 712"),
])
def test_unloadable_model_path_is_one_clear_error(tmp_path, capsys, river_tiny, model_path, message):
    assert main(["train", TOY, "model.warm_start=null", f"model.path={model_path(tmp_path, river_tiny)}",
                 f"output_dir={tmp_path}", "--quiet"]) == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err
    assert not list(tmp_path.glob("toy-*")), "no run folder for a run that never started"


@pytest.mark.parametrize("name,local", [
    ("Qwen/Qwen2.5-3B-Instruct", False), ("gpt2", False), ("/models/qwen", True), ("./qwen", True),
    ("../qwen", True), ("~/qwen", True), ("runs/toy-1/checkpoint", True), ("a/b/c", True),
    ("models/qwen", True),          # its parent folder exists
])
def test_model_path_is_local_or_a_hub_id(name, local, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    assert is_local_path(name) == local


@pytest.mark.parametrize("args,message", [
    (["actor.clip_low=abc"], "actor.clip_low: Input should be a valid number"),
    (["missing.yaml"], "config file not found: missing.yaml"),
])
def test_console_script_reports_config_errors_without_traceback(args, message):
    result = subprocess.run([sys.executable, "-m", "horizonrl", "train", *args], capture_output=True, text=True)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_trains_two_iterations_on_the_toy_recipe(tmp_path, algorithm):
    """On river episodes that can succeed (2 stones, 6 turns; the optimal episode takes 2): group rollouts of
    one seed differ in return, so their advantages are not all 0 and the update moves the weights. The group
    algorithms take a mini-batch size that divides no PPO batch (6 rows, n_env * e_len = 16 turns). Truncated
    importance sampling is on: the hf engine samples from the learner's own weights, so every weight is ~1."""
    group = ["group.n_tasks=2", "group.group_size=4", "group.max_turns=6", "optim.mini_batch_size=6"]
    assert main(["train", TOY, "iterations=2", f"algorithm={algorithm}", "env.kwargs={stones: 2, max_steps: 8}",
                 "model.warm_start.steps=20", "model.warm_start.iterations=1", "rollout.n_env=4", "ppo.e_len=4",
                 "optim.mini_batch_size=8", "optim.micro_batch_size=8", "critic.warmup_batches=1",
                 "actor.tis_cap=2.0", *(group if algorithm != "ppo" else []), f"output_dir={tmp_path}", "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    records = read_metrics(run_dir / "metrics.jsonl")
    for record in records[-2:]:
        assert record["rollout/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
        assert record["rollout/tis_clipped_frac"] == 0.0
    assert [r["phase"] for r in records] == (["critic_warmup", "ppo", "ppo"] if algorithm == "ppo" else [algorithm] * 2)
    if algorithm != "ppo":
        assert all(r["env/episodes"] == 8 for r in records)
        assert "train/actor/pg_loss" in records[-1] and "train/critic/value_loss" not in records[-1]
        assert not (run_dir / "checkpoint" / "critic").exists()
    advantages = [turn["advantage"] for line in (run_dir / "trajectories.jsonl").read_text().splitlines()
                  for turn in json.loads(line)["turns"]]
    assert any(a != 0 for a in advantages)
    init, final = (load_file(run_dir / folder / "model.safetensors") for folder in ("init", "checkpoint"))
    assert any(not torch.equal(init[name], final[name]) for name in init)


def test_continuation_feedback_trains_on_merged_rows(tmp_path):
    assert main(["train", TOY, *SMALL, "agent.history=full", "agent.feedback=continuation", "samples=merged",
                 f"output_dir={tmp_path}", "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    record = read_metrics(run_dir / "metrics.jsonl")[-1]
    assert record["data/merge/split_template"] == record["data/merge/split_other"] == 0
    assert record["data/merge/merged"] > 0


def test_tensorboard_holds_the_jsonl_numbers_of_a_run(tmp_path):
    pytest.importorskip("tensorboard")
    assert main(["train", TOY, *SMALL, "report_to=[jsonl,tensorboard]", f"output_dir={tmp_path}", "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    expected = numbers(read_metrics(run_dir / "metrics.jsonl"))
    scalars = tensorboard_scalars(run_dir)
    assert set(scalars) == set(expected) and [step for step, _ in scalars["train/actor/pg_loss"]] == [1, 2]
    for key, by_iteration in expected.items():
        assert [step for step, _ in scalars[key]] == sorted(by_iteration)
        assert [value for _, value in scalars[key]] == [pytest.approx(by_iteration[i], rel=1e-6, abs=1e-30)
                                                        for i in sorted(by_iteration)]


def test_wandb_offline_run_writes_its_run_folder(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    try:
        assert main(["train", TOY, *SMALL, "iterations=1", "report_to=[wandb]", f"output_dir={tmp_path}",
                     "--quiet"]) == 0
    finally:
        wandb.teardown()                     # stops wandb's service process
    (run_dir,) = tmp_path.iterdir()
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    assert offline.name.endswith((run_dir / "wandb_id").read_text().strip())
    assert list(offline.glob("run-*.wandb")) and (run_dir / "metrics.jsonl").exists()
