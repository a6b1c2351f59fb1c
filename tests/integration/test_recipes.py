"""Every env recipe in configs/ loads and runs one PPO iteration on the CPU, scaled down, with a saved
tiny model (random weights, a tokenizer trained on River's text) standing in for its hub model; the
tool-use recipe runs one GRPO iteration end to end with its own tiny model."""

import re
from pathlib import Path

import pytest
import yaml
from optional_packages import skip_unless_installed  # tests/integration is on sys.path under pytest

from horizonrl.config import load_config
from horizonrl.report.metrics import read_metrics
from horizonrl.runstate.checkpoint import save_checkpoint
from horizonrl.train.loop import train

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def raw(recipe: Path) -> dict:
    """The recipe's YAML as written: read without validation, which would need every env's package."""
    return yaml.safe_load(recipe.read_text()) or {}


# a recipe's first line: its command, with any overrides it needs
TRAIN_COMMAND = r"# (torchrun --nproc_per_node \d+ -m )?horizonrl train configs/{name}( \S+=\S+)*"
RECIPES = sorted(r for r in CONFIGS.glob("*.yaml")   # train recipes of an env (not sft, not a task)
                 if re.fullmatch(TRAIN_COMMAND.format(name=re.escape(r.name)), r.read_text().splitlines()[0])
                 and raw(r).get("task") is None)
SMALL = ["model.warm_start=null", "iterations=1", "rollout.n_env=2", "ppo.e_len=2", "rollout.max_tokens=16",
        "optim.mini_batch_size=4", "optim.micro_batch_size=4", "critic.warmup_batches=1", "critic.warmup_iters=1",
        "device=cpu", "rollout.engine=hf", "validation=null",   # the default job validates: test_default_job.py
        "group.n_tasks=2", "group.group_size=2", "group.max_turns=2"]   # group recipes (babyai_smollm2: gigpo)


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_recipe_runs_one_iteration_on_cpu(recipe, tmp_path, river_tiny):
    first_line = recipe.read_text().splitlines()[0]
    assert re.fullmatch(TRAIN_COMMAND.format(name=re.escape(recipe.name)), first_line)
    env_id = raw(recipe).get("env", {}).get("id", "river")
    for one in [env_id] if isinstance(env_id, str) else env_id:
        skip_unless_installed(one)                # only a missing optional package skips; all else fails
    save_checkpoint(tmp_path / "tiny", river_tiny[1], river_tiny[0])
    cfg = load_config(recipe, [*SMALL, f"model.path={tmp_path / 'tiny'}", f"output_dir={tmp_path / 'runs'}"])
    run_dir = train(cfg, progress=False)      # random weights: mostly invalid output, default actions
    records = read_metrics(run_dir / "metrics.jsonl")
    if cfg.algorithm == "ppo":                # a critic warmup batch, then one of 2 streams x 2 turns
        assert [r["iteration"] for r in records] == [0, 1] and records[1]["env/turns"] == 4
    else:                                     # 2 tasks x 2 episodes of 1 or 2 turns
        assert [r["iteration"] for r in records] == [1] and 4 <= records[0]["env/turns"] <= 8
    assert records[-1]["env/errors"] == 0


def test_every_recipe_is_a_train_or_sft_recipe_and_says_so_first():
    """A recipe's first line is the command that runs it (the sft recipe: `horizonrl sft`)."""
    for recipe in CONFIGS.glob("*.yaml"):
        command = recipe.read_text().splitlines()[0]
        assert (re.fullmatch(TRAIN_COMMAND.format(name=re.escape(recipe.name)), command)
                or command == f"# horizonrl sft configs/{recipe.name}")
    assert load_config(CONFIGS / "babyai_tiny_sft.yaml").sft.episodes > 0


def test_tool_use_recipe_trains_on_merged_agent_loop_episodes(tmp_path):
    cfg = load_config(CONFIGS / "arithmetic.yaml", [
        "iterations=1", "group.n_tasks=2", "group.group_size=4", "model.warm_start.steps=30",
        "model.warm_start.iterations=1", "device=cpu", f"output_dir={tmp_path}"])
    assert (CONFIGS / "arithmetic.yaml").read_text().splitlines()[0] == "# horizonrl train configs/arithmetic.yaml"
    (record,) = read_metrics(train(cfg, progress=False) / "metrics.jsonl")
    assert record["phase"] == "grpo" and record["env/episodes"] == 8
    assert record["data/merge/rows"] == 8 and record["data/merge/merged"] == record["data/merge/turns"] - 8
    assert record["data/merge/split_template"] == record["data/merge/split_other"] == 0
    assert record["rollout/tool_calls"] > 0 and "train/actor/pg_loss" in record


GPU_RECIPES = [r for r in RECIPES if r.read_text().startswith("# torchrun")]


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=[r.stem for r in GPU_RECIPES])
def test_gpu_recipe_fits_the_gpus_its_first_line_names(recipe):
    from horizonrl.plan import plan

    gpus = int(re.search(r"--nproc_per_node (\d+)", recipe.read_text().splitlines()[0]).group(1))
    env_id = raw(recipe)["env"]["id"]
    for one in [env_id] if isinstance(env_id, str) else env_id:
        skip_unless_installed(one)
    result = plan(load_config(recipe, runs_here=False), gpus)   # the hub model's config.json, or the copy shipped
    assert result.fits, result
