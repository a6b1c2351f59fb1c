"""TextArena's two-player games as self-play TextEnvs (envs/textarena_env.py): seats in turn, each seat's return at
the end, a twice-refused move losing, the windowed log, and a self-play iteration trained."""

import pytest

pytest.importorskip("textarena", reason="the games extra is not installed: pip install -e '.[games]'")

from horizonrl import envs  # noqa: E402
from horizonrl.config import SOURCE_CONFIGS, load_config  # noqa: E402


def test_a_game_gives_its_turns_to_the_seats_in_turn_and_every_seats_return_at_the_end():
    """O (seat 0) takes 0, 1, 2 while X (seat 1) takes 3, 4: the top row, seat 0 wins."""
    env = envs.make("textarena:TicTacToe-v0")
    observation, _ = env.reset(0)
    assert env.seat == 0 and observation.startswith("[GAME] You are Player 0 in Tic Tac Toe.")
    for move, seat in (("0", 1), ("3", 0), ("1", 1), ("4", 0)):
        observation, reward, terminated, _, _ = env.step(move)
        assert (env.seat, reward, terminated) == (seat, 0.0, False)
    _, reward, terminated, _, info = env.step("2")
    assert (reward, terminated, env.seat) == (0.0, True, 0)
    assert info["seat_returns"] == [1.0, -1.0] and info["metrics"] == {"first_seat_win": 1.0, "draw": 0.0,
                                                                       "illegal": 0.0}


def test_a_move_refused_twice_loses_the_game_for_the_seat_that_made_it():
    env = envs.make("textarena:TicTacToe-v0")
    env.reset(0)
    env.step("0")
    _, _, terminated, _, _ = env.step("0")          # seat 1 plays the taken cell: one more try
    assert not terminated and env.seat == 1
    _, _, terminated, _, info = env.step("0")
    assert terminated and info["seat_returns"] == [1.0, -1.0] and info["metrics"]["illegal"] == 1.0


def test_the_observation_keeps_the_rules_and_the_last_messages_of_the_log():
    """After four moves the log holds the rules, the first board and 3 messages a move (the move, what it did, the
    board): window 2 keeps the rules and the last move's "placed" and board messages."""
    env = envs.make("textarena:TicTacToe-v0", window=2)
    env.reset(0)
    for move in ("0", "3", "1", "4"):
        observation, *_ = env.step(move)
    messages = observation.split("\n[GAME] ")
    assert messages[0].startswith("[GAME] You are Player 0 in Tic Tac Toe.") and len(messages) == 3
    assert messages[1] == "Player 1 placed their symbol (X) in cell 4."
    assert messages[2].startswith("Current Board:") and " O | O | 2 " in messages[2] and " X | X | 5 " in messages[2]


def test_the_same_seed_deals_the_same_kuhn_game_and_the_process_random_stays_put():
    import random

    env = envs.make("textarena:KuhnPoker-v0")
    random.seed(1)
    first = env.reset(7)[0]
    assert random.random() == random.Random(1).random()          # TextArena's random.seed(7) did not reach it
    assert env.reset(7)[0] == first and "Your card is:" in first
    deals = {env.reset(seed)[0].split("Your card is: ")[1][:3] for seed in range(12)}
    assert deals == {"'J'", "'Q'", "'K'"}


@pytest.mark.parametrize("kwargs, reason", [
    ({"game": "Wordle-v0"}, "textarena:Wordle-v0 needs NLTK's word lists"),
    ({"game": "SimpleNegotiation-v0"}, "SimpleNegotiation-v0 is not adapted here; adapted: TicTacToe-v0, "
                                       "ConnectFour-v0, .* free-text moves"),
    ({"game": "TicTacToe-v0", "opponent": "random"}, "textarena games have no fixed opponent here"),
])
def test_a_game_or_opponent_not_adapted_is_refused_naming_why(kwargs, reason):
    from horizonrl.envs.textarena_env import TextArenaEnv

    with pytest.raises(ValueError, match=reason):
        TextArenaEnv(**kwargs)


def test_an_env_id_of_a_refused_game_names_the_reason_before_any_import():
    with pytest.raises(ValueError, match="textarena:Debate-v0-long needs an OpenRouter API key"):
        envs.spec("textarena:Debate-v0-long")


REASONS = {                   # a phrase of each refusal -> what TextArena does when the game is reset for two players
    "NLTK": LookupError, "API key": ValueError, "Python 3.12": SyntaxError, "three or more": AssertionError,
    "data files": FileNotFoundError, "imports a module": ImportError, "one-player": Exception}


@pytest.mark.timeout(240)
def test_each_refusal_is_what_textarena_does_and_the_other_two_player_games_take_free_text(monkeypatch):
    """Every game name of TextArena's registry, its first id reset for two players: a refused name fails as its reason
    says (a one-player puzzle plays one seat), an adapted one plays, any other plays two seats (free-text moves)."""
    import sys

    import textarena as ta
    from textarena.envs.registration import ENV_REGISTRY

    from horizonrl.envs.textarena_games import GAMES, REFUSED

    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    firsts: dict[str, str] = {}
    for env_id in sorted(ENV_REGISTRY):
        if not env_id.endswith(("-train", "-raw")):
            firsts.setdefault(env_id.split("-v")[0], env_id)
    assert set(GAMES) <= set(firsts.values())
    refused = {name: reason for reason, names in REFUSED.items() for name in names}
    assert set(refused) <= set(firsts)
    for name, env_id in firsts.items():
        reason = refused.get(name, "")
        (error,) = [kind for phrase, kind in REASONS.items() if phrase in reason] or [None]
        if error is SyntaxError and sys.version_info >= (3, 12):
            continue
        if error is None:
            ta.make(env_id).reset(num_players=2, seed=0)
            continue
        with pytest.raises(error):
            ta.make(env_id).reset(num_players=2, seed=0)
        if "one-player" in reason:
            ta.make(env_id).reset(num_players=1, seed=0)


def test_self_play_grpo_trains_an_iteration_on_a_textarena_game(tmp_path):
    from horizonrl.report.metrics import read_metrics
    from horizonrl.train.loop import train

    cfg = load_config(str(SOURCE_CONFIGS / "toy.yaml"), [
        "env.id=textarena:TicTacToe-v0", "env.kwargs={}", "agent.memory=0", "iterations=1", "model.warm_start=null",
        "algorithm=grpo", "group.n_tasks=2", "group.group_size=2", "group.max_turns=12", "rollout.n_env=4",
        f"output_dir={tmp_path}"])
    (record,) = read_metrics(train(cfg, progress=False) / "metrics.jsonl")
    assert record["env/episodes"] >= 2 * 2 and record["train/actor/skipped_updates"] == 0
    assert record["env/win"] + record["env/draw"] + record["env/loss"] == pytest.approx(1.0)
