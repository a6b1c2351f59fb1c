"""Planted failures on rank 1 of a torchrun job, for the tests: a reward function that raises, and
`python failing.py ARGS` = `horizonrl train ARGS` with the env `river-broken-on-rank-1` registered (a
River whose every step fails on rank 1)."""

import os
import sys

from horizonrl import envs
from horizonrl.envs.river import River


def reward_fails_on_rank_1(episode) -> float:
    if os.environ.get("RANK") == "1":
        raise RuntimeError("planted failure on rank 1")
    return sum(turn.reward for turn in episode.turns)


class RiverBrokenOnRank1(River):
    def step(self, action: str):
        if os.environ.get("RANK") == "1":
            raise RuntimeError("planted env failure on rank 1")
        return super().step(action)


if __name__ == "__main__":
    from horizonrl.cli import main

    envs.register("river-broken-on-rank-1", RiverBrokenOnRank1, "a River whose every step fails on rank 1")
    sys.exit(main(["train", *sys.argv[1:]]))
