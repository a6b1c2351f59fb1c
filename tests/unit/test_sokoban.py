"""Sokoban: moves and pushes by hand, rooms from seeds (solvable, no global RNG), the expert's shortest solutions."""

import random

import pytest

from horizonrl import envs
from horizonrl.envs.sokoban import Room, Sokoban, generate_room, push, solve
from horizonrl.rollout.seeds import validation_seeds

#   ######
#   #_O__#        a hand-made room: a target at (1, 2) and (3, 3), boxes at (2, 2) and (3, 2), the player at (3, 1)
#   #__X_#
#   #PXO_#
#   ######
WALLS = frozenset({(0, c) for c in range(6)} | {(4, c) for c in range(6)} | {(r, 0) for r in range(5)}
                  | {(r, 5) for r in range(5)})
TARGETS = frozenset({(1, 2), (3, 3)})
BOXES = frozenset({(2, 3), (3, 2)})


def hand_made() -> Sokoban:
    env = Sokoban(size=6, boxes=2, max_steps=10)
    env.room = Room(WALLS | {(5, c) for c in range(6)}, TARGETS, (3, 1), BOXES, 6)
    env.player, env.box_cells = env.room.player, env.room.boxes
    return env


def test_the_room_is_drawn_in_the_fields_symbols():
    assert hand_made().render() == "######\n#_O__#\n#__X_#\n#PXO_#\n######\n######\nBoxes on targets: 0 of 2."


def test_surroundings_say_what_each_move_meets_and_where_boxes_and_targets_lie():
    env = hand_made()
    env.surroundings_shown = True                     # Sokoban(surroundings=True)
    assert env.render().splitlines()[-2:] == [
        "Around you: up floor, down wall, left wall, right box.",
        "Boxes: 1 up and 2 right of you; 1 right of you. Targets: 2 up and 1 right of you; 2 right of you."]
    observation = env.step("right")[0]                # box (3, 2) onto target (3, 3); the player to (3, 2)
    assert observation.splitlines()[-2:] == [
        "Around you: up floor, down wall, left floor, right box.",
        "Boxes: 1 up and 1 right of you; 1 right of you. Targets: 2 up of you; 1 right of you."]
    env.player = (1, 2)                               # on a target
    assert env.render().endswith("Targets: here; 2 down and 1 right of you.")
    assert "Around you" not in envs.make("sokoban/6x6-1box").reset(0)[0]


def test_moves_pushes_and_what_changes_nothing():
    assert push(WALLS, (3, 1), BOXES, "left") == ((3, 1), BOXES)                  # into a wall
    assert push(WALLS, (3, 1), BOXES, "up") == ((2, 1), BOXES)                    # a walk
    assert push(WALLS, (3, 1), BOXES, "right") == ((3, 2), frozenset({(2, 3), (3, 3)}))   # a push onto a target
    assert push(WALLS, (1, 3), BOXES, "down") == ((2, 3), frozenset({(3, 3), (3, 2)}))
    assert push(WALLS, (2, 4), BOXES, "left") == ((2, 3), frozenset({(2, 2), (3, 2)}))
    assert push(WALLS, (2, 2), BOXES, "down") == ((2, 2), BOXES)                  # (3, 2) pushed into the wall
    in_line = frozenset({(2, 3), (3, 3)})
    assert push(WALLS, (1, 3), in_line, "down") == ((1, 3), in_line)              # a box pushed into a box


def test_success_progress_and_state_keys():
    env = hand_made()
    observation, reward, terminated, truncated, info = env.step("right")          # box (3, 2) onto target (3, 3)
    assert "S" not in observation and "√" in observation and "Boxes on targets: 1 of 2." in observation
    assert (reward, terminated, truncated, "success" in info) == (0.0, False, False, False)
    key = env.state_key()
    env.step("left")                                                              # back: the box stays
    env.step("right")
    assert env.state_key() == key
    moves = solve(env.room.walls, env.room.targets, env.player, env.box_cells)   # box (2, 3) to target (1, 2)
    for move in moves:
        observation, reward, terminated, truncated, info = env.step(move)
    assert (reward, terminated, info["success"], info["progress"]) == (1.0, True, True, 1.0)


def test_a_step_limit_truncates_with_the_share_of_boxes_placed():
    env = hand_made()
    env.step("right")
    for _ in range(9):
        *_, terminated, truncated, info = env.step("left")
    assert (terminated, truncated, info["success"], info["progress"]) == (False, True, False, 0.5)


@pytest.mark.parametrize("boxes", [1, 2])
def test_a_seed_makes_one_solvable_room_without_touching_the_global_rngs(boxes):
    random.seed(7)
    state = random.getstate()
    rooms = [generate_room(6, boxes, seed, min_solution_moves=5) for seed in range(20)]
    assert random.getstate() == state
    again = generate_room(6, boxes, 3, min_solution_moves=5)
    assert (again.walls, again.targets, again.player, again.boxes) == \
        (rooms[3].walls, rooms[3].targets, rooms[3].player, rooms[3].boxes)
    assert len({(r.walls, r.targets, r.player, r.boxes) for r in rooms}) == 20
    for room in rooms:
        assert {(0, c) for c in range(6)} <= room.walls and len(room.boxes) == len(room.targets) == boxes
        assert len(solve(room.walls, room.targets, room.player, room.boxes)) >= 5


@pytest.mark.parametrize("env_id", ["sokoban/6x6-1box", "sokoban/6x6-2box"])
def test_the_expert_solves_validation_rooms_in_the_fewest_moves(env_id):
    env = envs.make(env_id)
    for seed in validation_seeds(30):
        env.reset(seed)
        shortest = len(solve(env.room.walls, env.room.targets, env.player, env.box_cells))
        terminated = truncated = False
        while not (terminated or truncated):
            action, reason = env.expert_action()
            _, reward, terminated, truncated, info = env.step(action)
        assert info["success"] and env.steps == shortest, (seed, reason)


def test_the_moves_a_noisy_demonstration_may_take_change_the_room_and_leave_it_solvable():
    """sft.expert_noise: a third of the steps take a random other move of expert_recovers_from(); every such move
    changes the room and leaves it solvable, so the expert, searching again from there, solves every validation
    room. With every move allowed, a box ends stuck against a wall and the room unsolved."""
    env = hand_made()
    assert env.expert_recovers_from() == ["up", "right"]          # down and left: walls
    env.player = (2, 2)                  # right pushes box (2, 3) against the right wall, off both targets' lines
    assert env.expert_recovers_from() == ["up", "left"]           # down: box (3, 2) into the wall
    env.box_cells = frozenset({(1, 1), (3, 3)})                   # (1, 1) in a corner: nothing recovers
    assert env.expert_recovers_from() == []
    env, rng = envs.make("sokoban/6x6-1box"), random.Random(0)
    env.max_steps = 200
    for seed in validation_seeds(40):
        env.reset(seed)
        terminated = truncated = False
        while not (terminated or truncated):
            action, _ = env.expert_action()
            others = [move for move in env.expert_recovers_from() if move != action]
            if others and rng.random() < 1 / 3:
                action = rng.choice(others)
            _, _, terminated, truncated, info = env.step(action)
        assert info["success"], seed
