"""A TextArena two-player game as a self-play TextEnv (`textarena:<id>`): the policy plays every seat, or a seat
opponent (rollout/seat_opponents.py) plays one.

    env = envs.make("textarena:TicTacToe-v0")          # opponent: self, the only one TextArena games have here

TextArena (`pip install -e ".[games]"`, MIT) runs a game as `reset(num_players=2, seed)`, `get_observation() ->
(player, text)`, `step("[move]")` and `close() -> (rewards, game info)`. Its observation is the whole game log,
message after message ("[GAME] ...", "[Player 1] ..."); the env keeps the first (the rules) and the last `window`
(the moves since the seat's last turn and the state now), as the agent's memory window keeps the last turns. An
action is a name of `GAMES[id]` (a TicTacToe cell "4", Kuhn poker's "bet"), sent as "[<name>]". A move TextArena
refuses gets one more try (the same seat moves again, as TextArena rules), then loses the game. TextArena seeds
and draws from the process-wide `random`: each game plays on its own copy (envs/base.PrivateRandom), so an episode
depends only on its seed.

Self-play, as OpenSpielEnv's (envs/openspiel_env.py): `seat` is the seat to move, reward 0 at each step, and at the
end `info["seat_returns"]` (TextArena's rewards: +1 / -1, 0 for a draw) and the metrics `first_seat_win`, `draw`
and `illegal` (the last mover's move was refused twice).

What it simplifies: only the games of `GAMES` (those whose moves are a short list of names) are adapted; every other
id is refused with its reason (`textarena_games.refusal`: free-text moves, NLTK data, an API key, Python 3.12, more
players, one player). There is no fixed opponent (TextArena has no bot) and no expert.
"""

from __future__ import annotations

import re

import textarena

from horizonrl.envs.base import Instruction, PrivateRandom, state_digest
from horizonrl.envs.textarena_games import GAMES, refusal
from horizonrl.envs.two_player import SELF_PLAY, self_play_end

MESSAGE = re.compile(r"(?m)^(?=\[(?:GAME|Player \d+)\] )")   # where each message of the log starts


class TextArenaEnv:
    translations: dict[str, str] = {}

    def __init__(self, game: str, opponent: str = SELF_PLAY, window: int = 4):
        if game not in GAMES:
            raise ValueError(refusal(game))
        if opponent != SELF_PLAY:
            raise ValueError(f"textarena games have no fixed opponent here (TextArena has no bot); opponent must be "
                             f"{SELF_PLAY!r}, and a model or a pool plays a seat through `selfplay` (got {opponent!r})")
        if window < 1:
            raise ValueError(f"window must be >= 1 message, got {window}")
        self.game_name, self.window = game, window
        self.about, self.actions = GAMES[game][0], list(GAMES[game][1])
        self.default_action = self.actions[0]
        self.private_random = PrivateRandom()     # TextArena seeds and deals from the process-wide `random`
        self.game = None                          # made by each reset
        self.seat, self.log, self.done = 0, "", False

    @property
    def unwrapped(self):
        return self.game

    @property
    def instruction(self) -> Instruction:
        return Instruction(intro=f"You are playing {self.about} against an opponent (TextArena's {self.game_name})",
                           mission="win the game: the observation gives its rules, the moves so far and the state",
                           actions={name: f"the move [{name}]" for name in self.actions},
                           tips=["a move the game refuses may be tried once more; a second refusal loses the game"])

    def reset(self, seed: int) -> tuple[str, dict]:
        with self.private_random():         # a game of its own: a TextArena env keeps its earlier episodes' log
            self.game = textarena.make(self.game_name)
            self.game.reset(num_players=2, seed=seed)
        self.done = False
        return self.observe(), {}

    def observe(self) -> str:
        """The seat to move's observation, windowed (module docstring); `seat` becomes that seat."""
        self.seat, self.log = self.game.get_observation()
        messages = [m.strip() for m in MESSAGE.split(self.log) if m.strip()]
        kept = messages if len(messages) <= self.window + 1 else [messages[0], *messages[-self.window:]]
        return "\n".join(kept)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if action not in self.actions:
            raise ValueError(f"unknown action {action!r}; valid: {self.actions}")
        if self.done:
            raise RuntimeError("step after the game ended: call reset(seed)")
        mover = self.seat
        with self.private_random():
            self.done, _ = self.game.step(f"[{action}]")
        if not self.done:
            return self.observe(), 0.0, False, False, {}
        with self.private_random():
            rewards, info = self.game.close()
        returns = [float(rewards[seat]) for seat in (0, 1)]
        illegal = bool(info[mover]["invalid_move"])
        return f"The game is over: {info[mover].get('reason', '')}", 0.0, True, False, \
            self_play_end(returns, illegal, (returns[0] + 1) / 2)

    def state_key(self) -> str:
        return state_digest(self.game_name, self.seat, self.log)
