"""A user's gymnasium env (FrozenLake) plugged in as a TextEnv, through the registry and the pool."""

import asyncio

import gymnasium
import pytest

from horizonrl import envs
from horizonrl.envs.base import TextEnv
from horizonrl.envs.gymnasium_env import GymnasiumTextEnv
from horizonrl.envs.pool import WorkerEnv

from lake_env import LAKE  # noqa: E402  (tests/integration is on sys.path under pytest)

envs.register("lake", "lake_env:make_lake", "FrozenLake through GymnasiumTextEnv")


def test_walking_the_safe_path_wins():
    env = envs.make("lake")
    assert isinstance(env, TextEnv) and env.actions == ["left", "down", "right", "up"]
    assert env.reset(0)[0] == "You are at row 0, column 0."
    for action in ["down", "down", "right", "right", "down"]:
        observation, reward, terminated, truncated, info = env.step(action)
        assert not terminated
    observation, reward, terminated, truncated, info = env.step("right")
    assert observation == "You are at row 3, column 3." and reward == 1.0 and terminated
    assert info["success"] is True and info["progress"] == 1.0


def test_falling_in_a_hole_is_a_failure():
    env = envs.make("lake")
    env.reset(0)
    env.step("right")
    _, reward, terminated, _, info = env.step("down")            # (1, 1) is a hole on the 4x4 map
    assert terminated and reward == 0.0 and info["success"] is False and info["progress"] == 0.0


def test_runs_in_a_worker_process():
    worker = WorkerEnv("lake", {})
    try:
        assert asyncio.run(worker.reset(0))[0] == "You are at row 0, column 0."
        assert worker.translations == {"go down": "down"}
    finally:
        worker.close()


def test_mismatched_action_names_are_a_clear_error():
    with pytest.raises(ValueError, match="instruction names 4 actions but the env's Discrete space has 3"):
        GymnasiumTextEnv(gymnasium.make("MountainCar-v0"), LAKE)
