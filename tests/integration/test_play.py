"""`horizonrl play` and `horizonrl envs`: what a person sees is what the agent sees."""

import subprocess
import sys

from horizonrl import envs
from horizonrl.agents.prompt import build_messages, system_prompt
from horizonrl.envs.gem_games import GAMES
from horizonrl.envs.openspiel_games import TEXTS
from horizonrl.envs.textarena_games import GAMES as ARENA_GAMES
from horizonrl.play import list_envs, play, render


def scripted(replies):
    replies = iter(replies)
    return lambda prompt: next(replies)


def test_play_shows_the_agent_messages_and_runs_the_agents_action_parsing():
    shown = []
    env = envs.make("river", stones=2)
    first_observation, _ = env.reset(3)
    right_side = "jump left" if first_observation.endswith("left.") else "jump right"
    answers = ["THINK: hm\nACTION: Wait.", right_side, "fly", ""]
    episode_return = play("river", {"stones": 2}, seed=3, ask=scripted(answers), show=shown.append)
    assert shown[0] == render(build_messages(system_prompt(env.instruction), [], first_observation, 1))
    assert ">>> executed 'wait'; reward 0" in shown[1]                   # normalised: "Wait." -> wait
    assert "Previous plan:\nTHINK: hm\nACTION: wait" in shown[2]         # history holds the executed action
    assert "(invalid: 'fly', ran the default action); reward -0.1" in shown[5]
    assert shown[-1] == "stopped." and episode_return == -0.1


def test_play_reports_the_end_of_an_episode():
    shown = []
    env = envs.make("river", stones=1)
    observation, _ = env.reset(0)
    action = "jump left" if observation.endswith("left.") else "jump right"
    assert play("river", {"stones": 1}, seed=0, ask=scripted([action]), show=shown.append) == 1.0
    assert "episode over: success, return 1, progress 1" in shown[-1]


def test_envs_command_lists_every_env_and_play_rejects_an_unknown_one():
    listed = subprocess.run([sys.executable, "-m", "horizonrl", "envs"], capture_output=True, text=True, check=True)
    built_in = [i for i, spec in envs.REGISTRY.items() if str(spec.factory).startswith("horizonrl.")]
    assert len(built_in) == 19 + len(GAMES) + len(TEXTS) + len(ARENA_GAMES)
    assert all(env_id in listed.stdout for env_id in built_in)
    bad = subprocess.run([sys.executable, "-m", "horizonrl", "play", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown env 'nope'" in bad.stderr and "Traceback" not in bad.stderr


def test_an_env_whose_package_is_missing_is_listed_as_not_runnable_with_what_to_install(monkeypatch):
    absent = envs.EnvSpec("horizonrl_absent_package:Game", {}, "a game", "games")
    monkeypatch.setitem(envs.REGISTRY, "needs-more", absent)
    lines = [line for line in list_envs().splitlines() if line.startswith("needs-more")]
    assert len(lines) == 1 and "not runnable here" in lines[0] and "pip install 'horizonrl[games]'" in lines[0]
    assert "a game" not in lines[0]
