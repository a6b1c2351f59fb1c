"""A reward function that raises on rank 1 of a torchrun job (a planted failure for the tests)."""

import os


def reward_fails_on_rank_1(episode) -> float:
    if os.environ.get("RANK") == "1":
        raise RuntimeError("planted failure on rank 1")
    return sum(turn.reward for turn in episode.turns)
