"""Solver: A* search over worlds with the real `World.move`, used by tests to prove levels solvable.

The cost is the number of moves; the heuristic is the Manhattan distance from the nearest YOU
object to the nearest WIN object, or width + height when there is none (a world that broke its WIN
rule is explored late, not never). It never overestimates while the YOU and WIN nouns stay the same
(each move brings a YOU object at most one cell closer), so solutions are shortest unless changing
a YOU or WIN rule is a shortcut. `idle` never helps and is not tried.
"""

from __future__ import annotations

import heapq

from horizonrl.envs.babaisai.world import DIRECTIONS, World


def distance_to_win(world: World) -> int:
    wins = [e.cell for e in world.entities if "win" in world.properties(e)]
    you = [e.cell for e in world.you]
    if not wins or not you:
        return world.width + world.height
    return min(abs(x - u) + abs(y - v) for x, y in you for u, v in wins)


def solve(world: World, keep_rules: bool = False, max_states: int = 200_000) -> list[str] | None:
    """The moves that win from `world` (left unchanged), or None when no sequence of moves wins.

    With `keep_rules`, worlds whose active rules differ from the start's are not explored, so None
    then means the level cannot be won without changing a rule. Raises RuntimeError after
    `max_states` worlds without a verdict, so None is always a proof.
    """
    rules = set(world.rules)
    start = world.copy()
    seen = {start.key()}
    frontier = [(distance_to_win(start), 0, 0, start, [])]
    counter = 0
    while frontier and counter < max_states:
        _, _, _, current, path = heapq.heappop(frontier)
        for direction in DIRECTIONS:
            nxt = current.copy()
            nxt.move(direction)
            if nxt.won:
                return path + [direction]
            key = nxt.key()
            if nxt.lost or key in seen or (keep_rules and set(nxt.rules) != rules):
                continue
            seen.add(key)
            counter += 1
            g = len(path) + 1
            heapq.heappush(frontier, (g + distance_to_win(nxt), -g, counter, nxt, path + [direction]))
    if frontier:
        raise RuntimeError(f"no verdict after {max_states} worlds")
    return None
