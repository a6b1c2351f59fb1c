"""GEM's offline games (gem-llm, Apache-2.0: `pip install -e ".[gem]"`) as TextEnvs: `gem:<game id>`.

    env = envs.make("gem:TowerofHanoi-v0-easy")       # GEM's id "game:TowerofHanoi-v0-easy"

GEM's games read a move from `\\boxed{...}` in free text; here each game has a list of actions (a Hanoi move
"A C", a direction, a guess "7", "reveal 3 2", ...) and the adapter writes the chosen one into `\\boxed{}`
for the game. The observation is the game's answer with its board (GEM's task suffix) after it; the
first is the board alone, the game's rules being the instruction. Success: the episode ended on its own (not
at the turn limit) with the rewards summing to at least 1 (GEM's success reward; it gives no flag);
progress: the rewards' sum, clipped to [0, 1].

Seeding: GEM's `reset(seed)` seeds the process-wide `random` and `np.random`, and some games (2048,
Minesweeper, Mastermind's instructions) draw from them while they play. Each game here plays on a private
copy of both: the process's own streams are set aside around every call into GEM and left as they were, so
two episodes of one seed are the same whatever ran between them, and training's random draws are never moved.

Games whose action list changes between episodes ("-random" ids), whose list is too long to give
(GAME_ACTION_LIMIT), or that need data this adapter does not fetch (NLTK's word list, the Hugging Face hub)
are refused, the reason named (envs/gem_games.py).

`expert_action()` (for `horizonrl sft` and as an oracle) exists for GuessTheNumber (binary search) and Tower of
Hanoi (the shortest solution from the current position).
"""

from __future__ import annotations

import itertools
from typing import Any

import gem

from horizonrl.envs.base import Instruction, PrivateRandom, state_digest
from horizonrl.envs.gem_games import refusal

DIRECTIONS = ["up", "down", "left", "right"]

# per GEM class: the goal, formatted with the game's attributes
GOALS = {
    "GuessTheNumberEnv": "guess the hidden number between {min_number} and {max_number} within {max_turns} guesses; "
                         "each wrong guess is answered with higher or lower",
    "MastermindEnv": "guess the secret code of {code_length} different digits from 1 to {num_numbers} within "
                     "{max_turns} guesses; a black peg is a right digit in the right place, a white peg a right digit "
                     "in the wrong place",
    "MinesweeperEnv": "reveal every cell of the {rows}x{cols} grid that holds no mine (rows and columns count from "
                      "0); flag a cell you think holds a mine",
    "SudokuEnv": "fill every empty cell ('.') of the {scale}x{scale} grid (rows and columns count from 1) so that no "
                 "digit repeats in a row, a column or a box",
    "TowerofHanoiEnv": "move all {num_disks} disks from tower A to tower C within {max_turns} moves; a move takes "
                       "a tower's top disk, never onto a smaller one",
    "Game2048Env": "make a {target_tile} tile within {max_turns} moves; a move slides every tile, and two equal "
                   "tiles that meet merge",
    "FifteenPuzzleEnv": "order the tiles from 1 upwards with the empty space (__) in the bottom-right corner, within "
                        "{max_turns} moves; a move slides the tile next to the empty space into it",
    "SokobanEnv": "push every box (X) onto a target (O) within {max_turns} moves: P is you (S when you stand on a "
                  "target), # a wall, a box on a target shows as √, floor as _",
}


def game_actions(game) -> list[str]:
    """The moves of GEM game `game` (an instance, after its first reset), as written inside `\\boxed{}`."""
    kind = type(game).__name__
    if kind == "GuessTheNumberEnv":
        return [str(n) for n in range(game.min_number, game.max_number + 1)]
    if kind == "MastermindEnv":
        codes = itertools.permutations(range(1, game.num_numbers + 1), game.code_length)
        return [" ".join(map(str, code)) for code in codes]
    if kind == "MinesweeperEnv":
        return [f"{command} {row} {col}" for command in ("reveal", "flag") for row in range(game.rows)
                for col in range(game.cols)]
    if kind == "SudokuEnv":
        return [f"{row} {col} {digit}" for row, col, digit in itertools.product(range(1, game.scale + 1), repeat=3)]
    if kind == "TowerofHanoiEnv":
        return [f"{a} {b}" for a, b in itertools.permutations("ABC", 2)]
    if kind in ("Game2048Env", "FifteenPuzzleEnv", "SokobanEnv"):
        return list(DIRECTIONS)
    raise ValueError(f"no action list for GEM's {kind}")


def guess_expert(game) -> tuple[str, str]:
    """Binary search: the middle of the numbers that the answers so far leave (GEM's `game_number` stands for
    those answers: higher or lower than each guess)."""
    guesses = game.previous_guesses
    low = max((g + 1 for g in guesses if g < game.game_number), default=game.min_number)
    high = min((g - 1 for g in guesses if g > game.game_number), default=game.max_number)
    guess = (low + high) // 2
    return str(guess), f"The number is between {low} and {high}; I guess the middle, {guess}."


def hanoi_expert(game) -> tuple[str, str]:
    """The first move of the shortest way from this position to every disk on tower C: the largest disk not on
    its goal tower needs the smaller ones out of the way on the third tower first (recursively)."""
    tower_of = {disk: tower for tower, disks in game.board.items() for disk in disks}

    def first_move(disk: int, goal: str) -> tuple[str, str] | None:
        if disk == 0:
            return None
        if tower_of[disk] == goal:
            return first_move(disk - 1, goal)
        spare = next(t for t in "ABC" if t not in (tower_of[disk], goal))
        return first_move(disk - 1, spare) or (tower_of[disk], goal)

    source, target = first_move(game.num_disks, "C")
    return f"{source} {target}", f"Disk {game.board[source][-1]} goes from tower {source} to tower {target}."


EXPERTS = {"GuessTheNumber": guess_expert, "TowerofHanoi": hanoi_expert}   # game id's first part -> expert


class GemGame:
    """One GEM game (`game`: its id without GEM's "game:" prefix) as a TextEnv."""

    def __init__(self, game: str):
        reason = refusal(game)
        if reason is not None:
            raise ValueError(reason)
        self.game_id = game
        self._game = None
        self._actions: list[str] = []
        self._private_random = PrivateRandom()
        self._suffix = ""
        self._seed: int | None = None
        self._return = 0.0
        self.translations: dict[str, str] = {}
        expert = EXPERTS.get(game.split("-")[0])
        if expert is not None:     # only games with an expert have expert_action (train/demonstrations.py asks)
            self.expert_action = lambda: expert(self.unwrapped)

    def _make(self):
        with self._private_random():
            return gem.make(f"game:{self.game_id}")

    @property
    def unwrapped(self):
        """GEM's game, made on first use (a constructor only checks its arguments: envs.check_kwargs)."""
        if self._game is None:
            self._game = self._make()
            self._actions = game_actions(self._game)
        return self._game

    @property
    def actions(self) -> list[str]:
        _ = self.unwrapped              # makes the game and its action list
        return self._actions

    @property
    def default_action(self) -> str:
        return self.actions[0]

    @property
    def instruction(self) -> Instruction:
        game = self.unwrapped
        goal = GOALS[type(game).__name__].format(**vars(game))
        return Instruction(intro=f"You are playing {self.game_id.split('-')[0]}, a game from GEM", mission=goal,
                           actions=dict.fromkeys(self.actions, ""))

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        game = self.unwrapped
        with self._private_random():
            game.reset(seed=seed)
        self._suffix, self._seed, self._return = game.get_task_suffix(), seed, 0.0
        return self._suffix, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action not in self._actions:
            raise ValueError(f"unknown action {action!r} for gem:{self.game_id}")
        with self._private_random():
            observation, reward, terminated, truncated, _ = self.unwrapped.step(f"\\boxed{{{action}}}")
        self._return += float(reward)
        self._suffix = self.unwrapped.get_task_suffix()
        if not (terminated or truncated):
            return f"{observation}\n{self._suffix}", float(reward), False, False, {}
        ended = {"success": bool(terminated and not truncated and self._return >= 1.0),
                 "progress": min(1.0, max(0.0, self._return))}
        return observation, float(reward), bool(terminated), bool(truncated), ended

    def state_key(self) -> str:
        """The episode's seed (what it hides: the number, the code, the mines, is drawn from it), the board (GEM's
        suffix) and, for the guessing games, the guesses made so far."""
        guesses = tuple(sorted(map(str, getattr(self.unwrapped, "previous_guesses", ()))))
        return state_digest(self.game_id, self._seed, self._suffix, guesses)
