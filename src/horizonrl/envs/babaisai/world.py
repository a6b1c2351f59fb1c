"""World: the grid, the objects and word blocks on it, and how a move changes them.

Cells are `(x, y)` with `0 <= x < width` growing to the right and `0 <= y < height` growing
downwards; everything outside is the border, which nothing can enter. An entity is an object (a
noun such as `baba`, whose behaviour comes from the active rules) or a word block (always PUSH and
nothing else). Any number of entities may share a cell.

One move, in a direction:
1. every object that IS YOU tries to step one cell, front-most first; stepping into a cell pushes
   every PUSH entity there one cell further, recursively, and the whole chain moves only if none of
   it would leave the grid or enter a cell holding a STOP entity that is not also PUSH;
   each entity moves at most once per move;
2. the rules are read again from the word blocks;
3. every YOU object sharing a cell with a DEFEAT object (itself included) is destroyed;
4. the level is won if a YOU object shares a cell with a WIN object (itself included), and lost if
   no object IS YOU any more.
"""

from __future__ import annotations

from horizonrl.envs.babaisai.rules import Rule, parse_rules

DIRECTIONS = {"up": (0, -1), "right": (1, 0), "down": (0, 1), "left": (-1, 0)}
WORD_PROPERTIES = frozenset({"push"})
NO_PROPERTIES: frozenset[str] = frozenset()


class Entity:
    """An object (`word=False`, `name` is its noun) or a word block (`word=True`, `name` is its word)."""

    __slots__ = ("name", "word", "x", "y")

    def __init__(self, name: str, x: int, y: int, word: bool = False):
        self.name, self.x, self.y, self.word = name, x, y, word

    @property
    def cell(self) -> tuple[int, int]:
        return self.x, self.y

    def __repr__(self) -> str:
        return f"{'word' if self.word else 'object'} {self.name!r} at ({self.x}, {self.y})"


def obj(name: str, x: int, y: int) -> Entity:
    return Entity(name, x, y)


def word(name: str, x: int, y: int) -> Entity:
    return Entity(name, x, y, word=True)


class World:
    """A level in play: mutate it with `move`; `rules`, `won` and `lost` describe the result."""

    def __init__(self, width: int, height: int, entities: list[Entity]):
        for e in entities:
            if not (0 <= e.x < width and 0 <= e.y < height):
                raise ValueError(f"{e!r} lies outside the {width}x{height} grid")
        self.width, self.height = width, height
        self.entities = list(entities)
        self._read_rules()

    def copy(self) -> World:
        twin = object.__new__(World)
        twin.width, twin.height, twin.rules, twin._properties = self.width, self.height, self.rules, self._properties
        twin.entities = [Entity(e.name, e.x, e.y, e.word) for e in self.entities]
        return twin

    def key(self) -> tuple:
        """A hashable snapshot: equal keys mean equal worlds (identical entities are interchangeable)."""
        return tuple(sorted((e.name, e.word, e.x, e.y) for e in self.entities))

    def properties(self, entity: Entity) -> frozenset[str]:
        return WORD_PROPERTIES if entity.word else self._properties.get(entity.name, NO_PROPERTIES)

    def at(self, x: int, y: int) -> list[Entity]:
        return [e for e in self.entities if e.x == x and e.y == y]

    @property
    def you(self) -> list[Entity]:
        """The objects that ARE YOU, in reading order (top to bottom, then left to right)."""
        return sorted((e for e in self.entities if "you" in self.properties(e)), key=lambda e: (e.y, e.x))

    @property
    def won(self) -> bool:
        win_cells = {e.cell for e in self.entities if "win" in self.properties(e)}
        return any(e.cell in win_cells for e in self.you)

    @property
    def lost(self) -> bool:
        return not self.you

    def move(self, direction: str) -> None:
        """Apply one move (`up`, `right`, `down` or `left`) as the module docstring describes."""
        dx, dy = DIRECTIONS[direction]
        at: dict[tuple[int, int], list[Entity]] = {}
        for e in self.entities:
            at.setdefault(e.cell, []).append(e)
        moved: set[int] = set()
        for mover in sorted(self.you, key=lambda e: -(e.x * dx + e.y * dy)):
            chain = self._chain(mover, dx, dy, at, moved)
            if chain is None:
                continue
            for e in {id(e): e for e in chain}.values():
                at[e.cell].remove(e)
                e.x, e.y = e.x + dx, e.y + dy
                at.setdefault(e.cell, []).append(e)
                moved.add(id(e))
        self._read_rules()
        defeat_cells = {e.cell for e in self.entities if "defeat" in self.properties(e)}
        doomed = {id(e) for e in self.you if e.cell in defeat_cells}
        if doomed:
            self.entities = [e for e in self.entities if id(e) not in doomed]

    def _chain(self, entity: Entity, dx: int, dy: int, at: dict, moved: set[int]) -> list[Entity] | None:
        """The entities that move if `entity` steps by (dx, dy), or None if the step is blocked."""
        if id(entity) in moved:
            return None
        x, y = entity.x + dx, entity.y + dy
        if not (0 <= x < self.width and 0 <= y < self.height):
            return None
        chain = [entity]
        for other in at.get((x, y), ()):
            props = self.properties(other)
            if "push" in props:
                pushed = self._chain(other, dx, dy, at, moved)
                if pushed is None:
                    return None
                chain += pushed
            elif "stop" in props:
                return None
        return chain

    def _read_rules(self) -> None:
        self.rules: list[Rule] = parse_rules((e.name, e.cell) for e in self.entities if e.word)
        properties: dict[str, set[str]] = {}
        for rule in self.rules:
            properties.setdefault(rule.noun, set()).add(rule.property)
        self._properties = {noun: frozenset(props) for noun, props in properties.items()}
