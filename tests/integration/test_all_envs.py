"""Every registered env keeps the TextEnv contract the agent and the collector rely on."""

import asyncio
import importlib.util
import random

import pytest
from alfworld_games import write_games  # tests/integration is on sys.path under pytest
from optional_packages import skip_unless_installed

from horizonrl import envs
from horizonrl.envs.base import TextEnv
from horizonrl.envs.pool import WorkerEnv

# GEM's hard Sokoban is its easy Sokoban in a larger room, whose generation searches up to 300,000 states: 0.2-10 s
# a reset on the 2-core development CPU (tests/integration/test_gem.py plays it)
BUILT_IN = sorted(i for i, spec in envs.REGISTRY.items()
                  if str(spec.factory).startswith("horizonrl.") and i != "gem:Sokoban-v0-hard")
# the GEM games share one class (envs/gem_env.py): 2048, which draws from its random streams while it plays,
# stands for all of them in a worker process (each worker imports gem: ~3 s of CPU)
IN_WORKERS = [i for i in BUILT_IN if not i.startswith("gem:")] + ["gem:Game2048-v0-easy"]
# envs whose seeds 11 and 12 start alike: TextArena's boards and Nim's piles start from one position whatever the
# seed, and its 3-round Kuhn poker deals the first player the same card at these two seeds
SAME_START_AT_11_AND_12 = {"textarena:TicTacToe-v0", "textarena:ConnectFour-v0", "textarena:Nim-v0",
                           "textarena:KuhnPoker-v0"}


@pytest.fixture(autouse=True)
def alfworld_games(request, tmp_path, monkeypatch):
    """ALFWorld plays games no package installs: here, the ones alfworld_games.py writes."""
    if request.node.callspec.params.get("env_id") == "alfworld" and importlib.util.find_spec("alfworld"):
        monkeypatch.setenv("ALFWORLD_DATA", str(write_games(tmp_path)))


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


@pytest.mark.parametrize("env_id", BUILT_IN)
def test_state_key_names_the_state_the_same_way_in_every_env_and_process(env_id):
    """Same seed and actions -> same key, in a fresh env and in a worker process (GiGPO compares keys from
    every env handle and rank); a key is a short string."""
    skip_unless_installed(env_id)
    actions = []
    env = envs.make(env_id)
    env.reset(11)
    keys = [env.state_key()]
    rng = random.Random(1)
    for _ in range(4):
        actions.append(rng.choice(env.actions))
        *_, terminated, truncated, _ = env.step(actions[-1])
        keys.append(env.state_key())
        if terminated or truncated:
            break
    assert all(isinstance(key, str) and len(key) == 32 for key in keys)
    other = envs.make(env_id)
    other.reset(12)
    assert (other.state_key() == keys[0]) == (env_id in SAME_START_AT_11_AND_12)    # another seed, another start
    if env_id not in IN_WORKERS:
        return
    worker = WorkerEnv(env_id, {})
    try:
        asyncio.run(worker.reset(11))
        replayed = [worker.state_key]
        for action in actions:
            asyncio.run(worker.step(action))
            replayed.append(worker.state_key)
    finally:
        worker.close()
    assert replayed == keys
