"""FrozenLake: walk from the start to the goal without falling into a hole, on a random map per seed.

gymnasium's FrozenLake keeps one map for its life (the default 4x4 one unless given `desc`); here every
`reset(seed)` draws a new valid map (`generate_random_map(size, frozen_share, seed)`, a generator of its own:
gymnasium guarantees a path from start to goal) and plays it in gymnasium's FrozenLakeEnv, slippery when asked
(then a move goes sideways with probability 2/3, drawn from the env's generator seeded by `reset`). The map as
text, one row a line, in RAGEN's symbols:

    P  you        _  frozen        O  hole        G  goal        X  you in a hole        √  you on the goal

With `surroundings=True` a last line names what each move would step on ("Around you: left edge, down hole,
right ice, up ice."): RAGEN's lake has no such line, but a model too small to read a grid's columns needs it
(a 0.5M-parameter model fine-tuned on 1,024 expert walks without it wrote "down ice" whatever lay below:
BENCHMARKS.md, "Tiny recipes").

Moves `left`, `down`, `right`, `up` (gymnasium's 0-3); walking into the edge stays. Reward 1 on the goal
(success); a hole ends the episode with 0. `expert_action()`: the first move of a shortest path to the goal
around the holes (breadth-first; on a slippery lake that is what a careful walker would try, not an optimal
policy); its reason reads the cells around, then gives the path.
"""

from __future__ import annotations

from collections import deque

from horizonrl.envs.base import Instruction, state_digest

MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}   # in gymnasium's order
ACTIONS = {name: f"move one cell {name}" for name in MOVES}


class FrozenLake:
    actions = list(MOVES)
    default_action = "left"
    map_symbols = "P_OGX√"
    translations = {"move left": "left", "move down": "down", "move right": "right", "move up": "up",
                    "west": "left", "south": "down", "east": "right", "north": "up"}

    def __init__(self, size: int = 4, slippery: bool = False, frozen_share: float = 0.8, max_steps: int = 100,
                 surroundings: bool = False):
        if size < 2 or not 0 < frozen_share <= 1 or max_steps < 1:
            raise ValueError(f"need size >= 2, 0 < frozen_share <= 1, max_steps >= 1; got size={size}, "
                             f"frozen_share={frozen_share}, max_steps={max_steps}")
        self.size, self.slippery, self.frozen_share, self.max_steps = size, slippery, frozen_share, max_steps
        self.surroundings_shown = surroundings
        self.lake = None
        self.map: list[str] = []
        self.steps = 0

    @property
    def unwrapped(self):
        return self.lake

    @property
    def instruction(self) -> Instruction:
        tips = ["the lake is drawn one row a line: P you, _ frozen, O hole, G goal",
                "a hole ends the game"]
        if self.slippery:
            tips.append("the ice is slippery: a move may take you sideways")
        return Instruction(intro="You are walking on a frozen lake", mission="reach the goal G without falling "
                           "into a hole", actions=dict(ACTIONS), tips=tips)

    @property
    def position(self) -> tuple[int, int]:
        return divmod(int(self.lake.s), self.size)

    def reset(self, seed: int) -> tuple[str, dict]:
        from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

        self.map = generate_random_map(self.size, self.frozen_share, seed)
        self.lake = FrozenLakeEnv(desc=self.map, is_slippery=self.slippery)
        self.lake.reset(seed=seed)
        self.steps = 0
        return self.render(), {}

    def state_key(self) -> str:
        """The map and where you stand on it."""
        return state_digest(tuple(self.map), self.position)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if action not in MOVES:
            raise ValueError(f"unknown action {action!r}; valid: {self.actions}")
        self.steps += 1
        before = self.position
        _, reward, terminated, _, _ = self.lake.step(self.actions.index(action))
        success = reward > 0
        truncated = not terminated and self.steps >= self.max_steps
        info = {"metrics": {"moved": float(self.position != before)}}
        if terminated or truncated:
            info.update(success=success, progress=float(success))
        return self.render(), float(reward), bool(terminated), truncated, info

    def render(self) -> str:
        where = self.position
        symbols = {"S": "_", "F": "_", "H": "O", "G": "G"}
        rows = []
        for r, row in enumerate(self.map):
            cells = [symbols[c] for c in row]
            if r == where[0]:
                cells[where[1]] = {"H": "X", "G": "√"}.get(row[where[1]], "P")
            rows.append("".join(cells))
        if self.surroundings_shown:
            rows.append(f"Around you: {self.surroundings()}.")
        return "\n".join(rows)

    def shortest_path(self) -> list[str] | None:
        """The moves of a shortest walk from here to the goal that steps on no hole (None: there is none)."""
        start, goal = self.position, (self.size - 1, self.size - 1)
        parents = {start: None}
        queue = deque([start])
        while queue:
            cell = queue.popleft()
            if cell == goal:
                moves = []
                while parents[cell] is not None:
                    cell, move = parents[cell]
                    moves.append(move)
                return moves[::-1]
            for move, (dr, dc) in MOVES.items():
                nxt = (cell[0] + dr, cell[1] + dc)
                if 0 <= nxt[0] < self.size and 0 <= nxt[1] < self.size and nxt not in parents \
                        and self.map[nxt[0]][nxt[1]] != "H":
                    parents[nxt] = (cell, move)
                    queue.append(nxt)
        return None

    def surroundings(self) -> str:
        """What each move would step on: "left edge, down hole, right ice, up ice"."""
        row, column = self.position
        names = {"S": "ice", "F": "ice", "H": "hole", "G": "goal"}
        return ", ".join(f"{move} {names[self.map[row + dr][column + dc]]}"
                         if 0 <= row + dr < self.size and 0 <= column + dc < self.size else f"{move} edge"
                         for move, (dr, dc) in MOVES.items())

    def expert_action(self) -> tuple[str, str]:
        """The first move of a shortest path to the goal around the holes; the reason reads the cells around
        and gives the path."""
        if self.lake is None:
            raise RuntimeError("call reset(seed) before expert_action")
        moves = self.shortest_path()
        if not moves:
            return self.default_action, f"around me: {self.surroundings()}; no path to the goal"
        return moves[0], f"around me: {self.surroundings()}; {len(moves)} moves to the goal: {', '.join(moves)}"
