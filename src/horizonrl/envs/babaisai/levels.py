"""Levels: the four procedural task families, each a deterministic function of its seed.

Every level has BABA IS YOU and X IS WIN for a target X in door/key/ball, and no other active rule
unless the family says so. Rules are spelled by word blocks whose cells and side neighbours touch
no other word, so no rule forms by accident. A layout is redrawn unless its rules are exactly the
family's and the intended solution exists: baba walks to the target without touching a word or a
STOP object, or (sealed rooms) walks to a word, pushes it once so that only WALL IS STOP breaks,
then walks through the wall to the target. Shortcuts that rewrite other rules (WALL IS WIN, ...)
are part of the game and are not prevented.

* `goto_win-distr_obj`: one room, baba, the target and a distractor object of another kind.
* `two_room-goto_win`: a wall column with one opening splits the grid; WALL IS STOP; baba in one
  room, the target and all rules in the other, so no rule can be changed before crossing. No word
  lies beside the opening or next to those cells.
* `two_room-goto_win-distr_obj_rule`: as above plus a distractor object and distractor text that
  spells no rule: `Y is` (property missing), `is win` (noun missing) or `Y` and `is` out of line.
* `two_room-maybe_break_stop-goto_win`: as `two_room-goto_win` but with the rules in baba's room,
  and for about half the seeds the wall column has no opening, so the target is reached only by
  changing a rule, typically pushing a word out of WALL IS STOP and walking through the wall. Rules
  lie off the border rows and, when vertical, off the room's edge columns, so a word of theirs can
  be pushed sideways out of line.
"""

from __future__ import annotations

import random

from horizonrl.envs.babaisai.rules import Rule
from horizonrl.envs.babaisai.world import DIRECTIONS, Entity, World, obj, word

TASKS = ("goto_win-distr_obj", "two_room-goto_win", "two_room-goto_win-distr_obj_rule",
         "two_room-maybe_break_stop-goto_win")
TARGETS = ("door", "key", "ball")
Room = tuple[int, int, int, int]   # x0, x1, y0, y1, inclusive


class _Redraw(Exception):
    """The layout drawn so far leaves no room for the next piece."""


class _Layout:
    def __init__(self, rng: random.Random, width: int, height: int):
        self.rng, self.width, self.height = rng, width, height
        self.entities: list[Entity] = []
        self.taken: set[tuple[int, int]] = set()
        self.near_words: set[tuple[int, int]] = set()   # no new word may lie on or beside these

    def words(self, names: list[str], room: Room, vertical: bool, margin: bool = False,
              offsets: list[tuple[int, int]] | None = None) -> None:
        """Put word blocks at `offsets` (default: a line) from a random start in `room`.

        The words' cells must be free and their side neighbours hold no word. With `margin`, a
        line stays off the border rows (horizontal) or off the room's edge columns (vertical).
        """
        x0, x1, y0, y1 = room
        if offsets is None:
            offsets = [(0, i) if vertical else (i, 0) for i in range(len(names))]
        if margin:
            x0, x1 = (x0 + 1, x1 - 1) if vertical else (x0, x1)
            y0, y1 = (y0, y1) if vertical else (max(y0, 1), min(y1, self.height - 2))
        span_x, span_y = max(dx for dx, _ in offsets), max(dy for _, dy in offsets)
        starts = [(x, y) for y in range(y0, y1 - span_y + 1) for x in range(x0, x1 - span_x + 1)
                  if all(self._fits_word(x + dx, y + dy) for dx, dy in offsets)]
        if not starts:
            raise _Redraw
        x, y = self.rng.choice(starts)
        for name, (dx, dy) in zip(names, offsets):
            self._put(word(name, x + dx, y + dy))
            self.near_words.add((x + dx, y + dy))

    def keep_clear(self, cell: tuple[int, int]) -> None:
        """No word block will lie on `cell` or beside it."""
        self.near_words.add(cell)

    def rule(self, noun: str, prop: str, room: Room, margin: bool = False) -> None:
        self.words([noun, "is", prop], room, vertical=self.rng.random() < 0.25, margin=margin)

    def object(self, name: str, room: Room) -> Entity:
        x0, x1, y0, y1 = room
        cells = [(x, y) for y in range(y0, y1 + 1) for x in range(x0, x1 + 1) if (x, y) not in self.taken]
        if not cells:
            raise _Redraw
        entity = obj(name, *self.rng.choice(cells))
        self._put(entity)
        return entity

    def _fits_word(self, x: int, y: int) -> bool:
        neighbours = ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1))
        return (x, y) not in self.taken and not any(c in self.near_words for c in ((x, y), *neighbours))

    def _put(self, entity: Entity) -> None:
        self.entities.append(entity)
        self.taken.add(entity.cell)


def make_level(task: str, seed: int) -> World:
    """The level of family `task` for `seed`; the same arguments always give the same level."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid: {list(TASKS)}")
    rng = random.Random(f"{task}/{seed}")
    while True:
        try:
            world, rules = _one_room(rng) if task == "goto_win-distr_obj" else _two_rooms(rng, task)
        except _Redraw:
            continue
        if set(world.rules) == rules and not world.won and not world.lost and _has_intended_solution(world):
            return world


def _one_room(rng: random.Random) -> tuple[World, set[Rule]]:
    layout = _Layout(rng, rng.choice((8, 9)), rng.choice((8, 9)))
    room = (0, layout.width - 1, 0, layout.height - 1)
    target, distractor = rng.sample(TARGETS, 2)
    layout.rule("baba", "you", room)
    layout.rule(target, "win", room)
    for name in ("baba", target, distractor):
        layout.object(name, room)
    world = World(layout.width, layout.height, layout.entities)
    return world, {Rule("baba", "you"), Rule(target, "win")}


def _two_rooms(rng: random.Random, task: str) -> tuple[World, set[Rule]]:
    width, height = rng.choice((9, 10)), rng.choice((8, 9))
    layout = _Layout(rng, width, height)
    column = rng.randint(4, width - 5)
    rooms = [(0, column - 1, 0, height - 1), (column + 1, width - 1, 0, height - 1)]
    home, away = rng.sample(rooms, 2)
    sealable = task == "two_room-maybe_break_stop-goto_win"
    opening = rng.random() < 0.5 if sealable else True
    gap = rng.randrange(height) if opening else None
    for y in range(height):
        if y != gap:
            layout.object("wall", (column, column, y, y))
    if gap is not None:
        layout.keep_clear((column - 1, gap))
        layout.keep_clear((column + 1, gap))
    target, distractor = rng.sample(TARGETS, 2)
    for noun, prop in (("baba", "you"), ("wall", "stop"), (target, "win")):
        layout.rule(noun, prop, home if sealable else away, margin=True)
    layout.object("baba", home)
    layout.object(target, away)
    if task == "two_room-goto_win-distr_obj_rule":
        layout.object(distractor, rng.choice(rooms))
        variant = rng.randrange(3)
        names = [[distractor, "is"], ["is", "win"], [distractor, "is"]][variant]
        offsets = [(0, 0), (1, 1)] if variant == 2 else None
        layout.words(names, rng.choice(rooms), vertical=rng.random() < 0.25, offsets=offsets)
    world = World(width, height, layout.entities)
    return world, {Rule("baba", "you"), Rule("wall", "stop"), Rule(target, "win")}


def _has_intended_solution(world: World) -> bool:
    """The intended solution exists (see the module docstring)."""
    baba, target = world.you[0], next(e.cell for e in world.entities if "win" in world.properties(e))
    if _walkable(world, baba.cell, target):
        return True
    if sum(e.name == "wall" and not e.word for e in world.entities) < world.height:
        return False
    wanted = set(world.rules) - {Rule("wall", "stop")}
    for pushed in (e for e in world.entities if e.word):
        for dx, dy in DIRECTIONS.values():
            start = (pushed.x - dx, pushed.y - dy)
            if not (0 <= start[0] < world.width and 0 <= start[1] < world.height):
                continue
            if not _walkable(world, baba.cell, start):
                continue
            after = world.copy()
            mover = after.you[0]
            mover.x, mover.y = start
            after.move(next(name for name, step in DIRECTIONS.items() if step == (dx, dy)))
            if set(after.rules) == wanted and not after.lost and _walkable(after, after.you[0].cell, target):
                return True
    return False


def _walkable(world: World, start: tuple[int, int], goal: tuple[int, int]) -> bool:
    """A path of cells from `start` to `goal` that touches no word block and no STOP object."""
    blocked = {e.cell for e in world.entities if e.word or "stop" in world.properties(e)}
    seen, frontier = {start}, [start]
    while frontier:
        x, y = frontier.pop()
        if (x, y) == goal:
            return True
        for dx, dy in DIRECTIONS.values():
            cell = (x + dx, y + dy)
            if (0 <= cell[0] < world.width and 0 <= cell[1] < world.height and cell not in blocked
                    and cell not in seen):
                seen.add(cell)
                frontier.append(cell)
    return False
