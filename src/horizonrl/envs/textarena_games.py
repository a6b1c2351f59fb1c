"""The TextArena games adapted here (`textarena:<id>`, envs/textarena_env.py): each id, what the game is, and its
move names (sent to TextArena as "[<name>]"). Kept apart from the env so that the env registry lists them without
importing TextArena."""

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
