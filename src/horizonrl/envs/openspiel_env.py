"""An OpenSpiel two-player game as a TextEnv: the policy plays one seat, a fixed opponent the other, or every seat.

    env = envs.make("openspiel:tic_tac_toe", seat="alternate", opponent="perfect")
    env = envs.make("openspiel:kuhn_poker", opponent="self")        # self-play: the policy plays both seats

`seat` 0 or 1 is the policy's seat; "alternate" takes seat `seed % 2`, so a run's episodes play both. Chance (the
deal, the board card) is drawn from a generator seeded by `reset(seed)`, the opponent (envs/opponents.py) is seeded
by it too: one seed, one game, whatever the policy plays differently. The observation is what the seat knows, as
text (envs/openspiel_games.py), and a last line with the legal moves; the env's `actions` are every move of the
game, legal or not here.

Reward: the seat's return when the game ends (OpenSpiel's `returns()`: +1 / 0 / -1 on a board, the chips won in
poker), 0 before. A move that is not legal here ends the game, not played out: the seat gets `illegal_reward` (by
default the game's least utility less 0.5, worse than any loss, so that it is never a way out: -1.5 on a board,
SPIRAL's penalty). Success: a positive return; progress: the return scaled from the game's least utility (0) to its
most (1). `info["metrics"]` at the end: `win`, `draw`, `loss`, `illegal` (1 or 0), logged as env/<name>.

Self-play (`opponent: "self"`): the policy plays every seat; `seat` is the seat to move, whose observation each
step returns (the game's first mover's at reset: `seat` is not asked). Reward 0 at every step; at the end
`info["seat_returns"]` gives each seat's return (an illegal move: `illegal_reward` to the offender, 0 to the other),
which the collector turns into one episode per seat (rollout/seats.py); the metrics are `first_seat_win`, `draw`
and `illegal`.

`state_key()`: the seat's information state (OpenSpiel's `information_state_string`, which for a board game is its
move history) or, for perfect-information games, the position (`observation_string`): GiGPO groups turns whose
seat faces the same one. `expert_action()`: a uniformly random legal move (the format-only warm start: the
strategy must come from play), drawn from a generator of its own, seeded by `reset`.
"""

from __future__ import annotations

import random

import pyspiel

from horizonrl.envs.base import Instruction, state_digest
from horizonrl.envs.openspiel_games import TEXTS, GameText
from horizonrl.envs.two_player import SELF_PLAY, outcome_metrics, self_play_end
from horizonrl.envs.opponents import Opponent, make_opponent


class OpenSpielEnv:
    translations: dict[str, str] = {}

    def __init__(self, game: str, seat: int | str = "alternate", opponent: str = "random",
                 illegal_reward: float | None = None):
        """`opponent`: "self" (self-play) or an opponent of envs/opponents.py."""
        if game not in TEXTS:
            raise ValueError(f"openspiel game {game!r} has no text form here; known: {', '.join(sorted(TEXTS))}")
        if seat not in (0, 1, "alternate"):
            raise ValueError(f"seat must be 0, 1 or 'alternate'; got {seat!r}")
        self.game_name, self.seat_choice = game, seat
        self.game = pyspiel.load_game(game)
        self.illegal_reward = self.game.min_utility() - 0.5 if illegal_reward is None else illegal_reward
        self.text: GameText = TEXTS[game]
        self.opponent: Opponent | None = None if opponent == SELF_PLAY else make_opponent(opponent, self.game)
        self.actions = list(self.text.move_names)
        self.default_action = self.actions[0]
        self.map_symbols = self.text.symbols
        self.state = None
        self.seat = 0
        self.chance, self.expert = random.Random(0), random.Random("expert 0")

    @property
    def unwrapped(self):
        return self.state

    @property
    def instruction(self) -> Instruction:
        return Instruction(intro=self.text.intro, mission=self.text.mission, actions=dict(self.text.moves),
                           tips=[*self.text.tips, "a move that is not legal loses the game"])

    def reset(self, seed: int) -> tuple[str, dict]:
        self.seat = seed % 2 if self.seat_choice == "alternate" else self.seat_choice
        self.chance, self.expert = random.Random(seed), random.Random(f"expert {seed}")
        if self.opponent is not None:
            self.opponent.reset(seed)
        self.state = self.game.new_initial_state()
        self.play_others()
        return self.render(), {}

    def play_others(self) -> None:
        """Chance and the opponent move until it is the seat's turn or the game is over; in self-play, chance moves
        and the seat becomes the player to move."""
        while not self.state.is_terminal() and (self.state.is_chance_node() or self.opponent is not None
                                                 and self.state.current_player() != self.seat):
            if self.state.is_chance_node():
                outcomes, weights = zip(*self.state.chance_outcomes())
                self.state.apply_action(self.chance.choices(outcomes, weights)[0])
            else:
                self.state.apply_action(self.opponent.act(self.state))
        if self.opponent is None and not self.state.is_terminal():
            self.seat = self.state.current_player()

    def legal_names(self) -> list[str]:
        return [self.actions[a] for a in self.state.legal_actions()]

    def render(self) -> str:
        if self.state.is_terminal():
            return f"The game is over. Your result: {self.state.returns()[self.seat]:+g}."
        return f"{self.text.describe(self.state, self.seat)}\nLegal moves: {', '.join(self.legal_names())}."

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if action not in self.actions:
            raise ValueError(f"unknown action {action!r}; valid: {self.actions}")
        if self.state.is_terminal():
            raise RuntimeError("step after the game ended: call reset(seed)")
        move = self.actions.index(action)
        if move not in self.state.legal_actions():
            message = f"{action} is not a legal move here (legal: {', '.join(self.legal_names())}): you lose the game."
            if self.opponent is None:
                returns = [self.illegal_reward if seat == self.seat else 0.0 for seat in range(2)]
                return message, 0.0, True, False, self_play_end(returns, True, self.progress(returns[0]))
            return message, self.illegal_reward, True, False, self.outcome(self.illegal_reward, illegal=True)
        mover = self.seat
        self.state.apply_action(move)
        self.play_others()
        if not self.state.is_terminal():
            return self.render(), 0.0, False, False, {}
        if self.opponent is None:
            self.seat = mover
            returns = self.state.returns()
            return self.render(), 0.0, True, False, self_play_end(returns, False, self.progress(returns[0]))
        result = self.state.returns()[self.seat]
        return self.render(), float(result), True, False, self.outcome(result)

    def progress(self, result: float) -> float:
        """A return scaled from the game's least utility (0) to its most (1)."""
        low, high = self.game.min_utility(), self.game.max_utility()
        return min(max((result - low) / (high - low), 0.0), 1.0)

    def outcome(self, result: float, illegal: bool = False) -> dict:
        return {"success": result > 0, "progress": self.progress(result), "metrics": outcome_metrics(result, illegal)}

    def state_key(self) -> str:
        perfect = self.game.get_type().information == pyspiel.GameType.Information.PERFECT_INFORMATION
        seen = self.state.observation_string(self.seat) if perfect else self.state.information_state_string(self.seat)
        return state_digest(self.game_name, self.seat, seen)

    def stand_at(self, state) -> None:
        """Put the env at `state` (any state of its game where a player moves), the seat being that player's: how
        a policy is read at every information state (policy_table.py)."""
        self.state, self.seat = state, state.current_player()

    def expert_reason(self) -> str:
        """The expert's reason at the current state: the legal moves it picks from, then the game's recap where it
        has one (what the move depends on, the last words before the ACTION line: a small model reads them there
        far more easily than in the prompt)."""
        legal = f"legal moves: {', '.join(self.legal_names())}"
        recap = "I pick one" if self.text.recap is None else self.text.recap(self.state, self.seat)
        return f"{legal}; {recap}"

    def expert_action(self) -> tuple[str, str]:
        """A random legal move (the format-only warm start), with `expert_reason`."""
        if self.state is None:
            raise RuntimeError("call reset(seed) before expert_action")
        return self.expert.choice(self.legal_names()), self.expert_reason()
