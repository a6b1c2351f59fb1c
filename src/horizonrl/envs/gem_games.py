"""Which of GEM's games (gem-llm) horizonrl plays as `gem:<game>`, and why each other one is refused.

No import of gem here: the env registry lists these ids whether or not gem-llm is installed (envs/gem_env.py
plays them).
"""

from __future__ import annotations

GAME_ACTION_LIMIT = 128
# the games listed by `horizonrl envs` (each refusal(game) is None): fixed action lists of at most
# GAME_ACTION_LIMIT moves (tests/integration/test_gem.py counts them)
GAMES = ("GuessTheNumber-v0-easy", "GuessTheNumber-v0-hard", "Mastermind-v0-easy", "Minesweeper-v0-easy",
         "Minesweeper-v0-hard", "Sudoku-v0-easy", "TowerofHanoi-v0-easy", "TowerofHanoi-v0-hard", "Game2048-v0-easy",
         "Game2048-v0-hard", "FifteenPuzzle-v0-easy", "FifteenPuzzle-v0-hard", "Sokoban-v0-easy", "Sokoban-v0-hard")
NEEDS_WORDS = ("Wordle", "Hangman", "Crosswords", "WordSearch")


def refusal(game: str) -> str | None:
    """Why `gem:<game>` cannot be played here, in one line; None when it can."""
    if game in GAMES:
        return None
    if not game.split("-")[0].isalnum() or ":" in game:
        return (f"gem:{game} is not one of GEM's games: GEM's math, code, QA and reasoning-gym tasks load their data "
                "from the Hugging Face hub, which this offline adapter does not reach")
    if game.startswith(NEEDS_WORDS):
        return f"gem:{game} needs NLTK's word list (nltk.download('words')), which this offline adapter does not fetch"
    if game.endswith("-random"):
        return (f"gem:{game} draws its size anew each episode, and an env's action list and instruction are fixed: "
                "play its -easy or -hard variant")
    if game in ("Mastermind-v0-hard", "Sudoku-v0-hard"):
        return f"gem:{game} has more actions than the {GAME_ACTION_LIMIT} an action list may hold"
    return f"gem:{game} is not a GEM game this adapter knows; known: {', '.join(GAMES)}"
