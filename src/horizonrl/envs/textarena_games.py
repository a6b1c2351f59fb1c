"""The TextArena games adapted here (`textarena:<id>`, envs/textarena_env.py): each id, what the game is, and its
move names (sent to TextArena as "[<name>]"), and why each other TextArena game is refused (`refusal`). Kept apart
from the env so that the env registry lists them, and a config names the reason, without importing TextArena.

`REFUSED` was read from TextArena 0.7.4 on Python 3.11, offline: `ta.make(id).reset(num_players=2)` of each of its
238 ids but the -train and -raw copies (tests/integration/test_textarena.py plays each name again and checks the
reason). The 110 ids that play two seats offline take free-text moves (a bid, an offer, a chess move), which no
action list holds: they are refused as not adapted."""

from __future__ import annotations


def cells(count: int) -> list[str]:
    return [str(cell) for cell in range(count)]


GAMES: dict[str, tuple[str, list[str]]] = {   # id -> (what the game is, its move names)
    "TicTacToe-v0": ("tic-tac-toe on cells 0-8 (0 top left, 8 bottom right)", cells(9)),
    "ConnectFour-v0": ("connect four on columns 0-6", cells(7)),
    "KuhnPoker-v0": ("Kuhn poker over 3 rounds (cards J < Q < K)", ["check", "bet", "call", "fold"]),
    "Nim-v0": ("Nim on piles 0-2: a move 'p q' takes q objects from pile p; who takes the last wins",
               [f"{pile} {quantity}" for pile in range(3) for quantity in range(1, 6)]),
}


REFUSED: dict[str, tuple[str, ...]] = {       # why a TextArena game cannot be played here -> its names (id's head)
    "needs NLTK's word lists or corpora, which this offline adapter does not download": (
        "Codenames", "DontSayIt", "Hangman", "LetterAuction", "SpellingBee", "WordChains", "WordLadder", "WordSearch",
        "Wordle"),
    "needs an OpenRouter API key (a hosted model judges or plays in it)": (
        "Debate", "GuessWho", "ScenarioPlanning", "TwentyQuestions"),
    "is written in Python 3.12's syntax (f-strings that nest quotes), which Python 3.11 does not parse": (
        "Checkers", "Chess", "IteratedStagHunt", "Klondike", "ReverseTicTacToe", "UltimateTexasHoldem"),
    "is played by three or more players, and self-play here has two seats": (
        "CharacterConclave", "SecretMafia", "SettlersOfCatan", "Taboo", "ThreePlayerGOPS", "ThreePlayerIPD",
        "ThreePlayerTicTacToe"),
    "reads data files that TextArena's wheel does not ship": ("ScorableGames", "UsedCarNegotiation"),
    "imports a module that TextArena neither ships nor declares (gym, textarena.envs.UsedCar)": (
        "BabyAiText", "UsedCar"),
    "is a one-player puzzle (textarena: plays two-player games; horizonrl's own envs cover several of these)": (
        "2048", "Bandit", "Blackjack", "Countdown", "Crosswords", "Cryptarithm", "FifteenPuzzle", "FrozenLake",
        "GuessTheNumber", "LightsOut", "LogicPuzzle", "Mastermind", "Minesweeper", "PegJump", "RushHour", "Secretary",
        "Set", "Slitherlink", "Sokoban", "Sudoku", "ThreeCardMonte", "TowerOfHanoi"),
}


def refusal(game: str) -> str:
    """Why `textarena:<game>` is not played here, in one line (for a game not in GAMES)."""
    name = game.split("-v")[0]
    for reason, names in REFUSED.items():
        if name in names:
            return f"textarena:{game} {reason}"
    return (f"textarena:{game} is not adapted here; adapted: {', '.join(GAMES)} (the rest of TextArena's two-player "
            "games take free-text moves, a bid, an offer, a chess move, which no action list holds)")
