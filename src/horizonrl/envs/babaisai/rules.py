"""Rules: sentences `NOUN IS PROPERTY` spelled by word blocks on the map.

A rule is three word blocks in consecutive cells reading noun, `is`, property from left to right
(same row) or from top to bottom (same column); no other reading direction counts. Rules are a pure
function of where the word blocks lie, so moving one word out of line breaks its rule and moving a
word into line forms a new one. Each rule gives every object of its noun that property.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

NOUNS = ("baba", "wall", "door", "key", "ball")
VERB = "is"
PROPERTIES = ("you", "win", "stop", "push", "defeat")
WORDS = NOUNS + (VERB,) + PROPERTIES

Cell = tuple[int, int]


class Rule(NamedTuple):
    noun: str
    property: str

    def __str__(self) -> str:
        return f"{self.noun} is {self.property}"


def parse_rules(words: Iterable[tuple[str, Cell]]) -> list[Rule]:
    """The rules spelled by `(word, (x, y))` blocks, each once, in reading order of their noun.

    Reading order is top to bottom then left to right over the noun's cell; a noun starting both a
    row rule and a column rule gives the row rule first.
    """
    at: dict[Cell, set[str]] = {}
    for word, cell in words:
        at.setdefault(cell, set()).add(word)
    found: list[Rule] = []
    for (x, y) in sorted(at, key=lambda c: (c[1], c[0])):
        for noun in sorted(at[(x, y)] & set(NOUNS)):
            for dx, dy in ((1, 0), (0, 1)):
                if VERB not in at.get((x + dx, y + dy), ()):
                    continue
                for prop in sorted(at.get((x + 2 * dx, y + 2 * dy), set()) & set(PROPERTIES)):
                    rule = Rule(noun, prop)
                    if rule not in found:
                        found.append(rule)
    return found
