"""Checkpoint and resume: a run stopped (at its end, by SIGTERM, or killed mid-checkpoint) and resumed
with `horizonrl train --resume RUN` ends exactly where the same run trained straight through ends:
equal weights (actor and critic), metrics and trajectories.

Every run here uses one thread (conftest.py; OMP_NUM_THREADS=1 for subprocesses), so both sides
compute with the same kernels. Timing keys (`timing/*`, `perf/*`) measure wall time and are left out;
`rollout/logprob_abs_diff` (and its `_current`) compares the engine's log-probs with the learner's, and the
engine's move with float rounding as requests happen to share decode steps (engines/hf.py), so it is compared
approximately.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from horizonrl.agents.agent import Agent
from horizonrl.agents.prompt import plan_text
from horizonrl.cli import main
from horizonrl.config import SOURCE_CONFIGS, dump, load_config
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.scripted import ScriptedEngine
from horizonrl.envs.pool import open_envs
from horizonrl.report.metrics import read_metrics
from horizonrl.rollout.fixed_turn import FixedTurnCollector

TOY = str(SOURCE_CONFIGS / "toy.yaml")   # the river recipe: small, fast runs
SMALL = ["rollout.n_env=4", "ppo.e_len=4", "optim.mini_batch_size=8", "optim.micro_batch_size=8",
         "critic.warmup_batches=1", "critic.warmup_iters=1", "model.warm_start.steps=20",
         "model.warm_start.iterations=1"]
GROUPS = ["group.n_tasks=2", "group.group_size=2", "group.max_turns=4"]
ALGORITHMS = {"ppo": SMALL, "grpo": [*SMALL, "algorithm=grpo", *GROUPS], "rae": [*SMALL, "algorithm=rae", *GROUPS]}
ITERATIONS = 4
STALL_SCRIPT = Path(__file__).with_name("stall_checkpoint.py")


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """algorithm -> the run folder of ITERATIONS iterations trained without a stop (made on first use)."""
    runs = {}

    def run(algorithm: str) -> Path:
        if algorithm not in runs:
            output = tmp_path_factory.mktemp(f"straight-{algorithm}")
            assert main(["train", TOY, *ALGORITHMS[algorithm], f"iterations={ITERATIONS}", f"output_dir={output}",
                         "--quiet"]) == 0
            (runs[algorithm],) = output.iterdir()
        return runs[algorithm]

    return run


WEIGHTS = {"ppo": ("model.safetensors", "critic/model.safetensors"), "grpo": ("model.safetensors",),  # no critic
           "rae": ("model.safetensors",)}


def assert_same_run(run: Path, straight: Path, algorithm: str = "ppo") -> None:
    for name in WEIGHTS[algorithm]:
        for folder in (run, straight):
            assert (folder / "checkpoint" / name).is_file(), f"{folder / 'checkpoint'} has no {name}"
        ours, theirs = load_file(run / "checkpoint" / name), load_file(straight / "checkpoint" / name)
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), name
    assert_same_records(run, straight)
    assert _lines(run / "trajectories.jsonl") == _lines(straight / "trajectories.jsonl")


def assert_same_records(run: Path, other: Path) -> None:
    """The metrics records of two runs that trained alike are equal but for the clock, and for the engine's
    log-prob gaps to the learner (their last bits vary with the engine's threads) within 1e-5."""
    ours, theirs = read_metrics(run / "metrics.jsonl"), read_metrics(other / "metrics.jsonl")
    assert [r["iteration"] for r in ours] == [r["iteration"] for r in theirs]
    for mine, their in zip(ours, theirs):
        for engine_noise in ("rollout/logprob_abs_diff", "rollout/logprob_abs_diff_current", "rollout/sync_probe_gap",
                             "rollout/sync_probe_floor"):
            assert mine.pop(engine_noise, None) == pytest.approx(their.pop(engine_noise, None), abs=1e-5)
        assert deterministic(mine) == deterministic(their)


def deterministic(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(("timing/", "perf/")) and k != "progress/wall_clock_s"}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def horizonrl(spawn, *args: str, script: Path | None = None) -> subprocess.Popen:
    """`horizonrl train ARGS --quiet`, or `python script ARGS --quiet`, started by the `spawn` fixture."""
    command = [sys.executable, str(script)] if script else [sys.executable, "-m", "horizonrl", "train"]
    return spawn([*command, *args, "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 env=dict(os.environ, OMP_NUM_THREADS="1"))


def wait_for(condition, process: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("algorithm", ["ppo", "grpo", "rae"])     # rae: its baselines come back with the checkpoint
def test_resume_after_the_last_iteration_continues_exactly(tmp_path, straight, algorithm):
    assert main(["train", TOY, *ALGORITHMS[algorithm], "iterations=2", "save_every=0", f"output_dir={tmp_path}",
                 "--quiet"]) == 0
    (run,) = tmp_path.iterdir()
    assert checkpoints(run) == ["iter_000002"]
    assert main(["train", "--resume", str(run), f"iterations={ITERATIONS}", "--quiet"]) == 0
    assert f"iterations: {ITERATIONS}" in (run / "config.yaml").read_text()
    assert checkpoints(run) == [f"iter_{ITERATIONS:06d}"]
    assert_same_run(run, straight(algorithm), algorithm)


def test_resume_after_the_critic_warmup_continues_exactly(tmp_path, straight):
    """A checkpoint at iteration 0 holds an actor optimizer that has not stepped yet."""
    assert main(["train", TOY, *SMALL, "iterations=0", f"output_dir={tmp_path}", "--quiet"]) == 0
    (run,) = tmp_path.iterdir()
    assert checkpoints(run) == ["iter_000000"]
    assert main(["train", "--resume", str(run), f"iterations={ITERATIONS}", "--quiet"]) == 0
    assert_same_run(run, straight("ppo"))


def test_sigterm_saves_a_checkpoint_and_resume_continues_exactly(tmp_path, straight, spawn):
    process = horizonrl(spawn, TOY, *SMALL, f"iterations={ITERATIONS}", "save_every=0", f"output_dir={tmp_path}")
    metrics = lambda: next(tmp_path.glob("*/metrics.jsonl"), None)  # noqa: E731
    wait_for(lambda: metrics() is not None and metrics().read_text().endswith("\n"), process)  # the warmup's record
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    run = metrics().parent
    assert f"horizonrl train --resume {run}" in stderr and "Traceback" not in stderr
    (saved,) = checkpoints(run)
    stopped_at = int(saved.removeprefix("iter_"))
    assert stopped_at < ITERATIONS and read_metrics(run / "metrics.jsonl")[-1]["iteration"] == stopped_at
    assert (run / "report.html").exists() and not (run / "checkpoint").exists()

    resumed = horizonrl(spawn, "--resume", str(run))
    _, stderr = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, stderr
    assert_same_run(run, straight("ppo"))


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one_for_resume(tmp_path, straight, spawn):
    marker = tmp_path / "stalled"
    process = horizonrl(spawn, "3", str(marker), TOY, *SMALL, f"iterations={ITERATIONS}", "save_every=1",
                        f"output_dir={tmp_path / 'runs'}", script=STALL_SCRIPT)
    wait_for(marker.exists, process)
    process.kill()
    process.communicate(timeout=60)
    (run,) = (tmp_path / "runs").iterdir()
    assert checkpoints(run) == ["iter_000002", "iter_000003.tmp"]
    assert json.loads((run / "checkpoints/iter_000002/training_state.json").read_text())["iteration"] == 2
    assert read_metrics(run / "metrics.jsonl")[-1]["iteration"] == 3   # written before its checkpoint

    resumed = horizonrl(spawn, "--resume", str(run))
    _, stderr = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, stderr
    assert checkpoints(run) == [f"iter_{ITERATIONS:06d}"]
    assert_same_run(run, straight("ppo"))


def test_resume_refuses_other_overrides_and_a_run_without_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump(load_config(TOY, SMALL)))
    assert main(["train", "--resume", str(run), "actor.lr=1.0"]) == 2
    refusal = "only iterations, save_every, budget.env_steps, budget.wall_clock_s can be changed (got actor.lr)"
    assert refusal in capsys.readouterr().err
    assert main(["train", "--resume", str(run)]) == 2
    assert f"cannot resume: {run} has no complete checkpoint" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nowhere")]) == 2
    assert "is not a run folder (no config.yaml)" in capsys.readouterr().err


def river_collector(tokenizer, stones: int = 3) -> FixedTurnCollector:
    """Three river streams whose policy answers each prompt with an action chosen by the prompt's length."""
    actions = ["jump left", "jump right", "wait"]
    engine = ScriptedEngine(tokenizer, lambda prompt: plan_text("go", actions[len(prompt) % 3]))
    envs = open_envs("river", {"stones": stones, "max_steps": 9}, 3, workers=False, timeout_s=10)
    return FixedTurnCollector(envs, Agent(tokenizer), engine, SamplingParams(max_tokens=16), e_len=4, seed=3)


def test_collector_state_replays_running_episodes_into_fresh_envs(river_tiny):
    tokenizer, _ = river_tiny
    original = river_collector(tokenizer)
    original.collect()
    state = json.loads(json.dumps(original.state_dict()))           # as the checkpoint stores it
    assert any(s["observation"] is not None and s["actions"] for s in state["streams"])
    restored = river_collector(tokenizer)
    restored.load_state_dict(state)
    for _ in range(2):
        assert fragments(restored.collect()) == fragments(original.collect())


def fragments(episodes) -> list[tuple]:
    return [(e.episode_id, [(t.prompt_ids, t.response_ids, t.reward) for t in e.turns], e.metrics,
             e.bootstrap_prompt_ids) for e in episodes]


def test_an_env_that_replays_differently_is_one_clear_error(river_tiny):
    tokenizer, _ = river_tiny
    original = river_collector(tokenizer)
    original.collect()
    with pytest.raises(ValueError, match="does not lead to the saved observation"):
        river_collector(tokenizer, stones=5).load_state_dict(original.state_dict())
