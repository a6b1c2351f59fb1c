"""The BabyAI bot solves every one of 100 seeds of every task through BabyAIEnv's text actions (the
bot plans every step: seconds per task)."""

import pytest
from minigrid.core.actions import Actions
from minigrid.utils.baby_ai_bot import BabyAIBot

from horizonrl.envs.babyai import BabyAIEnv

TASKS = ["goto", "pickup", "open", "pick_up_seq_go_to", "putnext"]
# minigrid's action enum -> our action name, by the enum's member names
BOT_ACTION = {Actions.left: "turn left", Actions.right: "turn right", Actions.forward: "go forward",
              Actions.pickup: "pick up", Actions.drop: "drop", Actions.toggle: "toggle"}


@pytest.mark.parametrize("task", TASKS)
def test_bot_solves_every_seed_through_text_actions(task):
    env = BabyAIEnv(task)
    solved = 0
    for seed in range(100):
        env.reset(seed=seed)
        bot = BabyAIBot(env.unwrapped)
        terminated = truncated = False
        while not (terminated or truncated):
            _, reward, terminated, truncated, info = env.step(BOT_ACTION[Actions(bot.replan())])
        assert reward == float(info["success"]) and info["progress"] == float(info["success"])
        solved += info["success"]
    assert solved == 100
