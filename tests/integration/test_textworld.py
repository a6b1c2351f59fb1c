import sys

import pytest

pytest.importorskip("textworld")

from horizonrl.envs.base import TextEnv  # noqa: E402
from horizonrl.envs.textworld import MISSING, TextWorldEnv, clean  # noqa: E402


@pytest.fixture(scope="module")
def game_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("textworld-games")


@pytest.mark.parametrize("kind", ["simple", "coin_collector", "treasure_hunter", "cooking"])
def test_the_walkthrough_wins_through_the_wrapper(kind, game_dir):
    env = TextWorldEnv(kind, game_dir=game_dir)
    assert isinstance(env, TextEnv)
    obs, info = env.reset(0)
    assert obs.startswith("-= ") and "$$" not in obs and env.objective and env.objective not in obs
    assert env.default_action in env.actions and set(env.instruction.actions) == set(env.actions)
    assert env.objective.rstrip(".!") in env.instruction.mission and env.walkthrough
    total = 0.0
    for command in env.walkthrough[:-1]:
        assert command in env.actions, (command, env.actions)
        _, reward, terminated, truncated, info = env.step(command)
        total += reward
        assert not (terminated or truncated) and "success" not in info
    obs, reward, terminated, truncated, info = env.step(env.walkthrough[-1])
    total += reward
    assert (terminated, truncated, info["success"], info["progress"]) == (True, False, True, 1.0)
    assert total == env.max_score == info["metrics"]["score"] and "Would you like" not in obs


def test_commands_are_free_text_and_the_actions_follow_the_game(game_dir):
    env = TextWorldEnv("coin_collector", game_dir=game_dir)
    env.reset(0)
    first = list(env.actions)
    obs, reward, terminated, truncated, _ = env.step("dance wildly")
    assert "not a verb" in obs and (reward, terminated, truncated) == (0.0, False, False)
    assert env.actions == first
    env.step(env.walkthrough[0])
    assert env.actions != first and env.default_action in env.actions
    assert not any(line.startswith(">") for line in env.step("look")[0].split("\n"))


def test_games_are_cached_and_the_same_seed_gives_the_same_game(game_dir, tmp_path, monkeypatch):
    env = TextWorldEnv("treasure_hunter", game_dir=game_dir)
    first_obs, _ = env.reset(1)
    files = sorted(p.name for p in game_dir.iterdir())
    assert any(name.endswith("seed1.z8") for name in files) and not any(n.startswith(".") for n in files)
    with monkeypatch.context() as patched:       # loaded from the cache, not generated again
        patched.setattr(env, "_generate", lambda seed, _: pytest.fail(f"the game of seed {seed} was generated again"))
        assert env.reset(1)[0] == first_obs
    assert sorted(p.name for p in game_dir.iterdir()) == files
    elsewhere = TextWorldEnv("treasure_hunter", game_dir=tmp_path)
    assert elsewhere.reset(1)[0] == first_obs and elsewhere.objective == env.objective
    assert elsewhere.walkthrough == env.walkthrough
    env.reset(2)
    assert env.objective != elsewhere.objective


def test_episode_is_truncated_at_max_steps(game_dir):
    env = TextWorldEnv("coin_collector", max_steps=3, game_dir=game_dir)
    env.reset(0)
    for _ in range(2):
        assert env.step("look")[2:4] == (False, False)
    _, reward, terminated, truncated, info = env.step("look")
    assert (reward, terminated, truncated, info["success"], info["progress"]) == (0.0, False, True, False, 0.0)


def test_clean_drops_banner_prompt_and_menu():
    feedback = ("\n\n  ________  __\n |  \\ $$  |  \\\n  \\$$  $$\n\nGo find the coin.\n\n-= Attic =-\nDusty.\n\n\n\n"
                ">          -= Attic =-0/1")
    assert clean(feedback, "Go find the coin.") == "-= Attic =-\nDusty."
    end = ("You win.\n\n     *** The End ***\n\n"
           "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?\n>  x")
    assert clean(end) == "You win.\n\n*** The End ***"


def test_bad_kind_and_missing_package_are_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="unknown TextWorld kind 'zork'"):
        TextWorldEnv("zork")
    monkeypatch.setitem(sys.modules, "textworld", None)
    with pytest.raises(ImportError) as error:
        TextWorldEnv()
    assert str(error.value) == MISSING == (
        "TextWorld envs need the textworld package: pip install 'horizonrl[textworld]'")
