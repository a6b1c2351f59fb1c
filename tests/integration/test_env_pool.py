"""Env handles: worker processes, and recovery from envs that raise or hang."""

import asyncio
import os
import signal

import pytest

from horizonrl import envs
from horizonrl.agents.agent import Agent
from horizonrl.engines.base import SamplingParams
from horizonrl.engines.scripted import RandomFormatEngine
from horizonrl.envs.pool import EnvError, InProcessEnv, WorkerEnv, open_envs
from horizonrl.report.metrics import episode_metrics
from horizonrl.rollout.fixed_turn import FixedTurnCollector

envs.register("flaky-river", "flaky_envs:FlakyRiver", "a River that raises or hangs on chosen seeds")


def run(coroutine):
    return asyncio.run(coroutine)


HANG_S = 1.0      # the clock of the call that hangs


@pytest.fixture
def clock_only_on_the_hang(monkeypatch):
    """Worker handles whose calls have a generous 60 s, except the one that hangs (flaky-river's 2nd step after a
    reset to its `hang_seed`), which has HANG_S: only the hang runs out of time, never a slow but correct call
    of a loaded machine."""
    reset, step = WorkerEnv.reset, WorkerEnv.step

    async def counted_reset(self, seed):
        self.reset_seed, self.steps = seed, 0
        return await reset(self, seed)

    async def clocked_step(self, action):
        self.steps += 1
        self.timeout_s = HANG_S if (self.reset_seed, self.steps) == (self.kwargs.get("hang_seed"), 2) else 60.0
        return await step(self, action)

    monkeypatch.setattr(WorkerEnv, "reset", counted_reset)
    monkeypatch.setattr(WorkerEnv, "step", clocked_step)


def test_worker_env_steps_like_the_env_in_process():
    worker, local = WorkerEnv("river", {"stones": 3}), envs.make("river", stones=3)
    try:
        assert run(worker.reset(4)) == local.reset(4)
        for action in ["jump left", "wait", "jump right"]:
            assert run(worker.step(action)) == local.step(action)
        assert worker.actions == local.actions and worker.instruction == local.instruction
        assert worker.translations == local.translations and worker.process.is_alive()
    finally:
        worker.close()
    assert not worker.process.is_alive()


def test_a_worker_outlives_the_signals_that_stop_a_run():
    """Ctrl-C and batch schedulers signal the whole process group; the run, not its workers, decides
    when to stop (after saving a checkpoint)."""
    worker = WorkerEnv("river", {"stones": 3})
    try:
        run(worker.reset(4))
        for signum in (signal.SIGINT, signal.SIGTERM):
            os.kill(worker.process.pid, signum)
        run(worker.step("wait"))
        assert worker.process.is_alive() and worker.errors == 0
    finally:
        worker.close()


@pytest.mark.parametrize("handle", ["worker", "inline"])
def test_an_env_that_raises_is_rebuilt_and_counted(handle):
    kwargs = {"crash_seed": 7}
    env = WorkerEnv("flaky-river", kwargs) if handle == "worker" else InProcessEnv("flaky-river", kwargs)
    try:
        run(env.reset(7))
        run(env.step("wait"))
        with pytest.raises(EnvError, match="simulator exploded"):
            run(env.step("wait"))
        assert env.errors == 1
        observation, _ = run(env.reset(8))     # the rebuilt env works
        assert "bank" in observation
    finally:
        env.close()


def test_a_hanging_worker_is_killed_after_the_timeout(clock_only_on_the_hang):
    """The env hangs for 600 s: the error naming the time limit is the timeout's, not the hang's end."""
    env = WorkerEnv("flaky-river", {"hang_seed": 3})
    try:
        run(env.reset(3))
        run(env.step("wait"))
        old_pid = env.process.pid
        with pytest.raises(EnvError, match="no answer after 1 s"):
            run(env.step("wait"))
        assert env.errors == 1 and env.process.pid != old_pid and env.process.is_alive()
        run(env.reset(4))
    finally:
        env.close()


def test_a_worker_that_cannot_build_its_env_is_one_clear_error():
    with pytest.raises(ValueError, match="could not be built in a worker: ValueError: need 1 <= stones"):
        WorkerEnv("river", {"stones": 0})


def test_collector_recovers_crashed_and_hung_streams_while_the_others_keep_stepping(river_tiny,
                                                                                  clock_only_on_the_hang):
    tokenizer, _ = river_tiny
    # collector seed 0: stream i starts on env seed i, so stream 0 crashes and stream 1 hangs at their 2nd step
    handles = open_envs("flaky-river", {"crash_seed": 0, "hang_seed": 1, "max_steps": 30}, 4, workers=True,
                        timeout_s=60.0)
    try:
        engine = RandomFormatEngine(tokenizer, handles[0].actions, seed=0)
        collector = FixedTurnCollector(handles, Agent(tokenizer), engine, SamplingParams(), 4)
        episodes = collector.collect()
    finally:
        for handle in handles:
            handle.close()
    assert len(collector.errors) == 2
    assert any("simulator exploded" in e for e in collector.errors)
    assert any("no answer after 1 s" in e for e in collector.errors)
    turns_per_stream = {}
    for episode in episodes:
        stream = int(episode.episode_id.rsplit("seed", 1)[1]) % 4
        turns_per_stream[stream] = turns_per_stream.get(stream, 0) + len(episode.turns)
    assert turns_per_stream[2] == turns_per_stream[3] == 4      # healthy streams lost nothing
    assert turns_per_stream[0] == turns_per_stream[1] == 3      # the failed turn's sample is dropped
    closed = [e for e in episodes if "error" in e.metrics]
    assert {e.seed for e in closed} == {0, 1}
    for episode in closed:
        assert episode.turns[-1].truncated and "error" in episode.turns[-1].info
        assert episode.bootstrap_prompt_ids                     # bootstrapped, not a failure
    metrics = episode_metrics(episodes)
    assert metrics["env/errored_episodes"] == 2
