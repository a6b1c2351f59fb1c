"""FrozenLake: a random map per seed (gymnasium's generator), the map as text, holes and the goal, the expert."""

import random

import numpy as np
import pytest

from horizonrl import envs
from horizonrl.envs.frozenlake import FrozenLake
from horizonrl.rollout.seeds import validation_seeds


def test_a_seed_draws_one_map_without_touching_the_global_rngs():
    lake = FrozenLake(size=4)
    random.seed(1)
    np.random.seed(1)
    states = random.getstate(), np.random.get_state()[1].copy()
    first = lake.reset(3)[0]
    assert random.getstate() == states[0] and (np.random.get_state()[1] == states[1]).all()
    maps = set()
    for seed in range(20):
        lake.reset(seed)
        maps.add(tuple(lake.map))
    assert len(maps) > 10
    assert lake.reset(3)[0] == first


def hand_made(surroundings: bool = False) -> FrozenLake:
    """A map by hand, played by gymnasium's own env."""
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

    lake = FrozenLake(size=4, surroundings=surroundings)
    lake.reset(0)
    lake.map = ["SFHF", "FHFF", "FFFF", "HFFG"]
    lake.lake = FrozenLakeEnv(desc=lake.map, is_slippery=False)
    lake.lake.reset(seed=0)
    return lake


def test_the_map_as_text_and_a_walk_into_a_hole():
    lake = hand_made()
    assert lake.render() == "P_O_\n_O__\n____\nO__G"
    assert lake.step("up")[1:4] == (0.0, False, False)   # the edge: stays
    assert lake.render().startswith("P")
    observation, reward, terminated, truncated, info = lake.step("right")
    observation, reward, terminated, truncated, info = lake.step("down")
    assert observation == "__O_\n_X__\n____\nO__G"
    assert (reward, terminated, info["success"], info["progress"]) == (0.0, True, False, 0.0)


def test_surroundings_and_the_experts_reason_read_the_cells_around():
    lake = hand_made(surroundings=True)
    assert lake.render() == "P_O_\n_O__\n____\nO__G\nAround you: left edge, down ice, right ice, up edge."
    assert lake.expert_action() == ("down", "around me: left edge, down ice, right ice, up edge; "   # BFS: down first
                                            "6 moves to the goal: down, down, right, down, right, right")
    observation = lake.step("right")[0]
    assert observation.endswith("Around you: left ice, down hole, right hole, up edge.")
    assert "Around you" not in envs.make("frozenlake/4x4").reset(0)[0]


@pytest.mark.parametrize("env_id", ["frozenlake/4x4", "frozenlake/8x8"])
def test_the_expert_reaches_the_goal_of_validation_maps_in_the_fewest_moves(env_id):
    lake = envs.make(env_id)
    for seed in validation_seeds(40):
        lake.reset(seed)
        shortest = len(lake.shortest_path())
        assert shortest >= 2 * (lake.size - 1)               # start (0, 0), goal in the far corner
        terminated = truncated = False
        while not (terminated or truncated):
            observation, reward, terminated, truncated, info = lake.step(lake.expert_action()[0])
        assert info["success"] and observation.endswith("√") and lake.steps == shortest


def test_a_slippery_lake_slides_some_moves_and_stays_reproducible():
    def walk(seed):
        lake = FrozenLake(size=8, slippery=True)
        lake.reset(seed)
        cells = []
        for _ in range(30):
            lake.step("right")
            cells.append(lake.position)
            if lake.lake.desc[cells[-1]] in (b"H", b"G"):
                break
        return cells
    assert walk(5) == walk(5)
    runs = [walk(seed) for seed in range(10)]
    assert any(cell[0] > 0 for cells in runs for cell in cells)   # "right" only: a row below is a slide
