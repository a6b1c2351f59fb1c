"""A stop signal before the run's first checkpoint (the warm start, the critic warmup) ends the run within
seconds: one message, the exit status of a stop at an iteration boundary (128 + the signal), no traceback,
nothing half-written. Before, SIGTERM in the warm start logged "saving a checkpoint after this iteration"
and the run went on for minutes; a second SIGTERM ended it with a traceback."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.train.checkpoint import StoppedBeforeCheckpoint, StopSignals
from horizonrl.train.loop import train

RECIPE = "configs/arithmetic_openai_agent.yaml"
SMALL = ["group.n_tasks=2", "group.group_size=4", "model.warm_start.iterations=1", "device=cpu"]
STOPPED = "stopped by {} during the warm start, before the run folder was made: nothing was saved; start the run again"
PROMPT_S = 5.0     # the most a stop may take


class Run:
    """`horizonrl train ARGS --quiet` in a subprocess (started by the `spawn` fixture), its stderr read line by
    line as it comes."""

    def __init__(self, spawn, *args: str, **env: str):
        self.process = spawn([sys.executable, "-m", "horizonrl", "train", *args, "--quiet"],
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1", **env))
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stderr), daemon=True)
        self.reader.start()

    def wait_for(self, condition, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert self.process.poll() is None, "".join(self.lines)
            assert time.monotonic() < deadline, "timed out:\n" + "".join(self.lines)
            time.sleep(0.02)

    def stop(self, signum: int) -> tuple[float, str]:
        """Send `signum`; (seconds until the process ended, its whole stderr). One still running after 30 s is
        killed."""
        sent = time.monotonic()
        self.process.send_signal(signum)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        took = time.monotonic() - sent
        self.reader.join(timeout=10)
        return took, "".join(self.lines)


@pytest.mark.parametrize("recipe", [
    [RECIPE, *SMALL],                                                                       # task_warm_start
    [str(SOURCE_CONFIGS / "toy.yaml"), "model.warm_start.iterations=1", "device=cpu"],      # format_warm_start
])
def test_sigterm_while_the_warm_start_fine_tunes_ends_the_run_within_seconds(tmp_path, recipe, spawn):
    run = Run(spawn, *recipe, "model.warm_start.steps=1000000", f"output_dir={tmp_path}")
    run.wait_for(lambda: any("warm start: 1000000 steps on" in line for line in run.lines))
    took, stderr = run.stop(signal.SIGTERM)
    assert run.process.returncode == 128 + signal.SIGTERM, stderr
    assert took < PROMPT_S, stderr
    assert f"horizonrl: {STOPPED.format('SIGTERM')}\n" in stderr and "Traceback" not in stderr, stderr
    assert "saving a checkpoint" not in stderr and "SIGTERM: stopping the warm start within seconds" in stderr
    assert not list(tmp_path.iterdir())                          # no run folder


def test_sigint_while_the_teacher_plays_ends_the_run_within_seconds(tmp_path, spawn):
    """The teacher's tasks are played a batch at a time: the stop comes before the next batch. (The tiny
    tokenizer's corpus alone takes 32 batches of this slow agent's.)"""
    marker = tmp_path / "agent called"
    run = Run(spawn, RECIPE, *SMALL, "task.agent=tests/integration/misbehaving_agents.py:slow",
              f"output_dir={tmp_path / 'runs'}", MARKER=str(marker))
    run.wait_for(marker.exists)
    took, stderr = run.stop(signal.SIGINT)
    assert run.process.returncode == 128 + signal.SIGINT, stderr
    assert took < PROMPT_S, stderr
    assert f"horizonrl: {STOPPED.format('SIGINT')}\n" in stderr and "Traceback" not in stderr, stderr
    assert not (tmp_path / "runs").exists()


def test_sigterm_in_the_critic_warmup_ends_it_within_seconds_with_no_checkpoint(tmp_path):
    """In this process: the signal comes from a thread once the run folder holds the initial policy (init/).
    The critic's 300 passes would take about a minute, then save iteration 0's checkpoint."""
    cfg = load_config(SOURCE_CONFIGS / "toy.yaml", [
        "model.warm_start.steps=20", "model.warm_start.iterations=1", "rollout.n_env=4", "ppo.e_len=4",
        "optim.mini_batch_size=8", "critic.warmup_batches=2", "critic.warmup_iters=300", "iterations=1",
        "device=cpu", f"output_dir={tmp_path}"])
    sent = []

    def signal_once_started() -> None:
        while not list(tmp_path.glob("*/init/model.safetensors")):
            time.sleep(0.05)
        time.sleep(2.0)                                          # into the critic's passes
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_once_started, daemon=True).start()
    with pytest.raises(StoppedBeforeCheckpoint) as stopped:
        train(cfg, progress=False)
    assert time.monotonic() - sent[0] < PROMPT_S
    (run,) = tmp_path.iterdir()
    assert str(stopped.value) == (f"stopped by SIGTERM during the critic warmup, before the first checkpoint: the "
                                  f"run folder {run} has none to resume from; start the run again")
    assert stopped.value.signum == signal.SIGTERM
    assert not (run / "checkpoints").exists() and not (run / "checkpoint").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL   # StopSignals gave the handler back


def test_a_signal_before_a_phase_is_checked_ends_it_and_a_phase_that_ends_with_one_raises():
    signals = StopSignals()
    with signals.within("the warm start"):
        signals.check()                                          # no signal: goes on
    signals.signum = signal.SIGTERM
    with pytest.raises(StoppedBeforeCheckpoint, match="during the warm start, before the run folder was made"), \
            signals.within("the warm start"):
        pass                                                     # a signal came, and no check ran: the end raises
    assert signals.phase is None
