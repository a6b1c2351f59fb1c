import pytest

from horizonrl.envs.babaisai import TASKS, BabaIsAIEnv
from horizonrl.envs.babaisai.rules import Rule, parse_rules
from horizonrl.envs.babaisai.solver import solve
from horizonrl.envs.babaisai.world import World, obj, word
from horizonrl.envs.base import TextEnv

SEEDS = range(50)


def rules(world):
    return {str(rule) for rule in world.rules}


def cell_of(world, name):
    return next(e.cell for e in world.entities if e.name == name and not e.word)


def sentence(text, x, y, vertical=False):
    return [word(w, x + (0 if vertical else i), y + (i if vertical else 0)) for i, w in enumerate(text.split())]


def test_is_a_text_env():
    env = BabaIsAIEnv("goto_win-distr_obj")
    assert isinstance(env, TextEnv)
    assert env.actions == ["idle", "up", "right", "down", "left"] and env.default_action == "idle"
    assert set(env.instruction.actions) == set(env.actions)
    assert env.instruction.intro.startswith("You are an agent playing Baba Is You")
    assert all(action in env.actions and name == name.lower() for name, action in env.translations.items())
    for near_miss, action in {"move up": "up", "go left": "left", "wait": "idle", "north": "up",
                              "move to the right": "right", "south": "down"}.items():
        assert env.translations[near_miss] == action


@pytest.mark.parametrize("task", TASKS)
def test_levels_are_deterministic_per_seed_and_vary_across_seeds(task):
    env = BabaIsAIEnv(task)
    first = [env.reset(seed)[0] for seed in range(10)]
    assert first == [env.reset(seed)[0] for seed in range(10)]
    assert len(set(first)) >= 8
    assert env.reset(3)[1] == {}
    twin = BabaIsAIEnv(task)
    twin.reset(3)
    assert env.unwrapped.key() == twin.unwrapped.key()


def test_rules_read_left_to_right_or_top_to_bottom_only():
    assert parse_rules([("baba", (0, 0)), ("is", (1, 0)), ("you", (2, 0))]) == [Rule("baba", "you")]
    assert parse_rules([("key", (4, 1)), ("is", (4, 2)), ("win", (4, 3))]) == [Rule("key", "win")]
    assert parse_rules([("you", (0, 0)), ("is", (1, 0)), ("baba", (2, 0))]) == []        # right to left
    assert parse_rules([("baba", (0, 0)), ("is", (1, 1)), ("you", (2, 2))]) == []        # diagonal
    assert parse_rules([("baba", (0, 0)), ("is", (1, 0)), ("wall", (2, 0))]) == []       # no property
    shared = [("baba", (0, 0)), ("is", (1, 0)), ("you", (2, 0)), ("is", (0, 1)), ("win", (0, 2))]
    assert parse_rules(shared) == [Rule("baba", "you"), Rule("baba", "win")]


def walled_world():
    """A 6x4 grid: `wall is stop` on row 1, `baba is you` on row 3, baba at (3, 2) left of a wall."""
    return World(6, 4, sentence("wall is stop", 0, 1) + sentence("baba is you", 0, 3)
                 + [obj("baba", 3, 2), obj("wall", 4, 2)])


def test_stop_blocks_until_a_word_is_pushed_out_of_the_rule():
    world = walled_world()
    assert rules(world) == {"wall is stop", "baba is you"}
    world.move("right")
    assert cell_of(world, "baba") == (3, 2)                       # the wall stops baba
    world.move("left")
    world.move("up")                                              # pushes `stop` from (2, 1) to (2, 0)
    assert [e.cell for e in world.entities if e.name == "stop"] == [(2, 0)]
    assert rules(world) == {"baba is you"}
    for direction in ("down", "right", "right"):
        world.move(direction)
    assert cell_of(world, "baba") == (4, 2) and not world.won and not world.lost   # standing on the wall


def test_pushing_a_word_into_line_forms_a_rule_and_reaching_win_wins():
    world = World(5, 4, sentence("baba is you", 0, 3) + [word("door", 0, 0), word("is", 1, 0), word("win", 2, 1),
                                                           obj("baba", 2, 2), obj("door", 4, 0)])
    assert rules(world) == {"baba is you"}
    world.move("up")
    assert rules(world) == {"baba is you", "door is win"} and cell_of(world, "baba") == (2, 1)
    world.move("right")
    world.move("right")
    assert not world.won
    world.move("up")
    assert world.won and not world.lost


def test_push_chains_move_together_unless_stopped():
    base = sentence("baba is you", 0, 0) + sentence("wall is stop", 0, 4)
    world = World(7, 5, base + [obj("baba", 0, 2), word("key", 1, 2), word("ball", 2, 2), obj("wall", 4, 2)])
    world.move("right")
    assert [e.cell for e in world.entities if e.word and e.name in ("key", "ball")] == [(2, 2), (3, 2)]
    world.move("right")                                            # `ball` would enter the wall: nothing moves
    assert cell_of(world, "baba") == (1, 2)
    assert [e.cell for e in world.entities if e.word and e.name in ("key", "ball")] == [(2, 2), (3, 2)]
    border = World(4, 4, base[:3] + [obj("baba", 1, 2), word("key", 2, 2), word("ball", 3, 2)])
    border.move("right")                                           # the border blocks the chain
    assert cell_of(border, "baba") == (1, 2)
    whole = World(6, 3, sentence("baba is you", 1, 0) + [obj("baba", 0, 0)])
    whole.move("right")                                            # pushing a rule along its line keeps it
    assert rules(whole) == {"baba is you"} and cell_of(whole, "baba") == (1, 0)


def test_every_you_object_moves_and_push_objects_are_pushed():
    world = World(7, 7, sentence("baba is you", 0, 0) + sentence("key is you", 4, 0) + sentence("ball is push", 0, 6)
                  + [obj("baba", 1, 2), obj("ball", 2, 2), obj("key", 4, 3)])
    world.move("right")
    assert (cell_of(world, "baba"), cell_of(world, "ball"), cell_of(world, "key")) == ((2, 2), (3, 2), (5, 3))
    world.move("down")
    assert (cell_of(world, "baba"), cell_of(world, "ball"), cell_of(world, "key")) == ((2, 3), (3, 2), (5, 4))


def test_defeat_destroys_and_losing_every_you_object_ends_the_episode():
    world = World(5, 5, sentence("baba is you", 0, 0) + sentence("ball is defeat", 0, 4)
                  + [obj("baba", 1, 2), obj("ball", 2, 2)])
    world.move("right")
    assert not any(e.name == "baba" and not e.word for e in world.entities) and world.lost and not world.won
    env = BabaIsAIEnv("goto_win-distr_obj")
    env.reset(0)
    env.world = World(4, 3, sentence("baba is you", 0, 1) + [obj("baba", 2, 0)])
    observation, reward, terminated, truncated, info = env.step("down")  # pushes `is` out of `baba is you`
    assert (reward, terminated, truncated, info["success"], info["progress"]) == (0.0, True, False, False, 0.0)
    assert observation == "Active rules:\nObjects on the map:\nno object is you"
    assert info["metrics"] == {"rules_changed": 1.0}


def test_observation_by_hand():
    env = BabaIsAIEnv("goto_win-distr_obj")
    env.reset(0)
    env.world = World(6, 5, sentence("baba is you", 0, 0) + sentence("door is win", 5, 1, vertical=True)
                      + [obj("baba", 2, 2), obj("door", 2, 4), obj("wall", 1, 2), obj("key", 2, 2)])
    env.steps = 0
    observation, reward, terminated, truncated, info = env.step("idle")
    assert observation == "\n".join([
        "Active rules:",
        "baba is you",
        "door is win",
        "Objects on the map:",
        "rule `baba` 2 steps to the left and 2 steps up",
        "rule `is` 1 step to the left and 2 steps up",
        "rule `you` 2 steps up",
        "rule `door` 3 steps to the right and 1 step up",
        "wall 1 step to the left",
        "key at your position",
        "rule `is` 3 steps to the right",
        "rule `win` 3 steps to the right and 1 step down",
        "door 2 steps down",
    ])
    assert (reward, terminated, truncated, info) == (0.0, False, False, {"metrics": {"rules_changed": 0.0}})


def test_a_win_pays_one_minus_nine_tenths_of_the_steps_used():
    env = BabaIsAIEnv("goto_win-distr_obj", max_steps=10)
    env.reset(0)
    env.world = World(5, 3, sentence("baba is you", 0, 0) + sentence("key is win", 0, 2)
                      + [obj("baba", 1, 1), obj("key", 4, 1)])
    assert env.step("right")[1:3] == (0.0, False) and env.step("idle")[1:3] == (0.0, False)
    observation, reward, terminated, truncated, info = env.step("right")
    assert not observation.startswith("You won") and not terminated
    observation, reward, terminated, truncated, info = env.step("right")
    assert observation.startswith("You won the level.\nActive rules:\nbaba is you\nkey is win\n")
    assert (reward, terminated, truncated, info["success"], info["progress"]) == (pytest.approx(0.64), True, False,
                                                                                  True, 1.0)


def test_truncation_at_max_steps():
    env = BabaIsAIEnv("two_room-goto_win", max_steps=3)
    env.reset(0)
    for _ in range(2):
        assert env.step("idle")[1:] == (0.0, False, False, {"metrics": {"rules_changed": 0.0}})
    _, reward, terminated, truncated, info = env.step("idle")
    assert (reward, terminated, truncated, info["success"], info["progress"]) == (0.0, False, True, False, 0.0)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="unknown task 'nope'; valid: .*two_room-goto_win"):
        BabaIsAIEnv("nope")
    env = BabaIsAIEnv("goto_win-distr_obj")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("up")
    env.reset(0)
    with pytest.raises(ValueError, match="unknown action 'fly'; valid: \\['idle', 'up'"):
        env.step("fly")


def test_distractor_text_spells_no_rule():
    env = BabaIsAIEnv("two_room-goto_win-distr_obj_rule")
    for seed in SEEDS:
        env.reset(seed)
        world = env.unwrapped
        words = sorted(e.name for e in world.entities if e.word)
        assert len(words) == 11 and words.count("is") == 4 and len(world.rules) == 3
        nouns = {e.name for e in world.entities if not e.word}
        assert len(nouns) == 4                                     # baba, wall, target and a distractor


def test_the_expert_takes_a_shortest_way_to_the_win_object():
    env = BabaIsAIEnv("goto_win-distr_obj")
    env.reset(0)
    # baba at (1, 1), the key 2 cells down and 1 right; a wall straight below baba (not stop: no rule says so)
    env.world = World(6, 5, sentence("baba is you", 3, 0) + sentence("key is win", 3, 4)
                      + [obj("baba", 1, 1), obj("key", 2, 3), obj("ball", 2, 1)])
    moves = []
    while not env.world.won:
        action, reason = env.expert_action()
        assert reason == "reach the key that is win"
        moves.append(action)
        env.step(action)
    assert sorted(moves) == ["down", "down", "right"]        # Manhattan distance 3: three moves, no detour


def test_the_expert_wins_every_level_in_the_solvers_number_of_moves():
    env = BabaIsAIEnv("goto_win-distr_obj", max_steps=64)
    for seed in range(10):
        env.reset(seed)
        shortest = len(solve(env.unwrapped))
        for step in range(1, env.max_steps + 1):  # noqa: B007 (read after the loop)
            _, _, terminated, truncated, info = env.step(env.expert_action()[0])
            if terminated or truncated:
                break
        assert info["success"] and step == shortest


def test_the_expert_says_when_no_move_wins():
    env = BabaIsAIEnv("goto_win-distr_obj")
    env.reset(0)
    env.world = World(4, 3, sentence("baba is you", 0, 1) + [obj("baba", 2, 0)])   # no WIN rule can be made
    with pytest.raises(RuntimeError, match="no sequence of moves wins goto_win-distr_obj from here"):
        env.expert_action()
