from collections import deque

import numpy as np
import pytest

crafter = pytest.importorskip("crafter")
from crafter import constants  # noqa: E402

from horizonrl.envs.base import TextEnv  # noqa: E402
from horizonrl.envs.crafter import ACHIEVEMENTS, CrafterEnv, _where  # noqa: E402

# Semantic map ids, as crafter numbers them: 0 is off the map, then its materials, then its object kinds.
SEMANTIC_NAMES = [None, *constants.materials, "player", "cow", "zombie", "skeleton", "arrow", "plant"]
STEP = {"Move West": (-1, 0), "Move East": (1, 0), "Move North": (0, -1), "Move South": (0, 1)}


@pytest.fixture(scope="module")
def env():
    env = CrafterEnv()
    env.reset(0)
    return env


def kinds_in_view(semantic, pos, window):
    """Kinds crafter's semantic map shows in the drawn window around `pos`, the player's own cell excluded."""
    (width, height), (x, y) = window, pos
    kinds = set()
    for dx in range(-(width // 2), width - width // 2):
        for dy in range(-(height // 2), height - height // 2):
            if (dx or dy) and 0 <= x + dx < semantic.shape[0] and 0 <= y + dy < semantic.shape[1]:
                kinds.add(SEMANTIC_NAMES[semantic[x + dx, y + dy]])
    return kinds - {None}


def seen_kinds(observation):
    lines = observation.split("\n")
    return {line[2:].split(" ")[0] if not line.startswith("- ripe plant") else "plant"
            for line in lines if line.startswith("- ")}


def first_step_toward_tree(world, start):
    """The move that starts a shortest walk to a cell next to a tree, or the turn to face an adjacent tree."""
    for action, (dx, dy) in STEP.items():
        if world[(start[0] + dx, start[1] + dy)][0] == "tree":
            return action
    queue, first = deque([tuple(start)]), {tuple(start): None}
    while queue:
        x, y = queue.popleft()
        for action, (dx, dy) in STEP.items():
            nxt = (x + dx, y + dy)
            material, obj = world[nxt]
            if material == "tree" and (x, y) != tuple(start):
                return first[(x, y)]
            if nxt not in first and material in constants.walkable and obj is None:
                first[nxt] = first[(x, y)] or action
                queue.append(nxt)
    raise AssertionError("no reachable tree")


def test_is_a_text_env(env):
    assert isinstance(env, TextEnv)
    assert len(env.actions) == 17 and env.default_action == "Noop" and env.default_action in env.actions
    assert set(env.instruction.actions) == set(env.actions)
    assert all(value in env.actions and key == key.lower() for key, value in env.translations.items())
    assert env.translations["move left"] == "Move West" and env.translations["collect wood"] == "Do"
    assert env.translations["make table"] == "Place Table"


def test_each_action_is_the_crafter_action_of_that_name():
    expected = {"Noop": "noop", "Move West": "move_left", "Move East": "move_right", "Move North": "move_up",
                "Move South": "move_down", "Do": "do", "Sleep": "sleep"}
    env = CrafterEnv()
    env.reset(0)
    sent = []
    real_step = env.unwrapped.step
    env.unwrapped.step = lambda index: (sent.append(index), real_step(index))[1]
    for action in env.actions:
        env.step(action)
    for action, index in zip(env.actions, sent):
        name = expected.get(action, action.lower().replace(" ", "_"))
        assert constants.actions[index] == name, action
    with pytest.raises(ValueError, match="unknown action 'fly'"):
        env.step("fly")


def test_moves_go_the_named_way():
    env = CrafterEnv()
    env.reset(1)
    player, world = env.unwrapped._player, env.unwrapped._world
    for action, (dx, dy) in STEP.items():
        before = player.pos.copy()
        free = world[before + (dx, dy)][0] in constants.walkable and world[before + (dx, dy)][1] is None
        env.step(action)
        assert tuple(player.facing) == (dx, dy)
        if free:
            assert tuple(player.pos - before) == (dx, dy), action


def test_text_names_every_kind_in_view_and_nothing_else(env):
    assert env.window == tuple(env.unwrapped._local_view._grid)   # the window crafter draws
    assert {cls.__name__.lower(): i for cls, i in env.unwrapped._sem_view._obj_ids.items()} == {
        name: i for i, name in enumerate(SEMANTIC_NAMES) if i > len(constants.materials)}
    rng = np.random.default_rng(0)
    for _ in range(40):
        obs, *_ = env.step(str(rng.choice(env.actions[:5])))
        expected = kinds_in_view(env.unwrapped._sem_view(), env.unwrapped._player.pos, env.window)
        assert seen_kinds(obs) == expected, obs
        player = env.unwrapped._player
        assert f"health {player.health}, food {player.inventory['food']}" in obs


def test_directions_and_distances_by_hand():
    assert _where(0, 1) == "1 step to your south"
    assert _where(3, 0) == "3 steps to your east"
    assert _where(-2, -1) == "3 steps to your north-west (1 north, 2 west)"
    assert _where(1, 4) == "5 steps to your south-east (4 south, 1 east)"


def test_walking_to_a_tree_collects_wood_and_reports_crafter_achievements():
    env = CrafterEnv()
    obs, info = env.reset(0)
    assert info["achievements"] == [] and "collect_wood" in env.instruction.tips[-1]
    assert obs.endswith("Your inventory is empty.")
    world, player = env.unwrapped._world, env.unwrapped._player
    for _ in range(200):
        _, _, _, _, info = env.step(first_step_toward_tree(world, player.pos))
        target = world[player.pos + player.facing][0]
        if target == "tree":
            break
    total = 0.0
    for _ in range(10):
        obs, reward, terminated, truncated, info = env.step("Do")
        total += reward
        if "collect_wood" in info["achievements"]:
            break
    assert "collect_wood" in info["achievements"] and total >= 1.0
    assert info["achievements"] == sorted(name for name, n in player.achievements.items() if n > 0)
    assert "Inventory: wood 1." in obs
    assert "collect_wood" not in env.instruction.tips[-1] and "collect_coal" in env.instruction.tips[-1]


def test_same_seed_same_episode_other_seed_other_world():
    a, b = CrafterEnv(), CrafterEnv()
    assert a.reset(3)[0] == b.reset(3)[0]
    a.reset(3)   # a second reset with the same seed gives the same world again
    assert np.array_equal(a.unwrapped._world._mat_map, b.unwrapped._world._mat_map)
    rng = np.random.default_rng(1)
    for action in rng.choice(a.actions, 60):
        assert a.step(str(action))[0] == b.step(str(action))[0]
    b.reset(4)
    assert not np.array_equal(a.unwrapped._world._mat_map, b.unwrapped._world._mat_map)


def test_episode_ends_truncated_at_max_steps_and_terminated_at_death():
    env = CrafterEnv(max_steps=5)
    env.reset(0)
    for _ in range(4):
        _, _, terminated, truncated, info = env.step("Noop")
        assert not (terminated or truncated) and "success" not in info
    _, _, terminated, truncated, info = env.step("Noop")
    assert (terminated, truncated, info["success"], info["progress"]) == (False, True, False, 0.0)
    assert info["metrics"]["achievements"] == 0.0 and len(info["metrics"]) == 1 + len(ACHIEVEMENTS)
    env.reset(0)
    env.unwrapped._player.health = 0
    _, reward, terminated, truncated, info = env.step("Noop")
    assert terminated and not truncated and not info["success"] and reward < 0
