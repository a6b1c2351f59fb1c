"""OpenSpiel's two-player games as TextEnvs against fixed opponents (envs/openspiel_env.py, opponents.py,
openspiel_games.py): the text a seat reads, the opponents' strength, seeding, illegal moves, and training."""

import random
from collections import Counter

import pytest

pyspiel = pytest.importorskip("pyspiel", reason="the games extra is not installed: pip install -e '.[games]'")

from horizonrl import envs  # noqa: E402
from horizonrl.envs import openspiel_games, opponents  # noqa: E402


def play(env, seed: int, rng: random.Random) -> dict:
    """One game of `env` from `seed`, the policy's seat playing uniformly random legal moves; the end's metrics."""
    env.reset(seed)
    while True:
        _, _, terminated, _, info = env.step(rng.choice(env.legal_names()))
        if terminated:
            return info["metrics"]


def tally(env_id: str, games: int, **kwargs) -> Counter:
    env, rng = envs.make(env_id, **kwargs), random.Random(0)
    return Counter(outcome for seed in range(games) for outcome, value in play(env, seed, rng).items() if value)


def test_minimax_finds_tic_tac_toes_5478_positions_and_a_draw():
    """Tic-tac-toe has 5,478 legal positions and is a draw with perfect play (both known results)."""
    game = pyspiel.load_game("tic_tac_toe")
    assert opponents.minimax_values(game.new_initial_state()) == (0.0, 0.0)
    assert sum(name == "tic_tac_toe" for name, _ in opponents.VALUES) == 5478


@pytest.mark.parametrize("seat", [0, 1])
def test_perfect_play_never_loses_and_beats_random_play_mostly(seat):
    outcomes = tally("openspiel:tic_tac_toe", 100, seat=seat, opponent="perfect")
    print(seat, outcomes)
    assert outcomes["win"] == 0 and outcomes["illegal"] == 0
    assert outcomes["loss"] >= 70


def test_mcts_with_100_simulations_beats_random_play():
    """Measured with OpenSpiel alone before the adapter: 47 wins, 3 draws, 0 losses of 50 for MCTS-100."""
    outcomes = tally("openspiel:tic_tac_toe", 50, opponent="mcts:100")
    print(outcomes)
    assert outcomes["win"] <= 3 and outcomes["loss"] >= 40


def test_one_seed_plays_one_game_and_alternate_seats_take_the_seeds_parity():
    env = envs.make("openspiel:leduc_poker")
    games = []
    for _ in range(2):
        rng = random.Random(3)
        observations = [env.reset(8)[0]]
        while not env.state.is_terminal():
            observations.append(env.step(rng.choice(env.legal_names()))[0])
        games.append(observations)
    assert games[0] == games[1] and len(games[0]) >= 2
    seats = {}
    for seat_choice in ("alternate", 1):
        env = envs.make("openspiel:leduc_poker", seat=seat_choice)
        for seed in (8, 9):
            env.reset(seed)
            seats[seat_choice, seed] = env.seat
    assert seats == {("alternate", 8): 0, ("alternate", 9): 1, (1, 8): 1, (1, 9): 1}


def test_kuhn_spells_the_seats_card_and_the_moves_so_far():
    state = pyspiel.load_game("kuhn_poker").new_initial_state()
    for action in (2, 0, 0, 1):              # deal: King to player 1, Jack to player 2; player 1 passes, 2 bets
        state.apply_action(action)
    text = openspiel_games.TEXTS["kuhn_poker"].describe(state, 0)
    assert text == ("You are player 1 of 2 (you move first).\nYour card: King (the highest of the three).\n"
                    "Moves so far: you passed, the opponent bet.")


def test_leduc_spells_both_cards_the_rounds_and_the_pot():
    state = pyspiel.load_game("leduc_poker").new_initial_state()
    for action in (4, 1, 2, 1, 3):           # King and Jack dealt; raise, call; board card 3 (a Queen)
        state.apply_action(action)
    text = openspiel_games.TEXTS["leduc_poker"].describe(state, 1)
    assert text == ("You are player 2 of 2 (the opponent moves first). Player 1 moves first in each round.\n"
                    "Your card: Jack.\nBoard card: Queen.\nRound 1 moves: the opponent raised, you called.\n"
                    "Round 2 moves: none.\nPot: 6 chips. Your chips left: 97.")


def test_a_board_is_drawn_with_its_coordinates_and_the_legal_moves_follow():
    env = envs.make("openspiel:tic_tac_toe", seat=0, opponent="random")
    env.reset(0)
    env.state.apply_action(4)                # x on b2 (row 2, column b), then o on a1
    env.state.apply_action(0)
    assert env.render() == ("You are player 1 of 2 (you move first).\nYou play x.\n  a b c\n1 o . .\n2 . x .\n"
                            "3 . . .\nLegal moves: b1, c1, a2, c2, a3, b3, c3.")


def test_an_illegal_move_loses_with_the_penalty_and_is_counted():
    env = envs.make("openspiel:tic_tac_toe", seat=1, opponent="random")
    env.reset(0)
    taken = next(name for name in env.actions if name not in env.legal_names())     # the opponent's first mark
    observation, reward, terminated, _, info = env.step(taken)
    assert (reward, terminated, info["success"]) == (-1.5, True, False)
    assert info["metrics"] == {"win": 0.0, "draw": 0.0, "loss": 1.0, "illegal": 1.0}
    assert "not a legal move" in observation
    assert envs.make("openspiel:kuhn_poker").illegal_reward == -2.5      # its least utility, -2, less 0.5


@pytest.mark.parametrize(("env_id", "kwargs", "reason"), [
    ("openspiel:kuhn_poker", {"opponent": "mcts:100"}, "MCTS needs a perfect-information game"),
    ("openspiel:connect_four", {"opponent": "perfect"}, "no exact solution of connect_four"),
    ("openspiel:tic_tac_toe", {"opponent": "mcts:0"}, "N >= 1"),
    ("openspiel:tic_tac_toe", {"opponent": "minimax"}, "known: random, mcts:N, perfect"),
    ("openspiel:tic_tac_toe", {"seat": 2}, "seat must be 0, 1 or 'alternate'"),
])
def test_an_opponent_or_seat_the_game_cannot_have_is_refused_naming_why(env_id, kwargs, reason):
    with pytest.raises(ValueError, match=reason):
        envs.check_kwargs(env_id, kwargs)


@pytest.mark.parametrize("env_id", ["openspiel:kuhn_poker", "openspiel:tic_tac_toe"])
def test_gigpo_trains_an_iteration_against_a_fixed_opponent(tmp_path, env_id):
    from horizonrl.config import SOURCE_CONFIGS, load_config
    from horizonrl.report.metrics import read_metrics
    from horizonrl.train.loop import train

    cfg = load_config(str(SOURCE_CONFIGS / "toy.yaml"), [
        f"env.id={env_id}", "env.kwargs={opponent: random}", "algorithm=gigpo", "iterations=1",
        "model.warm_start=null", "group.n_tasks=2", "group.group_size=4", "group.max_turns=9", "rollout.n_env=4",
        f"output_dir={tmp_path}"])
    (record,) = read_metrics(train(cfg, progress=False) / "metrics.jsonl")
    assert record["env/episodes"] == 8 and record["train/actor/skipped_updates"] == 0
    assert record["env/win"] + record["env/draw"] + record["env/loss"] == pytest.approx(1.0)


def test_eval_plays_each_seat_against_the_opponent_asked_and_reports_the_outcomes(tmp_path, capsys):
    """A format-only warm start against perfect play: no game won, in either seat (perfect play never loses)."""
    import json

    from horizonrl.cli import main
    from horizonrl.config import SOURCE_CONFIGS

    assert main(["sft", str(SOURCE_CONFIGS / "tictactoe_tiny_sft.yaml"), "sft.steps=5", "sft.episodes=8",
                 f"output_dir={tmp_path}", "--quiet"]) == 0
    (run,) = tmp_path.iterdir()
    assert main(["eval", str(run), "--episodes", "6", "--mode", "greedy", "--opponent", "perfect"]) == 0
    assert "openspiel:tic_tac_toe seat 1: 0 won" in capsys.readouterr().out
    envs_played = json.loads((run / "eval-checkpoint.json").read_text())["modes"]["greedy"]["envs"]
    assert list(envs_played) == ["openspiel:tic_tac_toe seat 0", "openspiel:tic_tac_toe seat 1"]
    for summary in envs_played.values():
        games = summary["games"]
        assert games["games"] == 6 and games["win"] == 0 and games["draw"] + games["loss"] == 6
    assert main(["eval", str(run), "--episodes", "2", "--opponent", "mcts:x"]) == 2
    assert "mcts:N needs a whole number" in capsys.readouterr().err


def test_liars_dice_spells_the_die_and_the_bids_and_sixes_are_wild_as_the_tips_say():
    game = pyspiel.load_game("liars_dice")
    state = game.new_initial_state()
    for action in (5, 2, 8):                 # dice 6 and 3; player 1 bids 2-3 (two 3s)
        state.apply_action(action)
    assert openspiel_games.TEXTS["liars_dice"].describe(state, 1) == \
        "You are player 2 of 2 (the opponent moves first).\nYour die: 3.\nBids so far: the opponent bid 2-3."
    state.apply_action(12)                   # liar: a 3 and a wild 6 hold the bid, so the caller loses
    assert state.returns() == [1.0, -1.0]
    assert openspiel_games.TEXTS["liars_dice"].move_names[8] == "2-3"


def test_always_betting_against_kuhns_equilibrium_scores_its_exact_value():
    """OpenSpiel's exact value of always betting against the equilibrium (alpha 0) is -1/9 in either seat (by hand:
    as player 1, the six deals give 0, -2, +1, -2, +1, +4/3). 4,000 games a seat land within 0.05 of it (standard
    error ~0.025); an opponent whose draws followed the deal's would see the cards and lose (+0.14 measured)."""
    from open_spiel.python import policy
    from open_spiel.python.algorithms import expected_game_score

    game = pyspiel.load_game("kuhn_poker")
    table = pyspiel.kuhn_poker.get_optimal_policy(0.0).policy_table()
    optimal = policy.tabular_policy_from_callable(game, lambda s: dict(table[s.information_state_string()]))
    always_bet = policy.tabular_policy_from_callable(game, lambda s: {0: 0.0, 1: 1.0})
    for seat in (0, 1):
        players = [always_bet, optimal] if seat == 0 else [optimal, always_bet]
        exact = expected_game_score.policy_value(game.new_initial_state(), players)[seat]
        assert exact == pytest.approx(-1 / 9)
        env, total = envs.make("openspiel:kuhn_poker", seat=seat, opponent="perfect"), 0.0
        for seed in range(4000):
            env.reset(seed)
            terminated = False
            while not terminated:
                _, reward, terminated, _, _ = env.step("bet")
            total += reward
        assert total / 4000 == pytest.approx(exact, abs=0.05), seat
