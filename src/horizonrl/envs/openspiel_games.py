"""OpenSpiel's two-player games as text (`openspiel:<game>`): each move named, and what a seat knows spelled out.

OpenSpiel (`pip install -e ".[games]"`, Apache-2.0) gives a state's information as codes: Kuhn poker's `'2pb'`
(the seat's card, then the passes and bets so far), Leduc's `'[Private: 5][Round 2][Pot: 6]...[Round1: 2 1]'`
(action ids). A `GameText` names each action id (`move_names`, the env's action names, one per id) and writes what
the seat `describe`s: its cards, the moves so far by "you" and "the opponent", the board with coordinates. Only
what the seat may know reaches the text: the information state (imperfect-information games) or the board.

    kuhn_poker     cards Jack < Queen < King, one each; pass or bet one chip; showdown: the higher card
    leduc_poker    six cards (two of each rank), a board card after the first round; fold, call or raise
    tic_tac_toe    cells a1..c3 (column letter, row number)
    connect_four   columns a..g
    liars_dice     one die each; bids q-f (at least q dice show face f, 6s wild) or liar

Board games draw their board (x, o and . for empty) under a header of the column letters, a row number before each
row; the symbols are `map_symbols` (a tiny model's tokenizer keeps each a token of its own).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

KUHN_CARDS = ("Jack", "Queen", "King")
KUHN_RANKS = ("the lowest", "the middle one", "the highest")   # of the three: the mission names no card
LEDUC_RANKS = ("Jack", "Queen", "King")        # OpenSpiel's card c has rank c // 2 (two suits)
LEDUC_MOVES = {0: "folded", 1: "called", 2: "raised"}
KUHN_MOVES = {"p": "passed", "b": "bet"}


@dataclass(frozen=True)
class GameText:
    """How one OpenSpiel game reads as text: what the agent is told (`intro`, `mission`, `moves` with a line each,
    `tips`), the name of each action id (`move_names`, indexed by id), and `describe(state, seat)`: what the seat
    knows, as text. `recap(state, seat)`, where a game has one, says in a few words what the seat's move depends
    on (the moves so far and its card): the warm start's reason ends with it (OpenSpielEnv.expert_reason)."""

    intro: str
    mission: str
    move_names: list[str]
    moves: dict[str, str]
    describe: Callable[[object, int], str]
    tips: list[str] = field(default_factory=list)
    symbols: str = ""
    recap: Callable[[object, int], str] | None = None


def seat_line(seat: int) -> str:
    return f"You are player {seat + 1} of 2 ({'you move first' if seat == 0 else 'the opponent moves first'})."


def by_whom(index: int, first: int, seat: int) -> str:
    """"you" or "the opponent" for the move at `index` of a sequence whose first move is `first`'s, turns
    alternating."""
    return "you" if (first + index) % 2 == seat else "the opponent"


def kuhn_facts(state, seat: int) -> tuple[str, str]:
    """The seat's card and the moves so far, in words."""
    code = state.information_state_string(seat)         # the seat's card, then p / b per move
    bets = [f"{by_whom(i, 0, seat)} {KUHN_MOVES[move]}" for i, move in enumerate(code[1:])]
    return KUHN_CARDS[int(code[0])], ", ".join(bets) if bets else "none"


def kuhn(state, seat: int) -> str:
    card, moves = kuhn_facts(state, seat)
    rank = KUHN_RANKS[KUHN_CARDS.index(card)]
    return "\n".join([seat_line(seat), f"Your card: {card} ({rank} of the three).", f"Moves so far: {moves}."])


def kuhn_recap(state, seat: int) -> str:
    card, moves = kuhn_facts(state, seat)
    return f"moves so far: {moves}; my card: {card}"


def leduc_fields(state, seat: int) -> dict[str, str]:
    """The fields of the seat's information state: `[Private: 5][Round 2][Pot: 6]...` as {"Private": "5", ...}."""
    return dict(re.findall(r"\[([^:\]]+): ([^\]]*)\]", state.information_state_string(seat)))


def leduc_moves(fields: dict[str, str], round_name: str, seat: int) -> str:
    said = [f"{by_whom(i, 0, seat)} {LEDUC_MOVES[int(m)]}" for i, m in enumerate(fields.get(round_name, "").split())]
    return ", ".join(said) if said else "none"


def leduc(state, seat: int) -> str:
    fields = leduc_fields(state, seat)
    board = fields.get("Public")
    lines = [seat_line(seat) + " Player 1 moves first in each round.",
             f"Your card: {LEDUC_RANKS[int(fields['Private']) // 2]}.",
             f"Board card: {LEDUC_RANKS[int(board) // 2] if board else 'not dealt yet (it comes after round 1)'}."]
    for round_name in ("Round1", "Round2"):
        if round_name == "Round1" or board:
            lines.append(f"Round {round_name[-1]} moves: {leduc_moves(fields, round_name, seat)}.")
    money = fields["Money"].split()
    lines.append(f"Pot: {fields['Pot']} chips. Your chips left: {money[seat]}.")
    return "\n".join(lines)


def leduc_recap(state, seat: int) -> str:
    fields = leduc_fields(state, seat)
    board = fields.get("Public")
    this_round = "Round2" if board else "Round1"
    return (f"board card: {LEDUC_RANKS[int(board) // 2] if board else 'none'}; this round: "
            f"{leduc_moves(fields, this_round, seat)}; my card: {LEDUC_RANKS[int(fields['Private']) // 2]}")


def liars_dice(state, seat: int) -> str:
    die, *bids = state.information_state_string(seat).split()          # the seat's die, then the bids so far
    said = [f"{by_whom(i, 0, seat)} bid {bid}" for i, bid in enumerate(bids)]
    return "\n".join([seat_line(seat), f"Your die: {die}.", f"Bids so far: {', '.join(said) if said else 'none'}."])


def board(state, seat: int) -> str:
    """A board game whose observation string is its rows, one a line (OpenSpiel's tic_tac_toe, connect_four)."""
    rows = state.observation_string(seat).strip().splitlines()
    columns = " ".join("abcdefgh"[:len(rows[0])])
    drawn = [f"  {columns}"] + [f"{number} {' '.join(row)}" for number, row in enumerate(rows, 1)]
    return "\n".join([seat_line(seat), f"You play {'x' if seat == 0 else 'o'}.", *drawn])


def cells(width: int, height: int) -> list[str]:
    """Cell names by action id row * width + column: column letter, row number (a1 top left)."""
    return [f"{'abcdefgh'[column]}{row + 1}" for row in range(height) for column in range(width)]


TEXTS: dict[str, GameText] = {
    "kuhn_poker": GameText(
        intro="You are playing Kuhn poker against an opponent",
        mission="win chips: each player antes 1 chip and gets one of three cards (the third stays unseen); at the "
                "showdown the higher card takes the pot",
        move_names=["pass", "bet"],
        moves={"pass": "check, or fold when the opponent has bet", "bet": "add one chip, or call the opponent's bet"},
        describe=kuhn, recap=kuhn_recap,
        tips=["passing after a bet folds: the opponent takes the pot",
              "two passes, or a bet called, go to the showdown"]),
    "leduc_poker": GameText(
        intro="You are playing Leduc poker against an opponent",
        mission="win chips: a deck of two Jacks, two Queens and two Kings; each player antes 1 chip and gets one "
                "card, a board card is dealt after round 1; a pair with the board card wins, else the higher card",
        move_names=["fold", "call", "raise"],
        moves={"fold": "give up the pot", "call": "match the opponent's bet (or check when there is none)",
               "raise": "raise by 2 chips in round 1, 4 in round 2 (at most two raises a round)"},
        describe=leduc, recap=leduc_recap),
    "tic_tac_toe": GameText(
        intro="You are playing tic-tac-toe against an opponent",
        mission="get three of your marks in a row, a column or a diagonal before the opponent does",
        move_names=cells(3, 3), moves={name: f"put your mark on cell {name}" for name in cells(3, 3)}, describe=board,
        tips=["cells are named by column letter and row number: a1 is the top left, c3 the bottom right",
              "only an empty cell (.) can be played"], symbols="xo."),
    "connect_four": GameText(
        intro="You are playing connect four against an opponent",
        mission="get four of your marks in a row, a column or a diagonal before the opponent does",
        move_names=list("abcdefg"), moves={c: f"drop your mark into column {c}" for c in "abcdefg"}, describe=board,
        tips=["a mark falls to the lowest empty cell of its column; row 6 is the bottom", "a full column cannot be "
              "played"], symbols="xo."),
    "liars_dice": GameText(
        intro="You are playing liar's dice against an opponent",
        mission="win the call: each player rolls one six-sided die and sees only their own; players take turns "
                "raising a bid on both dice until one calls liar: a bid that holds makes the caller lose, one that "
                "does not makes the bidder lose",
        move_names=[f"{quantity}-{face}" for quantity in (1, 2) for face in range(1, 7)] + ["liar"],
        moves={**{f"{q}-{f}": f"bid that at least {q} of the two dice show {f}" for q in (1, 2) for f in range(1, 7)},
               "liar": "call the last bid false"},
        describe=liars_dice,
        tips=["6s are wild: a 6 counts as any face", "a bid must be higher than the last one (the legal moves list "
              "them)", "calling liar on a bid that holds loses; on one that does not, wins"]),
}
