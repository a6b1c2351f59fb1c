"""Every registered env keeps the TextEnv contract the agent and the collector rely on."""

import random

import pytest
from optional_packages import skip_unless_installed  # tests/integration is on sys.path under pytest

from horizonrl import envs
from horizonrl.envs.base import TextEnv

BUILT_IN = sorted(i for i, spec in envs.REGISTRY.items() if str(spec.factory).startswith("horizonrl."))


@pytest.mark.parametrize("env_id", BUILT_IN)
def test_contract(env_id):
    skip_unless_installed(env_id)
    env = envs.make(env_id)
    assert isinstance(env, TextEnv)
    first, _ = env.reset(11)
    assert isinstance(first, str) and first
    assert env.default_action in env.actions and set(env.actions) <= set(env.instruction.actions)
    assert all(value in env.actions or env_id.startswith("textworld") for value in env.translations.values())
    assert env.unwrapped is not None
    rng = random.Random(0)
    for _ in range(5):
        observation, reward, terminated, truncated, info = env.step(rng.choice(env.actions))
        assert isinstance(observation, str) and isinstance(reward, float)
        if terminated or truncated:
            assert isinstance(info["success"], bool) and 0.0 <= info["progress"] <= 1.0
            break
    assert envs.make(env_id).reset(11)[0] == first          # same seed, same start
