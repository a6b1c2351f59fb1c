"""ALFWorld: without its data the env says, in one line, where the data goes and how to get it; with a game (one
written here, alfworld_games.py) it plays through TextWorld's PDDL engine and Fast Downward plans for it."""

import os
import subprocess
import sys

import pytest
from alfworld_games import GAMES, TASK, write_games  # tests/integration is on sys.path under pytest
from optional_packages import skip_unless_installed

from horizonrl import envs
from horizonrl.play import list_envs


def test_without_its_data_alfworld_says_where_the_data_goes_and_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nothing-here"))
    line, = [line for line in list_envs().splitlines() if line.startswith("alfworld ")]
    assert "not runnable here" in line and "`alfworld-download`" in line, line
    with pytest.raises(ValueError) as refused:
        envs.make("alfworld")
    assert "alfworld-download" in str(refused.value) and "\n" not in str(refused.value)
    listed = subprocess.run([sys.executable, "-m", "horizonrl", "envs"], capture_output=True, text=True, check=True,
                            env={**os.environ, "ALFWORLD_DATA": str(tmp_path / "nothing-here")})
    assert line in listed.stdout.splitlines()


def test_a_package_that_is_present_with_its_data_missing_names_the_folder(tmp_path, monkeypatch):
    skip_unless_installed("alfworld")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(ValueError, match=r"its data is missing: no json_2\.1\.1 in .* \(\$ALFWORLD_DATA\); "
                                         r"get it with `alfworld-download`"):
        envs.make("alfworld")


@pytest.fixture
def games(tmp_path, monkeypatch):
    skip_unless_installed("alfworld")
    monkeypatch.setenv("ALFWORLD_DATA", str(write_games(tmp_path)))


def test_the_planner_expert_wins_the_game_through_the_env(games):
    env = envs.make("alfworld")
    observation, _ = env.reset(0)
    assert observation.startswith("You are in the middle of a room") and "Your task" not in observation
    assert env.instruction.mission == TASK and "go to fridge 1" in env.actions and env.default_action in env.actions
    plan = []
    for _ in range(8):
        command, reason = env.expert_action()
        assert command in env.actions and "to the goal" in reason
        plan.append(command)
        observation, reward, terminated, truncated, info = env.step(command)
        if terminated:
            break
    assert plan == ["go to countertop 1", "take apple 1 from countertop 1", "go to fridge 1", "open fridge 1",
                    "move apple 1 to fridge 1"], plan
    assert (reward, terminated, truncated, info["success"], info["progress"]) == (1.0, True, False, True, 1.0)


def test_unsolvable_games_and_other_tasks_are_skipped_and_steps_run_out(games):
    look = envs.make("alfworld", task="look_at_obj_in_light")
    with pytest.raises(ValueError, match="none of the 1 ALFWorld games .* is marked solvable"):
        look.reset(0)
    env = envs.make("alfworld", max_steps=2)
    unsolvable, first, second = GAMES      # seeds 0 and 3 pick the unsolvable game and play the next one
    assert [env.game_file(seed).parent.parent.name for seed in range(4)] == [first, first, second, first]
    assert "cabinet 1" not in env.reset(2)[0] and "cabinet 1" in env.reset(1)[0]
    start = env.reset(3)[0]
    key = env.state_key()
    assert env.step("look")[2:4] == (False, False)
    assert env.step("go to cabinet 1")[2:4] == (False, True)
    assert env.reset(3)[0] == start and env.state_key() == key
    with pytest.raises(ValueError, match="unknown ALFWorld task 'cooking'"):
        envs.make("alfworld", task="cooking")
