import random

import pytest

from horizonrl import envs
from horizonrl.envs.base import TextEnv


def play(env, policy, seed):
    obs, _ = env.reset(seed)
    steps = 0
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(env, obs))
        steps += 1
        if terminated or truncated:
            return info["success"], steps, terminated, truncated, reward


def optimal(env, obs):
    return "jump left" if obs.endswith("to your left.") else "jump right"


def test_is_a_text_env():
    env = envs.make("river")
    assert isinstance(env, TextEnv)
    assert env.actions == ["jump left", "jump right", "wait"] and env.default_action == "wait"
    assert set(env.instruction.actions) == set(env.actions)


def test_reading_the_observation_crosses_in_five_turns():
    env = envs.make("river")
    for seed in range(200):
        assert play(env, optimal, seed) == (True, 5, True, False, 1.0)


def test_random_play_succeeds_under_twenty_percent():
    env = envs.make("river")
    rng = random.Random(0)
    results = [play(env, lambda e, o: rng.choice(e.actions), seed)[0] for seed in range(4000)]
    rate = sum(results) / len(results)
    assert 0.06 < rate < 0.2, rate   # about 0.12


def test_no_fixed_action_crosses_reliably():
    env = envs.make("river")
    for action in env.actions:
        rate = sum(play(env, lambda e, o: action, seed)[0] for seed in range(400)) / 400  # noqa: B023 (played now)
        assert rate < 0.1, (action, rate)


def test_episode_limit_truncates_without_reward():
    env = envs.make("river", max_steps=7)
    assert play(env, lambda e, o: "wait", 3) == (False, 7, False, True, 0.0)


def test_observations_by_hand():
    env = envs.make("river", stones=2)
    env.reset(0)
    env.sides = ["left", "right"]
    assert env._observation() == "You are on the bank.\nThe next stone is to your left."
    obs, reward, terminated, _, info = env.step("jump left")
    assert obs == "You are on stone 1 of 2.\nThe far bank is to your right." and reward == 0.0 and not terminated
    assert info == {"metrics": {"correct_jump": 1.0}}
    obs, _, _, _, info = env.step("jump left")
    assert obs == ("You fell into the river and swam back to the bank.\nYou are on the bank.\n"
                   "The next stone is to your left.")
    assert info["metrics"] == {"correct_jump": 0.0}
    obs, _, _, _, info = env.step("wait")
    assert info == {"metrics": {}} and env.position == 0
    env.step("jump left")
    obs, reward, terminated, truncated, info = env.step("jump right")
    assert (obs, reward, terminated, truncated) == ("You reached the far bank.", 1.0, True, False)
    assert info["success"] and info["progress"] == 1.0


def test_unknown_env_and_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="unknown env 'nope'; known envs: .*river"):
        envs.make("nope")
    with pytest.raises(ValueError, match="stones <= max_steps"):
        envs.make("river", stones=5, max_steps=3)
    with pytest.raises(ValueError, match="unknown action 'fly'"):
        envs.make("river").step("fly")


def test_state_key_is_the_stone_the_agent_stands_on():
    env = envs.make("river", stones=3, max_steps=10)
    env.reset(0)
    bank = env.state_key()
    env.step(f"jump {env.sides[0]}")
    on_stone = env.state_key()
    env.step("wait")
    assert on_stone != bank and env.state_key() == on_stone
    wrong = {"left": "right", "right": "left"}[env.sides[1]]
    env.step(f"jump {wrong}")                                     # in the river, back to the bank
    assert env.state_key() == bank
