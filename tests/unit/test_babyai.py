"""BabyAIEnv: protocol, the BabyAI bot's reward passing through, exact observation text (the bot solving
every seed of every task: tests/integration/test_babyai_bot.py)."""

from __future__ import annotations

import pytest
from minigrid.core.actions import Actions
from minigrid.core.world_object import Ball, Box, Door, Key, Wall
from minigrid.utils.baby_ai_bot import BabyAIBot

from horizonrl.agents.actions import decide
from horizonrl.envs.babyai import LEVELS, BabyAIEnv, describe
from horizonrl.envs.base import Instruction, TextEnv

TASKS = ["goto", "pickup", "open", "pick_up_seq_go_to", "putnext"]
# minigrid's action enum -> our action name, by the enum's member names
BOT_ACTION = {Actions.left: "turn left", Actions.right: "turn right", Actions.forward: "go forward",
              Actions.pickup: "pick up", Actions.drop: "drop", Actions.toggle: "toggle"}


def test_protocol_actions_and_instruction():
    env = BabyAIEnv("goto")
    assert isinstance(env, TextEnv)
    assert env.actions == ["turn left", "turn right", "go forward", "pick up", "drop", "toggle"]
    assert env.default_action == "go forward"
    assert set(env.translations.values()) <= set(env.actions)
    assert all(key == key.lower() for key in env.translations)
    _, info = env.reset(seed=3)
    instruction = env.instruction
    assert isinstance(instruction, Instruction)
    assert instruction.intro == "You are an agent playing a simple navigation game"
    assert list(instruction.actions) == env.actions
    assert instruction.mission == info["mission"] == env.unwrapped.mission
    assert instruction.mission.startswith("go to the ")
    assert instruction.tips
    assert decide("ACTION: Move forward.", env.actions, env.default_action, env.translations).action == "go forward"
    assert decide("ACTION: open door", env.actions, env.default_action, env.translations).action == "toggle"


def test_task_table_and_limits():
    assert list(LEVELS) == TASKS
    limits = {task: BabyAIEnv(task).unwrapped.max_steps for task in TASKS}
    assert limits == {"goto": 64, "pickup": 64, "open": 128, "pick_up_seq_go_to": 128, "putnext": 128}
    env = BabyAIEnv("putnext", max_steps=7)
    env.reset(seed=0)
    assert env.unwrapped.max_steps == 7    # fixed: minigrid does not recompute it on reset


def test_minigrid_reward_passes_through():
    env = BabyAIEnv("goto", binary_reward=False)
    env.reset(seed=5)
    bot = BabyAIBot(env.unwrapped)
    terminated = False
    while not terminated:
        _, reward, terminated, _, info = env.step(BOT_ACTION[Actions(bot.replan())])
    steps = env.unwrapped.step_count
    assert info["success"] and reward == pytest.approx(1 - 0.9 * steps / 64)


def _scene() -> BabyAIEnv:
    """GoToObj's 8x8 room (walls at x, y in {0, 7}) emptied, then furnished by hand; the agent stands at
    (4, 5) facing up (-y), so its right is +x, and carries a grey key."""
    env = BabyAIEnv("goto")
    env.reset(seed=0)
    world = env.unwrapped
    for x in range(1, 7):
        for y in range(1, 7):
            world.grid.set(x, y, None)
    world.grid.set(4, 3, Ball("red"))        # 2 ahead
    world.grid.set(3, 4, Key("blue"))        # 1 left, 1 ahead
    world.grid.set(6, 3, Box("purple"))      # 2 right, 2 ahead
    world.grid.set(7, 2, Door("green"))      # in the right wall: 3 right, 3 ahead
    world.agent_pos, world.agent_dir = (4, 5), 3
    world.carrying = Key("grey")
    return env


def test_observation_text_hand_checked():
    env = _scene()
    world = env.unwrapped
    # the red ball hides the wall ahead; the left wall (x = 0) is 4 steps away, out of view
    assert describe(world).splitlines() == [
        "a blue key 1 step left and 1 step forward",
        "a red ball 2 steps forward",
        "a wall 3 steps right",
        "a purple box 2 steps right and 2 steps forward",
        "a closed green door 3 steps right and 3 steps forward",
        "You carry a grey key",
    ]
    text, *_ = env.step("turn right")        # now facing +x; the blue key is behind, out of view
    assert text.splitlines() == [
        "a red ball 2 steps left",
        "a wall 2 steps right",
        "a wall 3 steps forward",
        "a purple box 2 steps left and 2 steps forward",
        "a closed green door 3 steps left and 3 steps forward",
        "You carry a grey key",
    ]
    door = world.grid.get(7, 2)
    door.is_open = True
    assert "an open green door 3 steps left and 3 steps forward" in describe(world).splitlines()
    door.is_open, door.is_locked = False, True
    assert "a locked green door 3 steps left and 3 steps forward" in describe(world).splitlines()
    world.carrying = None
    assert not any(line.startswith("You carry") for line in describe(world).splitlines())


def test_walls_block_the_view():
    env = _scene()
    world = env.unwrapped
    world.carrying = None
    for x in range(1, 7):                    # a wall across the room right in front of the agent
        world.grid.set(x, 4, Wall())
    assert describe(world).splitlines() == ["a wall 1 step forward", "a wall 3 steps right"]


def test_pick_up_then_carry_is_reported():
    env = _scene()
    world = env.unwrapped
    world.carrying = None
    world.grid.set(4, 4, Ball("yellow"))
    text, reward, terminated, truncated, _ = env.step("pick up")
    assert world.carrying is not None and text.splitlines()[-1] == "You carry a yellow ball"
    assert "a red ball 2 steps forward" in text.splitlines()


def test_bad_task_and_bad_action():
    with pytest.raises(ValueError, match="pick_up_seq_go_to"):
        BabyAIEnv("fly")
    env = BabyAIEnv("open")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="go forward"):
        env.step("jump")


def test_minigrids_rejected_layouts_stay_off_stdout(capsys):
    env = BabyAIEnv("putnext")
    env.unwrapped.reset(seed=4)          # minigrid alone: putnext's seed 4 rejects a layout first
    assert capsys.readouterr().out == "Sampling rejected: unreachable object at (6, 1)\n"
    observation, _ = env.reset(seed=4)
    assert capsys.readouterr().out == ""
    assert observation == describe(env.unwrapped)


@pytest.mark.parametrize("task", TASKS)
def test_seeds_are_deterministic_and_differ(task):
    def episodes(env):
        return [(env.reset(seed=seed)[0], env.instruction.mission) for seed in range(8)]

    env = BabyAIEnv(task)
    first = episodes(env)
    assert episodes(BabyAIEnv(task)) == first == episodes(env)
    assert len(set(first)) > 1
    env.reset(seed=1)
    after = [env.step(action)[0] for action in ["turn left", "go forward", "turn right"]]
    env.reset(seed=1)
    assert [env.step(action)[0] for action in ["turn left", "go forward", "turn right"]] == after


def test_truncation_at_max_steps():
    env = BabyAIEnv("pickup", max_steps=3)
    env.reset(seed=0)
    for turn in range(3):
        _, reward, terminated, truncated, info = env.step("turn left")
        assert not terminated and reward == 0.0
        assert truncated == (turn == 2)
    assert info["success"] is False and info["progress"] == 0.0
    assert env.unwrapped.step_count == env.unwrapped.max_steps == 3


def test_state_key_follows_position_direction_and_grid():
    env = BabyAIEnv("pickup")
    env.reset(3)
    start = env.state_key()
    env.step("turn left")
    turned = env.state_key()
    for _ in range(3):
        env.step("turn left")
    assert turned != start and env.state_key() == start      # four left turns: the same state again
