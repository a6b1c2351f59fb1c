"""GEM's games as `gem:<game>` envs (envs/gem_env.py): their action lists, experts that win through the adapter,
success and progress from GEM's rewards, seeding that neither leaks into nor depends on the process's random
streams, and the games refused with their reason. (tests/integration/test_all_envs.py checks the TextEnv contract
and the state keys of every listed game, and of one in a worker process.)"""

import random
import re

import numpy as np
import pytest

from horizonrl import envs
from horizonrl.config import ConfigError, SOURCE_CONFIGS, load_config
from horizonrl.envs.gem_games import GAME_ACTION_LIMIT, GAMES

pytest.importorskip("gem")


@pytest.mark.parametrize("game,count,first", [
    ("TowerofHanoi-v0-easy", 6, "A B"),            # 3 x 2 ordered pairs of towers
    ("GuessTheNumber-v0-easy", 10, "1"),           # 1..10
    ("GuessTheNumber-v0-hard", 50, "1"),           # 1..50
    ("Mastermind-v0-easy", 30, "1 2"),             # 2 different digits of 6: 6 x 5
    ("Minesweeper-v0-easy", 50, "reveal 0 0"),     # reveal or flag x 5 x 5 cells, counted from 0
    ("Minesweeper-v0-hard", 128, "reveal 0 0"),    # 2 x 8 x 8
    ("Sudoku-v0-easy", 64, "1 1 1"),               # row x column x digit, 4 each, counted from 1
    ("Sokoban-v0-easy", 4, "up"),
])
def test_each_game_lists_its_moves(game, count, first):
    env = envs.make(f"gem:{game}")
    assert len(env.actions) == count and env.actions[0] == first and env.default_action == first
    assert len(set(env.actions)) == count


@pytest.mark.parametrize("game", GAMES)
def test_every_listed_game_has_a_short_action_list_and_a_goal(game):
    env = envs.make(f"gem:{game}")
    env.reset(0)
    assert 0 < len(env.actions) <= GAME_ACTION_LIMIT
    assert "{" not in env.instruction.mission and env.instruction.mission    # the goal's fields are filled in


def test_sokobans_goal_names_every_symbol_of_its_board():
    """GEM's board symbols (gem/envs/game_env/sokoban/sokoban.py, `_render_board`): wall, floor, target, box on a
    target, box, player, player on a target."""
    mission = envs.make("gem:Sokoban-v0-easy").instruction.mission
    for symbol in ("#", "_", "O", "√", "X", "P", "S"):
        assert re.search(rf"(?<![A-Za-z]){re.escape(symbol)}(?![A-Za-z])", mission), symbol      # a word alone


def binary_search(env, seed):
    low, high = 1, 10
    observation, _ = env.reset(seed)
    while True:
        guess = (low + high) // 2
        observation, reward, terminated, truncated, info = env.step(str(guess))
        if terminated or truncated:
            return info
        if "higher" in observation:
            low = guess + 1
        else:
            high = guess - 1


def test_binary_search_wins_every_guessing_game_in_four_guesses():
    env = envs.make("gem:GuessTheNumber-v0-easy")
    for seed in range(10):
        assert binary_search(env, seed) == {"success": True, "progress": 1.0}


def hanoi(n, source, target, spare):
    if n == 0:
        return []
    return hanoi(n - 1, source, spare, target) + [f"{source} {target}"] + hanoi(n - 1, spare, target, source)


def test_the_recursive_solution_wins_hanoi_and_illegal_moves_end_at_the_turn_limit_unsolved():
    env = envs.make("gem:TowerofHanoi-v0-easy")
    env.reset(0)
    moves = hanoi(3, "A", "C", "B")                  # 7 moves, within the 10 turns
    for move in moves[:-1]:
        assert env.step(move)[2:4] == (False, False)
    observation, reward, terminated, truncated, info = env.step(moves[-1])
    assert (reward, terminated, truncated, info) == (1.0, True, False, {"success": True, "progress": 1.0})

    env.reset(0)
    for _ in range(9):                               # B is empty: nothing moves
        assert env.step("B C")[2:4] == (False, False)
    observation, reward, terminated, truncated, info = env.step("B C")
    # at the limit GEM rewards the share of disks on C: none
    assert (reward, terminated, truncated, info) == (0.0, True, True, {"success": False, "progress": 0.0})


def test_a_guessing_game_cut_at_its_turn_limit_fails_with_the_closeness_of_its_last_guess_as_progress():
    env = envs.make("gem:GuessTheNumber-v0-easy")          # 1..10 in 4 guesses
    seed = next(s for s in range(100) if env.reset(s) and env.unwrapped.game_number >= 7)
    target = env.unwrapped.game_number
    for guess in ("1", "2", "3"):
        assert env.step(guess)[1:4] == (0.0, False, False)
    _, reward, terminated, truncated, info = env.step("4")
    # GEM at the limit: 1 - |guess - target| / (max - min)
    assert (terminated, truncated) == (True, True) and reward == pytest.approx(1 - (target - 4) / 9)
    assert info == {"success": False, "progress": pytest.approx(1 - (target - 4) / 9)}, seed


@pytest.mark.parametrize("game,turns", [("GuessTheNumber-v0-easy", 4), ("GuessTheNumber-v0-hard", 6),
                                        ("TowerofHanoi-v0-easy", 7), ("TowerofHanoi-v0-hard", 31)])
def test_the_experts_win_within_the_shortest_number_of_turns(game, turns):
    """Binary search needs at most ceil(log2(n + 1)) guesses (10 numbers: 4, 50: 6); Hanoi 2^disks - 1 moves."""
    env = envs.make(f"gem:{game}")
    for seed in range(5):
        env.reset(seed)
        for turn in range(1, turns + 1):  # noqa: B007 (read after the loop)
            action, reason = env.expert_action()
            assert action in env.actions and reason
            *_, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        assert info == {"success": True, "progress": 1.0} and (turns == turn or game.startswith("Guess")), seed


def test_the_hanoi_expert_recovers_from_a_detour():
    env = envs.make("gem:TowerofHanoi-v0-easy")
    env.reset(0)
    env.step("A C")
    env.step("C B")                                   # A: 3 2, B: 1, C: empty
    moves = []
    while True:
        moves.append(env.expert_action()[0])
        *_, terminated, truncated, info = env.step(moves[-1])
        if terminated or truncated:
            break
    # by hand: disk 3 must go A -> C once, with 1 and 2 on B before: 1 to C, 2 to B, 1 to B (3 moves), 3 to C,
    # then 1 and 2 from B to C (3 moves): 7, as from the start
    assert info["success"] and moves == ["B C", "A B", "C B", "A C", "B A", "B C", "A C"]
    assert not hasattr(envs.make("gem:Sokoban-v0-easy"), "expert_action")   # a game without an expert says so


def play(env, seed, moves):
    observations = [env.reset(seed)[0]]
    for move in moves:
        observation, _, terminated, truncated, _ = env.step(move)
        observations.append(observation)
        if terminated or truncated:
            break
    return observations


@pytest.mark.parametrize("game,moves", [("Game2048-v0-easy", ["left", "up", "right", "down"] * 3),
                                        ("Minesweeper-v0-easy", ["reveal 2 2", "reveal 0 0", "reveal 4 4"])])
def test_one_seed_plays_the_same_whatever_drew_from_the_process_random_streams_between(game, moves):
    env = envs.make(f"gem:{game}")
    random.seed(1)
    np.random.seed(1)
    first = play(env, 7, moves)
    random.random(), np.random.rand(5)               # draws between the episodes
    assert play(env, 7, moves) == first
    assert play(envs.make(f"gem:{game}"), 7, moves) == first
    assert play(env, 8, moves) != first              # 2048 places tiles, Minesweeper its mines, by the seed


def test_games_played_side_by_side_in_one_process_play_as_each_alone():
    """The collector steps many streams in one process: one game's draws must not move another's (2048 places a
    tile from the stream after every move; GEM's reset seeds it)."""
    moves = ["left", "up", "right", "down"] * 3
    alone = play(envs.make("gem:Game2048-v0-easy"), 7, moves)
    first, second = envs.make("gem:Game2048-v0-easy"), envs.make("gem:Game2048-v0-easy")
    observations = [first.reset(7)[0]]
    for move in moves:
        second.reset(len(observations))                     # another game reseeds GEM's streams between our moves
        second.step("up")
        observations.append(first.step(move)[0])
    assert observations == alone


def test_the_games_leave_the_process_random_streams_where_they_were():
    random.seed(3)
    np.random.seed(3)
    expected = random.random(), float(np.random.rand())
    random.seed(3)
    np.random.seed(3)
    env = envs.make("gem:Game2048-v0-easy")          # GEM seeds both streams at every reset and draws from them
    play(env, 5, ["left", "up"])
    assert (random.random(), float(np.random.rand())) == expected


@pytest.mark.parametrize("env_id,reason", [
    ("gem:Wordle-v0-easy", "needs NLTK's word list"),
    ("gem:Hangman-v0-hard", "needs NLTK's word list"),
    ("gem:GuessTheNumber-v0-random", "draws its size anew each episode"),
    ("gem:Mastermind-v0-hard", f"more actions than the {GAME_ACTION_LIMIT}"),
    ("gem:math:Math12K", "from the Hugging Face hub"),
    ("gem:Chess-v0", "not a GEM game this adapter knows"),
])
def test_a_game_that_cannot_run_offline_is_refused_naming_why(env_id, reason):
    with pytest.raises(ValueError, match=reason):
        envs.make(env_id)
    with pytest.raises(ConfigError, match=reason):
        load_config(str(SOURCE_CONFIGS / "toy.yaml"), [f"env.id={env_id}"])


def test_gigpo_trains_an_iteration_on_a_gem_game(tmp_path):
    from horizonrl.report.metrics import read_metrics
    from horizonrl.train.loop import train

    cfg = load_config(str(SOURCE_CONFIGS / "toy.yaml"), [
        "env.id=gem:TowerofHanoi-v0-easy", "env.kwargs={}", "algorithm=gigpo", "iterations=1", "model.warm_start=null",
        "group.n_tasks=2", "group.group_size=4", "group.max_turns=5", "rollout.n_env=4", f"output_dir={tmp_path}"])
    (record,) = read_metrics(train(cfg, progress=False) / "metrics.jsonl")
    assert record["env/episodes"] == 8 and record["env/turns"] == 40      # 10 turns allowed, cut at 5
    assert record["train/actor/skipped_updates"] == 0
