"""gymnasium's FrozenLake as a text env, the way a user plugs in their own gymnasium env."""

import gymnasium

from horizonrl.envs.base import Instruction
from horizonrl.envs.gymnasium_env import GymnasiumTextEnv

LAKE = Instruction(
    intro="You are an agent crossing a frozen lake",
    mission="reach the goal without falling into a hole",
    actions={"left": "move one cell left", "down": "move one cell down", "right": "move one cell right",
             "up": "move one cell up"},
)


def make_lake(**kwargs) -> GymnasiumTextEnv:
    env = gymnasium.make("FrozenLake-v1", is_slippery=False, **kwargs)
    width = env.unwrapped.ncol
    return GymnasiumTextEnv(env, LAKE, describe=lambda s: f"You are at row {s // width}, column {s % width}.",
                            translations={"go down": "down"})
