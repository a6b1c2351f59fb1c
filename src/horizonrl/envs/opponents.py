"""Fixed opponents for the seats of an OpenSpiel game the policy does not play (`openspiel:<game>`'s `opponent`).

    random     a uniformly random legal move
    mcts:N     OpenSpiel's MCTS bot (C++, UCT c = 2, N simulations, random roll-outs); perfect-information games
    perfect    optimal play: exact minimax over the whole game tree (tic-tac-toe: 5,478 positions, cached), a random
               one among the optimal moves; Kuhn poker's equilibrium (OpenSpiel's `get_optimal_policy`, alpha 0)

`make_opponent(spec, game)` refuses a spec the game cannot have (MCTS on a poker game, perfect play where no exact
solution is computed here) naming why. Every opponent is seeded at each episode's `reset(seed)`: the same seed plays
the same moves in the same positions. Its generator is its own (`opponent_seed`): one seeded like the env's chance
would draw the same numbers as the deal, and so play as if it saw the cards.
"""

from __future__ import annotations

import random
from typing import Protocol

import pyspiel

PERFECT_BY_SEARCH = {"tic_tac_toe"}       # games small enough for exact minimax here
MCTS_UCT_C = 2.0


class Opponent(Protocol):
    def reset(self, seed: int) -> None: ...

    def act(self, state) -> int:
        """An action id among state.legal_actions() for the player to move."""


def opponent_seed(seed: int) -> str:
    """The seed of an opponent's generator in the episode of `seed`: a stream apart from the env's chance."""
    return f"opponent {seed}"


class Seeded:
    """An opponent that draws from a generator of its own, seeded by each episode's reset."""

    def __init__(self):
        self.rng = random.Random(opponent_seed(0))

    def reset(self, seed: int) -> None:
        self.rng = random.Random(opponent_seed(seed))


class RandomOpponent(Seeded):
    def act(self, state) -> int:
        return self.rng.choice(state.legal_actions())


class MCTSOpponent:
    def __init__(self, game, simulations: int):
        self.game, self.simulations = game, simulations
        self.bot = None

    def reset(self, seed: int) -> None:
        own = random.Random(opponent_seed(seed)).getrandbits(31)      # the C++ bot's seeds, apart from the chance's
        evaluator = pyspiel.RandomRolloutEvaluator(1, own)
        self.bot = pyspiel.MCTSBot(self.game, evaluator, MCTS_UCT_C, self.simulations, 1000, False, own, False)

    def act(self, state) -> int:
        return self.bot.step(state)


class MinimaxOpponent(Seeded):
    """A random one of the moves of best minimax value for the player to move."""

    def act(self, state) -> int:
        player = state.current_player()
        values = {action: minimax_values(state.child(action))[player] for action in state.legal_actions()}
        best = max(values.values())
        return self.rng.choice([action for action, value in values.items() if value == best])


VALUES: dict[tuple[str, str], tuple[float, ...]] = {}     # (game, position) -> every player's minimax value


def minimax_values(state) -> tuple[float, ...]:
    """Every player's value of `state` when both play perfectly (a deterministic perfect-information game whose
    position, str(state), says whose turn it is), cached by position: tic-tac-toe's 5,478 once each."""
    key = (state.get_game().get_type().short_name, str(state))
    if key not in VALUES:
        if state.is_terminal():
            VALUES[key] = tuple(state.returns())
        else:
            player = state.current_player()
            VALUES[key] = max((minimax_values(state.child(a)) for a in state.legal_actions()), key=lambda v: v[player])
    return VALUES[key]


class PolicyOpponent(Seeded):
    """Moves sampled from a fixed tabular policy (information state string -> [(action, probability)])."""

    def __init__(self, table: dict[str, list[tuple[int, float]]]):
        super().__init__()
        self.table = table

    def act(self, state) -> int:
        actions, weights = zip(*self.table[state.information_state_string()])
        return self.rng.choices(actions, weights)[0]


def make_opponent(spec: str, game) -> Opponent:
    """The opponent `spec` names for `game` (a pyspiel game); ValueError naming why a spec does not fit."""
    name = game.get_type().short_name
    perfect_information = game.get_type().information == pyspiel.GameType.Information.PERFECT_INFORMATION
    if spec == "random":
        return RandomOpponent()
    if spec.startswith("mcts:"):
        simulations = spec.removeprefix("mcts:")
        if not simulations.isdigit() or int(simulations) < 1:
            raise ValueError(f"opponent {spec!r}: mcts:N needs a whole number of simulations N >= 1")
        if not perfect_information:
            raise ValueError(f"opponent {spec!r}: MCTS needs a perfect-information game; {name} has hidden "
                             "information (play it against random or perfect)")
        return MCTSOpponent(game, int(simulations))
    if spec == "perfect":
        if name == "kuhn_poker":
            return PolicyOpponent(pyspiel.kuhn_poker.get_optimal_policy(0.0).policy_table())
        if name in PERFECT_BY_SEARCH:
            return MinimaxOpponent()
        raise ValueError(f"opponent 'perfect': no exact solution of {name} is computed here (it exists for "
                         f"kuhn_poker and {', '.join(sorted(PERFECT_BY_SEARCH))}); use "
                         f"{'mcts:N or random' if perfect_information else 'random'}")
    raise ValueError(f"unknown opponent {spec!r}; known: random, mcts:N, perfect")
