"""BabaIsAI: Baba Is You rule-rewriting puzzles as a text environment.

`world` holds the grid and movement, `rules` reads rules from word blocks, `levels` builds the four
task families, `env` is the TextEnv, and `solver` searches levels for tests.
"""

from horizonrl.envs.babaisai.env import BabaIsAIEnv
from horizonrl.envs.babaisai.levels import TASKS

__all__ = ["BabaIsAIEnv", "TASKS"]
