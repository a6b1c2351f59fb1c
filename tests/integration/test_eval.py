"""`horizonrl eval` end to end: a tiny run's init and checkpoint on held-out seeds, greedy and sampled."""

import json
import shutil

import pytest
import yaml

from horizonrl.cli import main
from horizonrl.config import SOURCE_CONFIGS
from horizonrl.report.diagnostics import FAILURE_TYPES
from horizonrl.rollout.seeds import HELD_OUT_START

TOY = str(SOURCE_CONFIGS / "toy.yaml")   # the river recipe: small, fast runs

TINY_RUN = ["iterations=1", "rollout.n_env=2", "ppo.e_len=4", "optim.mini_batch_size=8", "optim.micro_batch_size=8",
            "critic.warmup_batches=0", "model.warm_start.steps=10", "model.warm_start.iterations=1",
            "env.kwargs.max_steps=6"]
EVAL = ["--episodes", "3", "--max-steps", "4"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A toy run trained for one iteration: config.yaml, init/ and checkpoint/."""
    output = tmp_path_factory.mktemp("runs")
    assert main(["train", TOY, *TINY_RUN, f"output_dir={output}", "--quiet"]) == 0
    (run,) = output.iterdir()
    return run


def numbers(results: dict) -> dict:
    """The results without wall-clock times."""
    return {mode: {env: {k: v for k, v in summary.items() if k != "seconds"} for env, summary in m["envs"].items()}
            for mode, m in results["modes"].items()}


def test_run_checkpoint_and_init_evaluate_with_the_run_settings(run_dir, capsys):
    assert main(["eval", str(run_dir), *EVAL]) == 0
    out = capsys.readouterr().out
    assert "greedy   river" in out and "sampled  river" in out and "eval-checkpoint.json" in out
    results = json.loads((run_dir / "eval-checkpoint.json").read_text())
    assert results["checkpoint"] == str(run_dir / "checkpoint")
    assert results["run_config"] == str(run_dir / "config.yaml")
    assert results["seeds"] == {**results["seeds"], "first": HELD_OUT_START, "last": HELD_OUT_START + 2, "count": 3}
    assert results["max_steps"] == 4 and results["agent"]["memory"] == 1
    assert results["modes"]["greedy"]["temperature"] == 0.0 and results["modes"]["sampled"]["temperature"] == 1.0
    for summary in (numbers(results)["greedy"]["river"], numbers(results)["sampled"]["river"]):
        assert summary["episodes"] == 3 and summary["errored_episodes"] == 0
        for key in ("success_rate", "valid_action_ratio"):
            assert 0.0 <= summary[key] <= 1.0
        assert 1 <= summary["episode_length"] <= 4
        assert set(summary["failures"]) == set(FAILURE_TYPES)
        assert sum(summary["failures"].values()) == round(3 * (1 - summary["success_rate"]))

    assert main(["eval", str(run_dir / "init"), *EVAL, "--mode", "greedy"]) == 0
    initial = json.loads((run_dir / "eval-init.json").read_text())
    assert initial["checkpoint"] == str(run_dir / "init") and list(initial["modes"]) == ["greedy"]
    assert initial["agent"] == results["agent"] and initial["seeds"] == results["seeds"]


def test_greedy_evaluation_is_deterministic(run_dir):
    runs = []
    for _ in range(2):
        assert main(["eval", str(run_dir / "checkpoint"), *EVAL, "--mode", "greedy"]) == 0
        runs.append(numbers(json.loads((run_dir / "eval-checkpoint.json").read_text())))
    assert runs[0] == runs[1]


def test_a_bare_checkpoint_needs_env_ids(run_dir, tmp_path, capsys):
    bare = shutil.copytree(run_dir / "checkpoint", tmp_path / "policy")
    assert main(["eval", str(bare), *EVAL]) == 2
    assert "name the env(s) with --env" in capsys.readouterr().err
    assert main(["eval", str(bare), *EVAL, "--env", "river", "--mode", "greedy"]) == 0
    results = json.loads((tmp_path / "eval-policy.json").read_text())
    assert results["run_config"] is None and list(results["modes"]["greedy"]["envs"]) == ["river"]


def test_init_of_a_run_that_loaded_model_path_is_that_model(run_dir, tmp_path):
    """A run started from model.path saves no init/; RUN/init stands for model.path."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["model"].update(path=str(run_dir / "checkpoint"), warm_start=None)
    loaded = tmp_path / "loaded-run"
    loaded.mkdir()
    (loaded / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["eval", str(loaded / "init"), *EVAL, "--mode", "greedy"]) == 0
    assert json.loads((loaded / "eval-init.json").read_text())["checkpoint"] == str(run_dir / "checkpoint")


@pytest.mark.parametrize("args,message", [
    (["--episodes", "0"], "episodes must be between 1 and"),
    (["--env", "nope"], "unknown env 'nope'"),
    (["--max-steps", "0"], "--max-steps must be >= 1"),
])
def test_bad_requests_are_one_clear_error(run_dir, capsys, args, message):
    assert main(["eval", str(run_dir), *args]) == 2
    assert message in capsys.readouterr().err


def test_not_a_run_nor_a_checkpoint(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert "not a checkpoint folder" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "gone")]) == 2
    assert f"{tmp_path / 'gone'}: no such folder" in capsys.readouterr().err
