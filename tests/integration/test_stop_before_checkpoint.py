"""A stop signal before the run's first checkpoint (the warm start, the critic warmup) ends the run within
seconds: one message, the exit status of a stop at an iteration boundary (128 + the signal), no traceback,
nothing half-written. Before, SIGTERM in the warm start logged "saving a checkpoint after this iteration"
and the run went on for minutes; a second SIGTERM ended it with a traceback.

"Within seconds" is checked by what the run did after the signal, never by a clock: it ends at its next check
(no batch played or scored after it) with its own exit status, where the phase it stopped would have gone on for
minutes (a million warm-start steps, 31 more teacher batches, 300 critic passes). The bounds on the waits (120 s)
only turn a run that does not stop into a failure."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.train import ppo
from horizonrl.runstate.checkpoint import StoppedBeforeCheckpoint, StopSignals
from horizonrl.train.loop import train

RECIPE = "configs/arithmetic_openai_agent.yaml"
SMALL = ["group.n_tasks=2", "group.group_size=4", "model.warm_start.iterations=1", "device=cpu"]
STOPPED = "stopped by {} during the warm start, before the run folder was made: nothing was saved; start the run again"
BOUND_S = 120.0    # a wait's bound: only a run that does not get there (or does not stop) reaches it


class Run:
    """`horizonrl train ARGS --quiet` in a subprocess (started by the `spawn` fixture), its stderr read line by
    line as it comes."""

    def __init__(self, spawn, *args: str, **env: str):
        self.process = spawn([sys.executable, "-m", "horizonrl", "train", *args, "--quiet"],
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1", **env))
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stderr), daemon=True)
        self.reader.start()

    def wait_for(self, condition, timeout_s: float = BOUND_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert self.process.poll() is None, "".join(self.lines)
            assert time.monotonic() < deadline, "timed out:\n" + "".join(self.lines)
            time.sleep(0.02)

    def logged(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def ended(self) -> str:
        """Its whole stderr, once the process has ended. One still running after BOUND_S is killed (its exit
        status then says so)."""
        try:
            self.process.wait(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.reader.join(timeout=BOUND_S)
        return "".join(self.lines)


@pytest.mark.parametrize("recipe", [
    [RECIPE, *SMALL],                                                                       # task_warm_start
    [str(SOURCE_CONFIGS / "toy.yaml"), "model.warm_start.iterations=1", "device=cpu"],      # format_warm_start
])
def test_sigterm_while_the_warm_start_fine_tunes_ends_the_run_within_seconds(tmp_path, recipe, spawn):
    run = Run(spawn, *recipe, "model.warm_start.steps=1000000", f"output_dir={tmp_path}")
    run.wait_for(lambda: run.logged("warm start: 1000000 steps on"))
    run.process.send_signal(signal.SIGTERM)
    stderr = run.ended()
    assert run.process.returncode == 128 + signal.SIGTERM, stderr     # it stopped itself, long before its steps ended
    assert f"horizonrl: {STOPPED.format('SIGTERM')}\n" in stderr and "Traceback" not in stderr, stderr
    assert "saving a checkpoint" not in stderr and "SIGTERM: stopping the warm start within seconds" in stderr
    assert not list(tmp_path.iterdir())                          # no run folder


def test_sigint_while_the_teacher_plays_ends_the_run_within_seconds(tmp_path, spawn):
    """The teacher's tasks are played a batch at a time (group.n_tasks x group.group_size = 8 agent calls): the
    stop comes before the next batch. The agent holds the first batch until the run has taken the signal, then
    plays it; the tiny tokenizer's corpus alone takes 32 batches, and the run makes no call of the second."""
    calls, release = tmp_path / "calls", tmp_path / "release"
    run = Run(spawn, RECIPE, *SMALL, "task.agent=tests/integration/held_agents.py:held",
              f"output_dir={tmp_path / 'runs'}", CALLS=str(calls), RELEASE=str(release))
    run.wait_for(calls.exists)                                   # the first batch plays
    run.process.send_signal(signal.SIGINT)
    run.wait_for(lambda: run.logged("SIGINT: stopping the warm start within seconds"))
    release.touch()
    stderr = run.ended()
    assert run.process.returncode == 128 + signal.SIGINT, stderr
    assert calls.read_text().splitlines() == ["called"] * 8, stderr  # the first batch's calls, none of the second's
    assert f"horizonrl: {STOPPED.format('SIGINT')}\n" in stderr and "Traceback" not in stderr, stderr
    assert not (tmp_path / "runs").exists()


def test_sigterm_in_the_critic_warmup_ends_it_within_seconds_with_no_checkpoint(tmp_path, monkeypatch):
    """In this process: the signal comes from within the critic's 2nd pass (of 300, over its 2 batches; the run
    folder holds the initial policy by then), and the check before the next batch ends the warmup: no batch is
    scored after it. The 300 passes would take about a minute, then save iteration 0's checkpoint."""
    cfg = load_config(SOURCE_CONFIGS / "toy.yaml", [
        "model.warm_start.steps=20", "model.warm_start.iterations=1", "rollout.n_env=4", "ppo.e_len=4",
        "optim.mini_batch_size=8", "critic.warmup_batches=2", "critic.warmup_iters=300", "iterations=1",
        "device=cpu", f"output_dir={tmp_path}"])
    scored, score_batch = [], ppo.score_batch

    def signalling_score_batch(*args, **kwargs):
        scored.append(1)
        if len(scored) == 3:                                     # pass 2, its first batch
            os.kill(os.getpid(), signal.SIGTERM)
        return score_batch(*args, **kwargs)

    monkeypatch.setattr(ppo, "score_batch", signalling_score_batch)
    with pytest.raises(StoppedBeforeCheckpoint) as stopped:
        train(cfg, progress=False)
    assert len(scored) == 3                                      # stopped at the next check
    (run,) = tmp_path.iterdir()
    assert (run / "init" / "model.safetensors").is_file()
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
